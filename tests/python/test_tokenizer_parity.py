"""With a real tokenizer.json and chat template, the simulated engine counts prompt
tokens exactly as Hugging Face tokenizers and transformers-style jinja2 rendering do."""
import json
import urllib.request

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from conftest import CACHE

QWEN = CACHE / "qwen3"

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Explain KV caches in one line."}],
    [
        {"role": "user", "content": "Translate: 猫が好きです"},
        {"role": "assistant", "content": "I like cats."},
        {"role": "user", "content": "And dogs? 🐕  Use  two   spaces."},
    ],
]


def expected_ids(messages):
    config = json.loads((QWEN / "tokenizer_config.json").read_text())
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = lambda message: (_ for _ in ()).throw(jinja2.TemplateError(message))
    prompt = env.from_string(config["chat_template"]).render(
        messages=messages, add_generation_prompt=True, bos_token=config.get("bos_token") or "", eos_token=config.get("eos_token") or ""
    )
    tokenizer = Tokenizer.from_file(str(QWEN / "tokenizer.json"))
    return tokenizer.encode(prompt, add_special_tokens=False).ids


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_prompt_tokens_match_the_reference_tokenization(sim, messages):
    if not (QWEN / "tokenizer.json").exists():
        pytest.fail(f"the Qwen3 tokenizer is not in {QWEN}: run `cargo xtask ci`")
    engine = sim("--tokenizer", QWEN / "tokenizer.json")
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{engine.url}/v1/chat/completions", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        usage = json.loads(response.read())["usage"]
    assert usage["prompt_tokens"] == len(expected_ids(messages))
