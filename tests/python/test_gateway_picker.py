"""The official openai client through the real Envoy, with the router as Envoy's
endpoint picker (deploy/envoy/envoy.yaml, its addresses replaced)."""
import json
import subprocess
import threading
import time
import urllib.request

import pytest
import yaml
from openai import OpenAI

from conftest import CACHE, ROOT

READY = "starting main dispatch loop"
GUARD = 30


class Envoy:
    """Envoy running the sample configuration in front of `picker`; `stop` kills it
    by its pid."""

    def __init__(self, picker, pool, directory):
        config = yaml.safe_load((ROOT / "deploy/envoy/envoy.yaml").read_text())
        loopback = lambda port: {"socket_address": {"address": "127.0.0.1", "port_value": port}}
        resources = config["static_resources"]
        resources["listeners"][0]["address"] = loopback(0)
        for cluster in resources["clusters"]:
            hosts = {"picker": [picker], "pool": pool}.get(cluster["name"])
            if hosts is None:
                continue
            cluster["type"] = "STATIC"
            endpoints = []
            for host in hosts:
                address, port = host.rsplit(":", 1)
                endpoints.append({"endpoint": {"address": {"socket_address": {"address": address, "port_value": int(port)}}}})
            cluster["load_assignment"]["endpoints"] = [{"lb_endpoints": endpoints}]
        config["admin"]["address"] = loopback(0)
        path = directory / "envoy.json"
        path.write_text(json.dumps(config))
        self.admin_file = directory / "envoy.admin"
        envoy = CACHE / "venv" / "bin" / "envoy"
        if not envoy.exists():
            pytest.fail(f"no Envoy at {envoy}: run `cargo xtask python-env` (its wheel is Linux x86-64 only)")
        self.process = subprocess.Popen(
            [str(envoy), "-c", str(path), "--admin-address-path", str(self.admin_file), "--use-dynamic-base-id", "--concurrency", "1", "--log-level", "info"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.ready = threading.Event()
        # Envoy's log is read to its end, so it never blocks on a full pipe.
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self):
        for line in self.process.stderr:
            if READY in line:
                self.ready.set()

    def serve(self):
        """Waits until Envoy serves and finds the picker healthy; its address."""
        assert self.ready.wait(timeout=GUARD), "Envoy did not start"
        admin = f"http://{self.admin_file.read_text().strip()}"
        listeners = json.load(urllib.request.urlopen(f"{admin}/listeners?format=json", timeout=GUARD))
        bound = listeners["listener_statuses"][0]["local_address"]["socket_address"]
        self.url = f"http://{bound['address']}:{bound['port_value']}"
        deadline = time.monotonic() + GUARD
        while time.monotonic() < deadline:
            clusters = urllib.request.urlopen(f"{admin}/clusters", timeout=GUARD).read().decode()
            if any(l.startswith("picker::") and l.endswith("::health_flags::healthy") for l in clusters.splitlines()):
                return self
            time.sleep(0.02)  # polling Envoy's view, not waiting in its place
        raise AssertionError("Envoy never found the picker healthy")

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=GUARD)


@pytest.fixture
def envoy(tmp_path):
    started = []

    def start(picker, pool):
        instance = Envoy(picker, pool, tmp_path)
        started.append(instance)
        return instance.serve()

    yield start
    for instance in started:
        instance.stop()


def wait_for(url, line):
    """Waits until the router's /metrics has `line` (a stream is counted as it ends,
    which its client may see first)."""
    deadline = time.monotonic() + GUARD
    while time.monotonic() < deadline:
        metrics = urllib.request.urlopen(url, timeout=GUARD).read().decode()
        if line in metrics:
            return
        time.sleep(0.02)
    raise AssertionError(f"{line} never in {metrics}")


def sample_token():
    config = yaml.safe_load((ROOT / "deploy/envoy/envoy.yaml").read_text())
    filters = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    ext_proc = next(f for f in filters if f["name"] == "envoy.filters.http.ext_proc")
    value = ext_proc["typed_config"]["grpc_service"]["initial_metadata"][0]["value"]
    return value.removeprefix("Bearer ")


def test_the_openai_client_through_envoy_with_the_router_as_its_picker(sim, router, envoy):
    engines = [sim("--model", "m"), sim("--model", "m")]
    members = [{"id": f"E{i}", "url": e.url, "role": "plain"} for i, e in enumerate(engines)]
    serving = router({
        "models": [{"id": "m", "engines": members}],
        "picker": {"listen": "127.0.0.1:0", "token": sample_token()},
    })
    assert serving.picker, "the ready line names the picker's address"
    gateway = envoy(serving.picker, [e.url.removeprefix("http://") for e in engines])
    client = OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    named = []
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hello there"}], max_tokens=5
        )
        named.append(raw.headers["x-switchyard-engine"])
        reply = raw.parse()
        assert reply.usage.completion_tokens == 5
        assert len(reply.choices[0].message.content.split()) == 5
    assert named == ["E0", "E1", "E0", "E1"], "round robin, as the picker named them"
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "stream please"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 12
    assert chunks[-1].usage.completion_tokens == 12
    wait_for(f"{serving.url}/metrics", 'switchyard_picker_streams_total{outcome="routed"} 5')
