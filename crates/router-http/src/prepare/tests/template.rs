//! What a chat's template reads besides its messages: tools, template arguments and
//! a cache salt reach the prompt the router routes on, and each is refused with a
//! precise 400 when it is not what it must be.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use router_tokenize::{ChatTokenizer, DEFAULT_MEDIA_PART_TOKENS};
use serde_json::{Value, json};

use super::super::*;

/// The tiny tokenizer (its markers added tokens) with a template that writes each
/// tool's name before the messages and refuses a `strict` argument, in a directory
/// of its own.
struct Templated(PathBuf);

impl Templated {
    fn new(name: &str) -> Self {
        let testdata =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizer-tiny");
        let dir =
            std::env::temp_dir().join(format!("switchyard-template-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // The tiny tokenizer, its markers made added tokens (where a prompt may be cut).
        let mut tokenizer: Value =
            serde_json::from_slice(&std::fs::read(testdata.join("tokenizer.json")).unwrap())
                .unwrap();
        tokenizer["added_tokens"] = json!([
            {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 2, "content": "<|user|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 3, "content": "<|assistant|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        ]);
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        let template = "{% if strict %}{{ raise_exception('strict mode is not supported') }}{% endif %}\
            {{ bos_token }}{% for t in tools or [] %} {{ t.function.name }}{% endfor %}\
            {% for m in messages %} <|{{ m.role }}|> {{ m.content }}{% endfor %}\
            {% if add_generation_prompt %} <|assistant|>{% endif %}";
        let config = json!({"bos_token": "<s>", "chat_template": template});
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        Self(dir)
    }

    fn tokenizer(&self) -> Arc<ChatTokenizer> {
        Arc::new(ChatTokenizer::load(&self.0.join("tokenizer.json")).unwrap())
    }
}

impl Drop for Templated {
    fn drop(&mut self) {
        drop(std::fs::remove_dir_all(&self.0));
    }
}

fn prepared(tokenizer: &Arc<ChatTokenizer>, body: &Value) -> Result<Prepared, ApiError> {
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap());
    let (prepared, tokenize) = prepare(&CHAT, &bytes, |_| Ok(Some(Arc::clone(tokenizer))))?;
    assert!(
        tokenize.is_none(),
        "a small body is tokenized in preparation"
    );
    Ok(prepared)
}

/// Prepares `body` and runs its tokenization, on this thread when it was handed over.
fn tokenized(tokenizer: &Arc<ChatTokenizer>, body: &Value) -> Result<Prepared, ApiError> {
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap());
    let (prepared, tokenize) = prepare(&CHAT, &bytes, |_| Ok(Some(Arc::clone(tokenizer))))?;
    match tokenize {
        Some(tokenize) => Ok(prepared.with_tokens(tokenize.run()?)),
        None => Ok(prepared),
    }
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hello world"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn tool(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}})
}

#[test]
fn tools_reach_the_prompt_the_router_routes_on() {
    let files = Templated::new("tools");
    let tokenizer = files.tokenizer();
    let plain = prepared(&tokenizer, &chat(json!({}))).unwrap();
    assert_eq!(plain.token_ids.as_deref(), Some(&[1, 2, 4, 5, 3][..]));
    let tools = chat(json!({"tools": [tool("again"), tool("hello")]}));
    let with_tools = prepared(&tokenizer, &tools).unwrap();
    // <s> again hello <|user|> hello world <|assistant|>
    assert_eq!(
        with_tools.token_ids.as_deref(),
        Some(&[1, 6, 4, 2, 4, 5, 3][..])
    );
    assert_eq!(with_tools.input_tokens, plain.input_tokens + 2);
    // SGLang leaves the tools out for `tool_choice: "none"`.
    let none = chat(json!({"tools": [tool("again")], "tool_choice": "none"}));
    assert_eq!(
        prepared(&tokenizer, &none).unwrap().token_ids,
        plain.token_ids
    );
}

#[test]
fn what_the_template_refuses_is_a_400_with_its_message() {
    let files = Templated::new("refuses");
    let tokenizer = files.tokenizer();
    let err = prepared(
        &tokenizer,
        &chat(json!({"chat_template_kwargs": {"strict": true}})),
    )
    .unwrap_err();
    assert_eq!(
        (err.status().as_u16(), err.code()),
        (400, "invalid_messages")
    );
    assert!(
        err.message().contains("strict mode is not supported"),
        "{}",
        err.message()
    );
    let allowed = chat(json!({"chat_template_kwargs": {"strict": false}}));
    assert!(prepared(&tokenizer, &allowed).is_ok());
}

#[test]
fn a_chat_with_media_routes_on_its_prompt_up_to_the_first_media_part() {
    let files = Templated::new("media");
    let tokenizer = files.tokenizer();
    let with_images = |urls: &[&str]| {
        let mut parts = vec![json!({"type": "text", "text": "hello"})];
        parts.extend(
            urls.iter()
                .map(|url| json!({"type": "image_url", "image_url": {"url": url}})),
        );
        json!({"model": "m", "messages": [{"role": "user", "content": parts}]})
    };
    let one = prepared(&tokenizer, &with_images(&["https://example.com/a.png"])).unwrap();
    // <s> <|user|>: the prompt up to the last added token before the image.
    assert_eq!(one.token_ids.as_deref(), Some(&[1, 2][..]));
    let text_only = prepared(&tokenizer, &with_images(&[])).unwrap();
    assert!(
        one.input_tokens >= text_only.input_tokens + u64::from(DEFAULT_MEDIA_PART_TOKENS),
        "the image counts at the default bound beside the text: {} against {}",
        one.input_tokens,
        text_only.input_tokens
    );
    let payload = format!("data:image/png;base64,{}", "A".repeat(100_000));
    let inline = tokenized(&tokenizer, &with_images(&[&payload])).unwrap();
    assert_eq!(
        inline.input_tokens, one.input_tokens,
        "an image's bytes do not count: its bound does"
    );
    let two = prepared(
        &tokenizer,
        &with_images(&["https://example.com/a.png", "https://example.com/b.png"]),
    )
    .unwrap();
    assert_eq!(
        two.input_tokens - one.input_tokens,
        u64::from(DEFAULT_MEDIA_PART_TOKENS),
        "each part counts its bound"
    );
    let small = Arc::new(
        ChatTokenizer::load(&files.0.join("tokenizer.json"))
            .unwrap()
            .with_media_part_tokens(256),
    );
    let counted = prepared(&small, &with_images(&["https://example.com/a.png"])).unwrap();
    assert_eq!(
        one.input_tokens - counted.input_tokens,
        u64::from(DEFAULT_MEDIA_PART_TOKENS - 256),
        "a model's own bound"
    );
}

#[test]
fn a_cache_salt_is_read_and_bounded() {
    let files = Templated::new("salt");
    let tokenizer = files.tokenizer();
    let salted = prepared(&tokenizer, &chat(json!({"cache_salt": "tenant-7"}))).unwrap();
    assert_eq!(salted.cache_salt.as_deref(), Some("tenant-7"));
    let empty = prepared(&tokenizer, &chat(json!({"cache_salt": ""}))).unwrap();
    assert_eq!(
        empty.cache_salt, None,
        "an empty salt is none, as SGLang reads it"
    );
    for (salt, message) in [
        (json!(5), "cache_salt must be a string"),
        (
            json!("x".repeat(513)),
            "cache_salt must be at most 512 bytes",
        ),
    ] {
        let err = prepared(&tokenizer, &chat(json!({"cache_salt": salt}))).unwrap_err();
        assert_eq!((err.status().as_u16(), err.message()), (400, message));
    }
}

#[test]
fn a_batch_names_a_salt_a_prompt_and_the_first_is_routed_on() {
    let files = Templated::new("batch-salt");
    let tokenizer = files.tokenizer();
    let complete = |salt: Value| {
        let body = json!({"model": "m", "prompt": ["hello", "world"], "cache_salt": salt});
        let bytes = Bytes::from(serde_json::to_vec(&body).unwrap());
        prepare(&COMPLETIONS, &bytes, |_| Ok(Some(Arc::clone(&tokenizer)))).map(|(p, _)| p)
    };
    let listed = complete(json!(["tenant-1", "tenant-2"])).unwrap();
    assert_eq!(listed.cache_salt.as_deref(), Some("tenant-1"));
    assert_eq!(
        complete(json!("tenant-3")).unwrap().cache_salt.as_deref(),
        Some("tenant-3")
    );
    let err = complete(json!(["ok", 5])).unwrap_err();
    assert_eq!(
        (err.param(), err.message()),
        (Some("cache_salt"), "cache_salt[1] must be a string")
    );
}

#[tokio::test]
async fn a_chat_whose_large_tool_set_was_seen_before_is_tokenized_in_preparation() {
    let files = Templated::new("seen-tools");
    let tokenizer = files.tokenizer();
    let described = |name: &str| {
        let mut tool = tool(name);
        tool["function"]["description"] = json!("x".repeat(INLINE_BODY_BYTES));
        tool
    };
    let body =
        Bytes::from(serde_json::to_vec(&chat(json!({"tools": [described("again")]}))).unwrap());
    assert!(body.len() > INLINE_BODY_BYTES);
    let first = prepare(&CHAT, &body, |_| Ok(Some(Arc::clone(&tokenizer)))).unwrap();
    let counted = first
        .1
        .expect("a tool set seen for the first time is tokenized off the request thread")
        .off_thread(&TokenizePool::new(1))
        .await
        .unwrap();
    let (again, tokenize) = prepare(&CHAT, &body, |_| Ok(Some(Arc::clone(&tokenizer)))).unwrap();
    assert!(
        tokenize.is_none(),
        "the same tool set again costs little: tokenized in preparation"
    );
    assert_eq!(again.token_ids, Some(counted.ids));
    // Another tool set, or the same with another `tool_choice`, is new again.
    let other = Bytes::from(
        serde_json::to_vec(&chat(
            json!({"tools": [described("again")], "tool_choice": "none"}),
        ))
        .unwrap(),
    );
    let (_, tokenize) = prepare(&CHAT, &other, |_| Ok(Some(Arc::clone(&tokenizer)))).unwrap();
    assert!(
        tokenize.is_some(),
        "a tool_choice not seen with these tools"
    );
}

#[test]
fn every_invalid_template_field_gets_a_precise_400() {
    let files = Templated::new("invalid");
    let tokenizer = files.tokenizer();
    let huge: Vec<Value> = (0..MAX_TEMPLATE_VALUES_FOR_TESTS)
        .map(|_| json!(0))
        .collect();
    let cases = [
        (
            json!({"tools": {"a": 1}}),
            "tools",
            "tools must be an array of tool objects",
        ),
        (
            json!({"add_generation_prompt": "yes"}),
            "add_generation_prompt",
            "add_generation_prompt must be a boolean",
        ),
        (
            json!({"continue_final_message": 1}),
            "continue_final_message",
            "continue_final_message must be a boolean",
        ),
        (
            json!({"chat_template_kwargs": [1]}),
            "chat_template_kwargs",
            "chat_template_kwargs must be an object",
        ),
        (
            json!({"documents": "x"}),
            "documents",
            "documents must be an array of objects",
        ),
        (
            json!({"reasoning_effort": [1]}),
            "reasoning_effort",
            "reasoning_effort must be a string or a number",
        ),
        (
            json!({"chat_template_kwargs": {"add_generation_prompt": false}}),
            "chat_template_kwargs",
            "chat_template_kwargs may not set add_generation_prompt",
        ),
        (
            json!({"documents": huge}),
            "documents",
            "tools, documents, chat_template_kwargs and tool_choice must hold at most 262144 JSON values in all",
        ),
    ];
    for (extra, param, message) in cases {
        let err = tokenized(&tokenizer, &chat(extra.clone())).unwrap_err();
        assert_eq!(
            (err.status().as_u16(), err.param(), err.message()),
            (400, Some(param), message),
            "{extra}"
        );
    }
}

const MAX_TEMPLATE_VALUES_FOR_TESTS: usize = chat::MAX_TEMPLATE_VALUES + 1;
