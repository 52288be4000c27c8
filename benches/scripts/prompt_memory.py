"""Peak router memory and /health latency while huge prompts are tokenized.

Starts one simulated engine and the router with a tokenizer (in a bucket bounded by
prompt length, so prompts are tokenized), sends N concurrent chat
requests whose single message is SIZE bytes of text, polls /health every 10 ms
throughout, and prints the router's peak RSS (VmHWM) and the /health latencies.

    python3 benches/scripts/prompt_memory.py target/release/switchyard \
        .cache/qwen3/tokenizer.json [SIZE_BYTES=31457280] [N=3]

The engine refuses bodies this large (413, or 502 when it closes the connection while
the router still writes): the answers do not matter here, the tokenization before
them does.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM")}


def main():
    binary, tokenizer = sys.argv[1], sys.argv[2]
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 30 << 20
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    sim = subprocess.Popen([binary, "sim-engine", "--port", "0"], stdout=subprocess.PIPE, text=True)
    router = config = None
    try:
        engine = json.loads(sim.stdout.readline())["ports"]["http"]
        port = free_port()
        config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        # A bucket bounded by prompt length: without a bound or a policy reading
        # prompts the router would not tokenize them.
        config.write(
            f"listen: 127.0.0.1:{port}\nmodels:\n  - id: m\n    tokenizer: {tokenizer}\n"
            f"    engines:\n      - {{id: A, url: \"http://{engine}\"}}\n"
            f"    buckets: [{{id: b, limits: {{max: 1073741824}}, groups: {{plain: {{}}}}}}]\n"
        )
        config.close()
        router = subprocess.Popen([binary, "serve", "--config", config.name], stdout=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        for _ in range(400):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=5).read()
                break
            except OSError:
                time.sleep(0.05)
        before = memory_kib(router.pid)
        line = "lorem ipsum dolor sit amet, consectetur adipiscing elit 12345\n"
        prompt = (line * (size // len(line) + 1))[:size]
        body = json.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": prompt}]}).encode()
        answers, latencies, done = [], [], threading.Event()

        def send():
            request = urllib.request.Request(f"{base}/v1/chat/completions", data=body, headers={"content-type": "application/json"})
            started = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=600) as response:
                    response.read()
                    status = response.status
            except urllib.error.HTTPError as e:
                status = e.code
            answers.append((status, round(time.monotonic() - started, 1)))

        def probe():
            while not done.is_set():
                started = time.monotonic()
                urllib.request.urlopen(f"{base}/health", timeout=30).read()
                latencies.append(time.monotonic() - started)
                time.sleep(0.01)

        prober = threading.Thread(target=probe)
        prober.start()
        senders = [threading.Thread(target=send) for _ in range(count)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        done.set()
        prober.join()
        latencies.sort()
        after = memory_kib(router.pid)
        print(f"{count} prompts of {size} bytes: answers (status, seconds) {answers}")
        print(f"router RSS before {before['VmRSS'] / 1024:.0f} MiB, peak {after['VmHWM'] / 1024:.0f} MiB")
        print(
            f"/health: {len(latencies)} probes, p50 {1000 * latencies[len(latencies) // 2]:.1f} ms, "
            f"p99 {1000 * latencies[int(len(latencies) * 0.99)]:.1f} ms, max {1000 * latencies[-1]:.1f} ms"
        )
    finally:
        for process in (router, sim):
            if process is not None:
                process.terminate()
                process.wait()
        if config is not None:
            os.unlink(config.name)


if __name__ == "__main__":
    main()
