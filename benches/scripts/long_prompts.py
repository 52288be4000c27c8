"""What tokenizing long prompts adds to a request's latency through the router.

Starts one simulated engine (delays off) and two routers in front of it: one that
tokenizes with the given tokenizer (a bucket bounded by prompt length, so every
prompt is tokenized) and one without a tokenizer (prompt lengths estimated). Sends,
one request at a time and alternating between the routers:

- a single-message prompt of about TOKENS tokens (58,800 by default; each
  repetition's differs, so none is taken from the prefix cache), and
- turn 20 of a conversation whose history is about 50k tokens, right after its turn
  19 (each repetition's new 200-token message differs, so only turn 19's prefix can
  be reused by the tokenizing router's prefix cache),

and prints the median latency of each through each router and the difference.

    python3 benches/scripts/long_prompts.py target/release/switchyard \
        .cache/qwen3/tokenizer.json [TOKENS=58800] [REPETITIONS=15]
"""
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

WORDS = (
    "the router sends each request to an engine that holds its prefix cache and has room "
    "for the answer while tokens arrive in batches of several hundred per second operators "
    "watch latency throughput memory under load with Kubernetes pods restarting"
).split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text(words, seed):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + rng.choice(["", "", "", ",", "."]) for _ in range(words))


class Router:
    def __init__(self, binary, engine, tokenizer):
        self.port = free_port()
        config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        model = f"  - id: m\n    engines: [{{id: A, url: 'http://{engine}', role: plain}}]\n"
        if tokenizer:
            model += f"    tokenizer: {tokenizer}\n    buckets: [{{id: b, limits: {{max: 1048576}}, groups: {{plain: {{}}}}}}]\n"
        config.write(f"listen: 127.0.0.1:{self.port}\nmodels:\n{model}")
        config.close()
        self.config = config.name
        self.process = subprocess.Popen(
            [binary, "serve", "--config", config.name],
            stdout=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        for _ in range(400):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5).read()
                break
            except OSError:
                time.sleep(0.05)
        self.connection = http.client.HTTPConnection("127.0.0.1", self.port)

    def chat(self, messages):
        """Seconds to the whole answer, and the prompt tokens the router routed on."""
        body = json.dumps({"model": "m", "max_tokens": 1, "messages": messages})
        started = time.perf_counter()
        self.connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        response = self.connection.getresponse()
        response.read()
        elapsed = time.perf_counter() - started
        assert response.status == 200, response.status
        return elapsed, int(response.getheader("x-switchyard-prompt-tokens"))

    def metric(self, name):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name):
                    return float(line.split()[-1])
        return 0.0


def conversation(words_per_message, new_words, variant):
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in range(19):
        messages.append({"role": "user", "content": text(words_per_message, 2 * turn)})
        messages.append({"role": "assistant", "content": text(words_per_message, 2 * turn + 1)})
    messages.append({"role": "user", "content": text(new_words, 10_000 + variant)})
    return messages


def main():
    binary, tokenizer = sys.argv[1], sys.argv[2]
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 58_800
    repetitions = int(sys.argv[4]) if len(sys.argv) > 4 else 15
    sim = subprocess.Popen(
        [binary, "sim-engine", "--port", "0", "--prefill-tokens-per-sec", "0", "--decode-tokens-per-sec", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    routers = []
    try:
        engine = json.loads(sim.stdout.readline())["ports"]["http"]
        for with_tokenizer in (tokenizer, None):
            routers.append(Router(binary, engine, with_tokenizer))
        tokenized, estimated = routers
        # Words for the token counts asked for, from the router's own count.
        _, counted = tokenized.chat([{"role": "user", "content": text(10_000, 1)}])
        per_token = 10_000 / counted

        def one(seed):
            return [{"role": "user", "content": text(round(tokens * per_token), seed)}]

        # Both routers warmed with the same requests; the count is the tokenizing one's.
        _, long_tokens = tokenized.chat(one(1))
        estimated.chat([{"role": "user", "content": text(10_000, 1)}])
        estimated.chat(one(1))
        per_message = round(50_000 * per_token / 38)
        results = {("long", r): [] for r in ("tokenized", "estimated")}
        results.update({("turn 20", r): [] for r in ("tokenized", "estimated")})
        turn_tokens = 0
        for n in range(repetitions):
            order = [("tokenized", tokenized), ("estimated", estimated)]
            for name, router in order if n % 2 == 0 else order[::-1]:
                results[("long", name)].append(router.chat(one(100 + n))[0])
                turn = conversation(per_message, round(200 * per_token), n)
                router.chat(turn[:-2])
                elapsed, routed = router.chat(turn)
                results[("turn 20", name)].append(elapsed)
                if name == "tokenized":
                    turn_tokens = routed
        print(f"long prompt: {long_tokens} tokens; turn 20: {turn_tokens} tokens; {repetitions} repetitions")
        for case in ("long", "turn 20"):
            with_tokenizer = statistics.median(results[(case, "tokenized")]) * 1000
            without = statistics.median(results[(case, "estimated")]) * 1000
            print(
                f"{case}: median {with_tokenizer:.2f} ms tokenized, {without:.2f} ms estimated, "
                f"added {with_tokenizer - without:.2f} ms"
            )
        hits = tokenized.metric('switchyard_prompt_prefix_cache_lookups_total{model="m",result="hit"}')
        reused = tokenized.metric('switchyard_prompt_prefix_cache_reused_tokens_total{model="m"}')
        print(f"prefix cache: {hits:.0f} hits, {reused:.0f} token ids reused")
    finally:
        for router in routers:
            router.process.terminate()
            router.process.wait()
            os.unlink(router.config)
        sim.terminate()
        sim.wait()


if __name__ == "__main__":
    main()
