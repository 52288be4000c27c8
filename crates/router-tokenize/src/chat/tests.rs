//! The bounds on what a chat request makes the template do, and the engines' ways
//! with tools and a continued final message, on small templates.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::{
    ChatRequest, ChatTokenizer, Dialect, EncodeError, MAX_PROMPT_BYTES, MAX_TEMPLATE_KWARGS,
};

/// The tiny tokenizer (hello 4, world 5, again 6) with `template`, in a directory of
/// its own, removed when dropped.
struct Files(PathBuf);

impl Files {
    fn new(name: &str, template: &str) -> Self {
        let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizer-tiny");
        let dir =
            std::env::temp_dir().join(format!("switchyard-chat-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(testdata.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
        let config = json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": template});
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        Self(dir)
    }

    fn tokenizer(&self, dialect: Dialect) -> ChatTokenizer {
        ChatTokenizer::load(&self.0.join("tokenizer.json"))
            .unwrap()
            .with_dialect(dialect)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        drop(std::fs::remove_dir_all(&self.0));
    }
}

fn user(text: &str) -> String {
    json!([{"role": "user", "content": text}]).to_string()
}

#[test]
fn a_render_past_the_prompt_bound_is_refused_not_built() {
    let files = Files::new(
        "huge",
        "{% for i in range(1000) %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfor %}",
    );
    let t = files.tokenizer(Dialect::Sglang);
    let messages = user(&"hello ".repeat(20_000));
    let request = ChatRequest {
        messages: &messages,
        ..ChatRequest::default()
    };
    let Err(EncodeError::Template(error)) = t.encode_chat(&request) else {
        panic!("refused");
    };
    assert!(
        format!("{error:#}").contains(&format!("larger than {MAX_PROMPT_BYTES} bytes")),
        "{error:#}"
    );
}

#[test]
fn template_arguments_and_tool_call_arguments_are_bounded() {
    let files = Files::new(
        "bounded",
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    );
    let t = files.tokenizer(Dialect::Vllm);
    let kwargs: serde_json::Map<String, serde_json::Value> = (0..=MAX_TEMPLATE_KWARGS)
        .map(|i| (format!("k{i}"), json!(0)))
        .collect();
    let kwargs = serde_json::Value::Object(kwargs).to_string();
    let messages = user("hello");
    let request = ChatRequest {
        messages: &messages,
        chat_template_kwargs: Some(&kwargs),
        ..ChatRequest::default()
    };
    let Err(EncodeError::Request { param, message }) = t.encode_chat(&request) else {
        panic!("refused");
    };
    assert_eq!(
        (param, message.as_str()),
        (
            "chat_template_kwargs",
            "chat_template_kwargs may give at most 256 arguments"
        )
    );
    // Arguments holding more values than the budget are refused before parsing.
    let zeros = vec![0; crate::MAX_TOOL_ARGUMENT_VALUES];
    let arguments = json!({"a": zeros}).to_string();
    let messages = json!([
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
    ])
    .to_string();
    let request = ChatRequest {
        messages: &messages,
        ..ChatRequest::default()
    };
    let Err(EncodeError::Request { param, .. }) = t.encode_chat(&request) else {
        panic!("refused");
    };
    assert_eq!(param, "messages");
}

/// Writes each tool's `name` (a function object's), refusing a tool without one.
const NAMES: &str = "{% for t in tools or [] %}{% if t.name is not defined %}{{ raise_exception('a tool without a name') }}{% endif %}{{ t.name }} {% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}";

#[test]
fn sglang_renders_again_with_the_tools_functions_when_the_template_fails_on_them() {
    let files = Files::new("retry", NAMES);
    let tools = json!([{"type": "function", "function": {"name": "again"}}]).to_string();
    let messages = user("hello");
    let request = ChatRequest {
        messages: &messages,
        tools: Some(&tools),
        ..ChatRequest::default()
    };
    let sglang = files
        .tokenizer(Dialect::Sglang)
        .encode_chat(&request)
        .unwrap();
    assert_eq!(sglang.ids, [6, 4], "again hello");
    let vllm = files.tokenizer(Dialect::Vllm).encode_chat(&request);
    assert!(
        matches!(vllm, Err(EncodeError::Template(_))),
        "vLLM does not render again"
    );
}

#[test]
fn a_named_tool_choice_naming_no_tool_renders_no_tools() {
    let files = Files::new(
        "named",
        "{% if tools is not none %}again {% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
    );
    let t = files.tokenizer(Dialect::Sglang);
    let tools = json!([{"type": "function", "function": {"name": "a"}}]).to_string();
    let messages = user("hello");
    let choice = |name: &str| json!({"type": "function", "function": {"name": name}}).to_string();
    let (named, other) = (choice("a"), choice("b"));
    let ids = |tool_choice: &str| {
        t.encode_chat(&ChatRequest {
            messages: &messages,
            tools: Some(&tools),
            tool_choice: Some(tool_choice),
            ..ChatRequest::default()
        })
        .unwrap()
        .ids
    };
    assert_eq!(ids(&named), [6, 4]);
    assert_eq!(ids(&other), [4], "no tools, not an empty list");
}

#[test]
fn vllm_continues_a_final_message_given_as_parts_after_its_text() {
    let files = Files::new(
        "continue",
        "{% for m in messages %}{% for p in m.content %}{{ p.text }} {% endfor %}world {% endfor %}{% if add_generation_prompt %}again{% endif %}",
    );
    let t = files.tokenizer(Dialect::Vllm);
    let messages = json!([
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "again"},
    ])
    .to_string();
    let request = ChatRequest {
        messages: &messages,
        add_generation_prompt: Some(false),
        continue_final_message: Some(true),
        ..ChatRequest::default()
    };
    // hello world again | (world cut)
    assert_eq!(t.encode_chat(&request).unwrap().ids, [4, 5, 6]);
}

#[test]
fn tools_seen_before_render_as_the_first_time() {
    let files = Files::new(
        "known",
        "{% for t in tools or [] %}{{ t.function.name }} {{ t | tojson }} {% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}",
    );
    let tools =
        json!([{"type": "function", "function": {"name": "again", "parameters": {"a": 1.5}}}])
            .to_string();
    let messages = user("hello");
    let request = |tool_choice| ChatRequest {
        messages: &messages,
        tools: Some(&tools),
        tool_choice,
        ..ChatRequest::default()
    };
    let t = files.tokenizer(Dialect::Sglang);
    let first = t.encode_chat(&request(None)).unwrap().ids;
    let again = t.encode_chat(&request(None)).unwrap().ids;
    assert_eq!(first, again);
    assert_eq!(
        (first[0], first.last(), first.len()),
        (6, Some(&4), 14),
        "again, the tool's JSON ([UNK] a word), hello"
    );
    // The same tools with another tool_choice are another set: none for "none".
    assert_eq!(t.encode_chat(&request(Some("\"none\""))).unwrap().ids, [4]);
    assert_eq!(t.encode_chat(&request(None)).unwrap().ids, first);
}

#[test]
fn template_arguments_take_the_special_tokens_place_and_the_requests_fields_theirs() {
    let files = Files::new(
        "precedence",
        "{{ bos_token }} {% for m in messages %}{{ m.content }} {% endfor %}{{ documents[0].text }}",
    );
    let t = files.tokenizer(Dialect::Vllm);
    let messages = user("hello");
    let kwargs = json!({"bos_token": "again", "documents": [{"text": "again"}]}).to_string();
    let documents = json!([{"text": "world"}]).to_string();
    let request = ChatRequest {
        messages: &messages,
        chat_template_kwargs: Some(&kwargs),
        documents: Some(&documents),
        ..ChatRequest::default()
    };
    // again (the argument, not `<s>`) hello world (the request's documents)
    assert_eq!(t.encode_chat(&request).unwrap().ids, [6, 4, 5]);
}

#[test]
fn a_chat_with_media_counts_sglangs_continued_final_message() {
    let files = Files::new(
        "media-continued",
        "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{{ p.text or '' }} {% endfor %}{% endif %} {% endfor %}",
    );
    let t = files.tokenizer(Dialect::Sglang);
    let image = json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}});
    let count = |messages: &serde_json::Value| {
        let messages = messages.to_string();
        let request = ChatRequest {
            messages: &messages,
            continue_final_message: Some(true),
            ..ChatRequest::default()
        };
        let tokens = t.encode_chat(&request).unwrap();
        tokens.ids.len() as u64 + tokens.counted_tokens
    };
    let user = json!({"role": "user", "content": [{"type": "text", "text": "hello"}, image]});
    let alone = count(&json!([user]));
    let continued = count(&json!([user, {"role": "assistant", "content": "world again"}]));
    assert_eq!(continued, alone + 2, "world again: counted after the media");
}

/// `n` tools whose descriptions are `size` bytes of words.
fn described_tools(n: usize, size: usize) -> String {
    let tools: Vec<_> = (0..n)
        .map(|i| {
            json!({"type": "function", "function": {
                "name": format!("tool{i}"),
                "description": "hello world ".repeat(size / 12),
                "parameters": {"type": "object"}
            }})
        })
        .collect();
    serde_json::Value::Array(tools).to_string()
}

#[test]
fn a_kept_tool_set_whose_chats_still_tokenize_much_anew_is_not_cheap() {
    // No prefix cache (the tiny tokenizer is not byte-level): the descriptions the
    // template writes are tokenized again on every request.
    let files = Files::new(
        "costly-tools",
        "{% for t in tools %}{{ t.function.description }} {% endfor %}{% for m in messages %}{{ m.content }} {% endfor %}",
    );
    let t = files.tokenizer(Dialect::Vllm);
    let tools = described_tools(1, 8 << 10);
    let messages = user("hello");
    let request = ChatRequest {
        messages: &messages,
        tools: Some(&tools),
        ..ChatRequest::default()
    };
    assert!(!t.knows_tools(&tools, None), "not seen yet");
    let first = t.encode_chat(&request).unwrap();
    assert!(t.knows_tools(&tools, None), "kept by the first chat");
    let again = t.encode_chat(&request).unwrap();
    assert_eq!(again, first);
    assert!(
        !t.knows_tools(&tools, None),
        "the second chat tokenized its tools' text anew: not cheap"
    );
}

#[test]
fn a_kept_tool_set_the_prefix_cache_covers_stays_cheap() {
    let qwen3 = crate::python_env::ensure().join("qwen3/tokenizer.json");
    let t = ChatTokenizer::load(&qwen3)
        .unwrap()
        .with_prefix_cache(1 << 20)
        .with_dialect(Dialect::Sglang);
    // Qwen3's template writes the tools into the system turn, which the prefix cache
    // keeps; each request's own message is small.
    let tools = described_tools(5, 2 << 10);
    for turn in 0..4 {
        let messages = user(&format!("hello {turn}"));
        let request = ChatRequest {
            messages: &messages,
            tools: Some(&tools),
            ..ChatRequest::default()
        };
        t.encode_chat(&request).unwrap();
        assert!(t.knows_tools(&tools, None), "turn {turn}");
    }
}

#[test]
fn a_media_part_without_a_type_counts_as_one() {
    let files = Files::new(
        "typeless-media",
        "{% for m in messages %}{% for p in m.content %}{{ p.text or '' }} {% endfor %}{% endfor %}",
    );
    let t = files.tokenizer(Dialect::Vllm).with_media_part_tokens(100);
    let count = |part: serde_json::Value| {
        let messages =
            json!([{"role": "user", "content": [{"type": "text", "text": "hello"}, part]}])
                .to_string();
        let request = ChatRequest {
            messages: &messages,
            ..ChatRequest::default()
        };
        let tokens = t.encode_chat(&request).unwrap();
        tokens.ids.len() as u64 + tokens.counted_tokens
    };
    let url = json!({"url": "https://example.com/a.png"});
    let typed = count(json!({"type": "image_url", "image_url": url}));
    let typeless = count(json!({"image_url": url}));
    assert!(typed >= 100, "{typed}");
    assert_eq!(typeless, typed, "vLLM takes it as an image part");
}
