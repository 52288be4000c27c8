"""The switchyard binary routing for simulated engines, called with the openai client."""
import json
import signal
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import CACHE


def client(router):
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)


def engine(id_, sim, role):
    return {"id": id_, "url": sim.url, "role": role}


def plain_model(*sims, model="m", **extra):
    return {"id": model, "engines": [engine(f"A{i + 1}", s, "plain") for i, s in enumerate(sims)], **extra}


def pd_model(prefill, decode, model="m", **extra):
    return {"id": model, "engines": [engine("P1", prefill, "prefill"), engine("D1", decode, "decode")], **extra}


def get_json(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def raw_post(url, data, headers=None):
    """POSTs bytes; returns (status, headers, body) for any status."""
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def wait_until(condition, what, timeout=20.0):
    """Re-checks a condition that depends on periodic work (health probes) until it
    holds; fails the test if it never does."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout} s")
        time.sleep(0.02)


def chat(router, model="m", **kwargs):
    return client(router).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": kwargs.pop("prompt", "hello there")}], **kwargs
    )


def streamed_text(raw):
    stream = raw.parse()
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def visits(sim):
    """The engine's chat requests by how they ended: open, answered, abandoned."""
    return get_json(f"{sim.url}/admin/requests")["visits"]


def test_plain_chat_with_and_without_streaming(sim, router):
    a, b = sim(), sim()
    r = router({"models": [plain_model(a, b)]})
    raw = chat(r, max_tokens=5)
    reply = raw.parse()
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 5
    assert raw.headers["x-switchyard-bucket"] == "default"
    assert raw.headers["x-switchyard-engine"] in ("A1", "A2")
    assert raw.headers["x-request-id"]
    raw = chat(r, max_tokens=3, stream=True, extra_headers={"x-request-id": "my-id-7"})
    assert len(streamed_text(raw).split()) == 3
    assert raw.headers["x-request-id"] == "my-id-7", "a client request id is echoed"
    assert [m.id for m in client(r).models.list()] == ["m"]
    assert urllib.request.urlopen(f"{r.url}/ready").status == 200


def test_pd_chat_sends_one_room_and_the_prefill_bootstrap_address_to_both_legs(sim, router):
    prefill = sim("--role", "prefill", "--bootstrap-port", 0)
    decode = sim("--role", "decode")
    r = router({"models": [pd_model(prefill, decode)]})
    raw = chat(r, max_tokens=4)
    assert raw.parse().usage.completion_tokens == 4
    assert (raw.headers["x-switchyard-prefill"], raw.headers["x-switchyard-decode"]) == ("P1", "D1")
    assert len(streamed_text(chat(r, max_tokens=4, stream=True)).split()) == 4
    prefills = get_json(f"{prefill.url}/admin/requests")["requests"]
    decodes = get_json(f"{decode.url}/admin/requests")["requests"]
    assert (len(prefills), len(decodes)) == (2, 2), "both legs of both requests arrived"
    for p, d in zip(prefills, decodes):
        assert p["bootstrap_room"] == d["bootstrap_room"] and 0 <= d["bootstrap_room"] < 2**63
        assert d["bootstrap_host"] == "127.0.0.1"
        assert d["bootstrap_port"] == prefill.ports["bootstrap"]


def test_client_errors(sim, router):
    r = router({"models": [plain_model(sim(), buckets=[{"id": "tiny", "limits": {"max": 50}, "groups": {"plain": {}}}])]})
    status, _, body = raw_post(f"{r.url}/v1/chat/completions", b"{not json")
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_body"
    with pytest.raises(openai.BadRequestError) as error:
        client(r).chat.completions.create(model="m", messages=[{"role": "robot", "content": "x"}])
    assert error.value.code == "invalid_role"
    with pytest.raises(openai.NotFoundError) as error:
        client(r).chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    assert error.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as error:
        chat(r, prompt="word " * 400)
    assert error.value.code == "no_matching_bucket"
    status, _, body = raw_post(f"{r.url}/v1/chat/completions", b" " * (33 << 20))
    assert status == 413 and json.loads(body)["error"]["code"] == "body_too_large"


def test_503_with_retry_after_when_every_engine_is_at_its_cap(sim, router):
    slow = sim("--decode-tokens-per-sec", 20)
    capped = {"type": "round_robin", "admission": {"max_inflight_requests": 1}}
    r = router({"models": [plain_model(slow, policies={"plain": capped})]})
    holding = chat(r, max_tokens=1000, stream=True).parse()
    next(iter(holding))
    with pytest.raises(openai.APIStatusError) as error:
        chat(r, max_tokens=1)
    assert error.value.status_code == 503
    assert error.value.code == "at_capacity"
    assert error.value.response.headers["retry-after"] == "1"
    assert "A1: max_inflight_requests (1 >= 1)" in error.value.message
    holding.close()


def test_502_when_the_engine_fails_and_504_when_it_hangs(sim, router):
    failing = {"id": "failing", "engines": [engine("F1", sim("--error-rate", 1), "plain")]}
    hanging = {"id": "hanging", "engines": [engine("H1", sim("--hang-before-first-byte"), "plain")]}
    r = router({"models": [failing, hanging], "timeouts": {"first_byte_ms": 300}})
    with pytest.raises(openai.APIStatusError) as error:
        chat(r, model="failing")
    assert (error.value.status_code, error.value.code) == (502, "upstream_error")
    assert "http://" not in error.value.message, "messages never leak engine URLs"
    with pytest.raises(openai.APIStatusError) as error:
        chat(r, model="hanging")
    assert (error.value.status_code, error.value.code) == (504, "upstream_timeout")


def test_a_short_request_falls_back_to_the_long_bucket_with_both_pd_legs(sim, router):
    slow = ("--decode-tokens-per-sec", 20)
    p_short, d_short = sim("--role", "prefill", "--bootstrap-port", 0, *slow), sim("--role", "decode", *slow)
    p_long, d_long = sim("--role", "prefill", "--bootstrap-port", 0), sim("--role", "decode")
    capped = {"type": "round_robin", "admission": {"max_inflight_requests": 1}}
    model = {
        "id": "m",
        "engines": [engine("PS", p_short, "prefill"), engine("DS", d_short, "decode"), engine("PL", p_long, "prefill"), engine("DL", d_long, "decode")],
        "buckets": [
            {"id": "short", "limits": {"max": 4096}, "groups": {"pd": {"prefill": {"engine_ids": ["PS"], "policy": capped}, "decode": {"engine_ids": ["DS"], "policy": capped}}}},
            {"id": "long", "groups": {"pd": {"prefill": {"engine_ids": ["PL"]}, "decode": {"engine_ids": ["DL"]}}}},
        ],
    }
    r = router({"models": [model]})
    first = chat(r, max_tokens=1000, stream=True)
    assert first.headers["x-switchyard-bucket"] == "short"
    holding = first.parse()
    next(iter(holding))
    raw = chat(r, max_tokens=2)
    assert raw.headers["x-switchyard-bucket"] == "long"
    assert (raw.headers["x-switchyard-prefill"], raw.headers["x-switchyard-decode"]) == ("PL", "DL")
    holding.close()


def test_a_client_closing_mid_stream_aborts_both_pd_legs(sim, router):
    # The prefill leg holds after its first event, so it is still open while the
    # decode leg streams and the close must reach both.
    prefill = sim("--role", "prefill", "--bootstrap-port", 0, "--hold-after-chunks", 1)
    decode = sim("--role", "decode", "--decode-tokens-per-sec", 20)
    r = router({"models": [pd_model(prefill, decode)]})
    stream = chat(r, max_tokens=1000, stream=True).parse()
    next(iter(stream))
    assert visits(prefill)["open"] == 1, "the prefill leg is still open"
    stream.close()
    gone = {"open": 0, "answered": 0, "abandoned": 1}
    wait_until(lambda: visits(prefill) == gone, "the prefill engine seeing its leg closed")
    wait_until(lambda: visits(decode) == gone, "the decode engine seeing its leg closed")
    with urllib.request.urlopen(f"{r.url}/metrics") as response:
        metrics = response.read().decode()
    assert 'switchyard_engine_in_flight{engine="P1"} 0' in metrics
    assert 'switchyard_engine_in_flight{engine="D1"} 0' in metrics
    assert 'switchyard_requests_total{model="m",outcome="cancelled",code="client_disconnected"} 1' in metrics


def test_a_failing_engine_leaves_the_candidates_and_returns_after_recovery(sim, router):
    a, b = sim("--admin-port", 0), sim()
    # Probes every 50 ms; three failures in a row, not one slow probe on a loaded
    # machine, take an engine out, so the healthy one always serves.
    r = router({"models": [plain_model(a, b)], "health": {"interval_ms": 50, "timeout_ms": 5000, "failure_threshold": 3, "success_threshold": 1}})

    def healthy(engine_id):
        with urllib.request.urlopen(f"{r.url}/metrics") as response:
            return f'switchyard_engine_healthy{{engine="{engine_id}"}} 1' in response.read().decode()

    def set_faults(faults):
        status, _, _ = raw_post(f"http://{a.ports['admin']}/admin/faults", json.dumps(faults).encode())
        assert status == 200

    set_faults({"fail_health": True})
    wait_until(lambda: not healthy("A1"), "A1 leaving the candidates")
    assert {chat(r).headers["x-switchyard-engine"] for _ in range(6)} == {"A2"}
    set_faults({})
    wait_until(lambda: healthy("A1"), "A1 returning")
    assert {chat(r).headers["x-switchyard-engine"] for _ in range(6)} == {"A1", "A2"}


def test_graceful_shutdown_completes_an_in_flight_stream(sim, router):
    r = router({"models": [plain_model(sim("--decode-tokens-per-sec", 50))]})
    stream = chat(r, max_tokens=20, stream=True).parse()
    chunks = iter(stream)
    next(chunks)
    r.process.send_signal(signal.SIGTERM)
    rest = list(chunks)
    assert rest[-1].choices[0].finish_reason == "length"
    assert r.process.wait(timeout=30) == 0


def test_sigterm_past_the_grace_period_ends_running_streams_and_exits_0(sim, router):
    stuck = sim("--hold-after-chunks", 1)
    r = router({"models": [plain_model(stuck)], "shutdown_grace_ms": 200})
    stream = chat(r, max_tokens=20, stream=True).parse()
    chunks = iter(stream)
    next(chunks)
    r.process.send_signal(signal.SIGTERM)
    with pytest.raises(openai.APIConnectionError):
        list(chunks)
    assert r.process.wait(timeout=30) == 0
    wait_until(lambda: visits(stuck) == {"open": 0, "answered": 0, "abandoned": 1}, "the engine seeing the stream closed")


def test_the_router_counts_prompt_tokens_as_the_engine_does_with_a_real_tokenizer(sim, router):
    tokenizer = CACHE / "qwen3" / "tokenizer.json"
    bounded = [{"id": "short", "limits": {"max": 4096}, "groups": {"plain": {}}}]
    r = router({"models": [plain_model(sim("--tokenizer", tokenizer), tokenizer=str(tokenizer), buckets=bounded)]})
    for prompt in ["Hello!", "Explain KV caches, in one line. 猫が好き 🐕"]:
        raw = chat(r, prompt=prompt, max_tokens=1)
        assert int(raw.headers["x-switchyard-prompt-tokens"]) == raw.parse().usage.prompt_tokens


def test_a_route_that_reads_no_prompt_tokenizes_none(sim, router):
    tokenizer = CACHE / "qwen3" / "tokenizer.json"
    r = router({"models": [plain_model(sim("--tokenizer", tokenizer), tokenizer=str(tokenizer))]})
    raw = chat(r, prompt="1234567890" * 30, max_tokens=1)
    assert raw.parse().usage.prompt_tokens > 300, "the engine counts a token a digit"
    estimated = int(raw.headers["x-switchyard-prompt-tokens"])
    assert 75 <= estimated < 150, f"one open bucket, no policy reading prompts: about four bytes a token, {estimated}"


def test_worker_admin_requires_the_token_and_adds_and_removes_engines(sim, router):
    a, b = sim(), sim()
    r = router({"models": [plain_model(a)], "admin": {"token": "s3cret"}})
    status, _, _ = raw_post(f"{r.url}/workers", json.dumps({"id": "B", "url": b.url, "model": "m"}).encode())
    assert status == 401
    auth = {"authorization": "Bearer s3cret"}
    status, _, body = raw_post(f"{r.url}/workers", json.dumps({"id": "B", "url": b.url, "model": "m"}).encode(), auth)
    assert status == 201 and json.loads(body)["role"] == "plain", body
    assert {chat(r).headers["x-switchyard-engine"] for _ in range(4)} == {"A1", "B"}
    request = urllib.request.Request(f"{r.url}/workers/B", method="DELETE", headers=auth)
    assert urllib.request.urlopen(request).status == 204
    assert {chat(r).headers["x-switchyard-engine"] for _ in range(4)} == {"A1"}


def test_completions_through_the_router_json_and_streamed_text_and_token_ids(sim, router):
    tokenizer = CACHE / "qwen3" / "tokenizer.json"
    bounded = [{"id": "short", "limits": {"max": 4096}, "groups": {"plain": {}}}]
    r = router({"models": [plain_model(sim("--tokenizer", tokenizer), tokenizer=str(tokenizer), buckets=bounded)]})
    completions = client(r).completions
    for prompt in ["Explain KV caches, in one line. 猫が好き", [9707, 11, 1879, 0]]:
        raw = completions.with_raw_response.create(model="m", prompt=prompt, max_tokens=3)
        reply = raw.parse()
        assert reply.object == "text_completion"
        assert len(reply.choices[0].text.split()) == 3
        assert reply.choices[0].finish_reason == "length"
        assert int(raw.headers["x-switchyard-prompt-tokens"]) == reply.usage.prompt_tokens
        chunks = list(completions.create(model="m", prompt=prompt, max_tokens=3, stream=True, stream_options={"include_usage": True}))
        assert len("".join(c.choices[0].text for c in chunks if c.choices).split()) == 3
        assert chunks[-1].usage.prompt_tokens == reply.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as refused:
        completions.create(model="m", prompt=[], max_tokens=1)
    assert refused.value.body["param"] == "prompt"


def test_embeddings_through_the_router(sim, router):
    r = router({"models": [plain_model(sim())]})
    reply = client(r).embeddings.create(model="m", input=["a b c", "d e"])
    assert [d.index for d in reply.data] == [0, 1]
    assert all(len(d.embedding) == 8 for d in reply.data)
    assert reply.usage.prompt_tokens == 5
    single = client(r).embeddings.create(model="m", input=[1, 2, 3])
    assert single.usage.prompt_tokens == 3
