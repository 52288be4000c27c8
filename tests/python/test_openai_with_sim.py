"""The official openai client talks to a simulated engine directly."""
from openai import OpenAI


def client(engine):
    return OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0)


def test_chat_without_streaming(sim):
    engine = sim()
    reply = client(engine).chat.completions.create(
        model="sim-model",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
        max_tokens=5,
    )
    assert reply.object == "chat.completion"
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert len(choice.message.content.split()) == 5
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_with_streaming_and_usage(sim):
    engine = sim()
    stream = client(engine).chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "stream please"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 4
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 4


def test_a_repeated_long_prompt_reports_cached_tokens(sim):
    engine = sim("--page-size", "16")
    messages = [{"role": "user", "content": " ".join(f"word{i}" for i in range(300))}]
    first = client(engine).chat.completions.create(model="m", messages=messages, max_tokens=1)
    second = client(engine).chat.completions.create(model="m", messages=messages, max_tokens=1)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens // 16 * 16


def test_models_lists_the_served_model(sim):
    engine = sim("--model", "qwen-sim")
    assert [m.id for m in client(engine).models.list()] == ["qwen-sim"]
