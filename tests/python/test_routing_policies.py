"""Cache-aware and affinity routing through the switchyard binary, called with the
openai client."""
import urllib.request

import openai
import pytest

from conftest import ROOT
from test_router_e2e import client, plain_model, wait_until

TOKENIZER = ROOT / "testdata" / "tokenizer-bytes" / "tokenizer.json"


def metric(router, prefix):
    with urllib.request.urlopen(f"{router.url}/metrics", timeout=30) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def turn(router, messages, **headers):
    raw = client(router).chat.completions.with_raw_response.create(
        model="m", messages=messages, max_tokens=8, extra_headers=headers
    )
    completion = raw.parse()
    cached = completion.usage.prompt_tokens_details.cached_tokens
    return raw.headers["x-switchyard-engine"], cached, completion.choices[0].message.content


def test_cache_aware_keeps_a_conversation_on_the_engine_holding_its_prefix(sim, router):
    sims = [sim("--tokenizer", TOKENIZER, "--kv-port", 0, "--replay-port", 0) for _ in range(3)]
    policy = {"type": "cache_aware", "min_matched_tokens": 64, "seed": 1}
    r = router({"models": [plain_model(*sims, tokenizer=str(TOKENIZER), policies={"plain": policy})]})
    applied = 'switchyard_kv_feed_events_total{event="applied"}'
    messages = [{"role": "system", "content": "You answer briefly and precisely. " * 20}]
    engines, cached = [], []
    for i in range(4):
        messages.append({"role": "user", "content": f"Question {i}: what comes next in the sequence? " * 2})
        before = metric(r, applied)
        engine, hit, answer = turn(r, messages)
        engines.append(engine)
        cached.append(hit)
        messages.append({"role": "assistant", "content": answer})
        # The engine announces the turn's new pages over ZeroMQ; the next turn is
        # routed once the router has applied them.
        wait_until(lambda: metric(r, applied) > before, "the router applying the turn's KV events")
    assert len(set(engines)) == 1, f"every turn went to the engine holding the conversation: {engines}"
    assert cached[0] == 0 and all(c > 600 for c in cached[1:]), cached
    hits = metric(r, 'switchyard_picks_total{model="m",bucket="default",stage="plain",engine="' + engines[0] + '",reason="cache_hit"}')
    assert hits == 3


def test_a_session_header_keeps_turns_on_one_engine_and_keyless_requests_spread(sim, router):
    sims = [sim() for _ in range(4)]
    policy = {"type": "session_aware", "seed": 2}
    r = router({
        "models": [plain_model(*sims, policies={"plain": policy})],
        "affinity": {"session_header": "x-conversation-id"},
    })
    greeting = [{"role": "user", "content": "hello"}]
    first = {turn(r, greeting, **{"x-conversation-id": "conv-1"})[0] for _ in range(8)}
    second = {turn(r, greeting, **{"x-conversation-id": "conv-2"})[0] for _ in range(8)}
    assert len(first) == 1 and len(second) == 1, (first, second)
    keyless = {turn(r, greeting)[0] for _ in range(24)}
    assert len(keyless) >= 2, f"keyless requests spread: {keyless}"
    assert metric(r, "switchyard_affinity_bindings") == 2


def test_an_oversized_routing_key_is_a_client_error(sim, router):
    r = router({"models": [plain_model(sim(), policies={"plain": {"type": "sticky"}})]})
    with pytest.raises(openai.BadRequestError) as refused:
        turn(r, [{"role": "user", "content": "hi"}], **{"x-switchyard-routing-key": "k" * 300})
    assert refused.value.body["code"] == "invalid_header"
    assert "x-switchyard-routing-key header is 300 bytes" in refused.value.body["message"]
