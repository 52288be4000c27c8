"""Instructions chat requests cost the router, counted by callgrind.

Starts an instant simulated engine (SIM_BINARY sim-engine) and the router
(ROUTER_BINARY serve, one tokio worker thread) under `valgrind --tool=callgrind`,
sends N chat requests one at a time over one kept-alive connection, stops the router
with SIGTERM and prints callgrind's instruction total. The difference between the
totals of two values of N, over their difference, is the instructions a request.

Usage: python3 request_instructions.py ROUTER_BINARY SIM_BINARY N CALLGRIND_OUT

With TOKENIZER=PATH (a tokenizer.json), the model tokenizes its prompts with it, in
one bounded bucket (as `cargo xtask bench-e2e` configures it); with BODY=PATH, the
chat sent is the JSON body in that file (its "model" replaced), such as the body of
benches/load/chat.lua; with FLOW=JSON, the model has that flow section (such as
'{"queue": {"max_wait_ms": 2000}, "priority": {"header": "x-priority"}}', the section
of `cargo xtask bench-e2e --flow`).
"""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time


def main() -> None:
    router_bin, sim_bin, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    sim = subprocess.Popen(
        [sim_bin, "sim-engine", "--port", "0", "--prefill-tokens-per-sec", "0",
         "--decode-tokens-per-sec", "0", "--max-running-requests", "1024", "--output-tokens", "16"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    engine = "http://" + json.loads(sim.stdout.readline())["ports"]["http"]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
        model = {"id": "m", "engines": [{"id": "A", "url": engine, "role": "plain"}]}
        if os.environ.get("TOKENIZER"):
            model["tokenizer"] = os.environ["TOKENIZER"]
            model["buckets"] = [{"id": "bounded", "limits": {"max": 1048576},
                                 "groups": {"plain": {"policy": {"type": "round_robin"}}}}]
        if os.environ.get("FLOW"):
            model["flow"] = json.loads(os.environ["FLOW"])
        json.dump({"listen": "127.0.0.1:0", "models": [model]}, config)
    router = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", router_bin, "serve",
         "--config", config.name],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "RUST_LOG": "warn", "TOKIO_WORKER_THREADS": "1"})
    try:
        host, port = json.loads(router.stdout.readline())["addr"].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        while True:
            conn.request("GET", "/ready")
            ready = conn.getresponse()
            ready.read()
            if ready.status == 200:
                break
            time.sleep(0.2)
        if os.environ.get("BODY"):
            with open(os.environ["BODY"]) as sent:
                body = json.dumps({**json.load(sent), "model": "m"})
        else:
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello there"}],
                               "max_tokens": 16})
        for _ in range(n):
            conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            assert answer.status == 200, answer.status
        conn.close()
    finally:
        router.send_signal(signal.SIGTERM)
        router.wait(timeout=300)
        sim.send_signal(signal.SIGTERM)
        sim.wait(timeout=30)
        os.unlink(config.name)
    with open(out) as profile:
        total = re.search(r"^(?:summary|totals): (\d+)", profile.read(), re.M)
    print(total.group(1))


if __name__ == "__main__":
    main()
