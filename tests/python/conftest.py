"""Fixtures: simulated engines as real processes, and the real SGLang modules."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import engine_modules

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SWITCHYARD_CACHE", ROOT / ".cache"))
BINARY = Path(os.environ.get("SWITCHYARD_BIN", ROOT / "target" / "debug" / "switchyard"))


class Sim:
    """A `switchyard sim-engine` process on ports the OS picks."""

    def __init__(self, args):
        command = [str(BINARY), "sim-engine", "--port", "0", *args]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=10)
            raise RuntimeError(f"sim-engine exited before it was ready: {command}")
        ready = json.loads(line)
        assert ready["event"] == "ready"
        self.ports = ready["ports"]
        self.url = f"http://{self.ports['http']}"

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            assert self.process.wait(timeout=20) == 0, "sim-engine stops cleanly on SIGTERM"


class Router:
    """A `switchyard serve` process on a port the OS picks."""

    def __init__(self, config, directory):
        path = Path(directory) / f"router-{id(self)}.yaml"
        config = {"listen": "127.0.0.1:0", **config}
        path.write_text(json.dumps(config))  # JSON is YAML
        self.process = subprocess.Popen([str(BINARY), "serve", "--config", str(path)], stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=10)
            raise RuntimeError(f"switchyard serve exited before it was ready (config {path})")
        ready = json.loads(line)
        self.addr = ready["addr"]
        self.url = f"http://{self.addr}"
        # The endpoint picker's address, when the config serves one.
        self.picker = ready.get("picker")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            assert self.process.wait(timeout=40) == 0, "the router stops cleanly on SIGTERM"


@pytest.fixture
def router(tmp_path):
    """Starts routers from a config dict; every one is stopped when the test ends."""
    started = []

    def start(config):
        instance = Router(config, tmp_path)
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.stop()


@pytest.fixture
def sim():
    """Starts simulated engines; every one is stopped when the test ends."""
    started = []

    def start(*args):
        engine = Sim([str(a) for a in args])
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.stop()


@pytest.fixture(scope="session")
def sglang():
    """The real SGLang publisher modules, loaded unmodified from the wheel with the
    torch-importing package __init__ files bypassed by stub packages."""
    root = CACHE / "sglang"
    if not (root / "sglang" / "srt" / "disaggregation" / "kv_events.py").exists():
        pytest.fail(f"the SGLang wheel is not unpacked in {root}: run `cargo xtask ci`")
    return engine_modules.load_sglang(root)
