use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use serde_json::json;

use super::*;
use router_tokenize::TokenizePool;

fn run(body: serde_json::Value) -> Result<Prepared, ApiError> {
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap());
    let (prepared, tokenize) = prepare(&CHAT, &bytes, |model| match model {
        Some("m") => Ok(None),
        other => Err(ApiError::model_not_found(other.unwrap_or_default())),
    })?;
    assert!(
        tokenize.is_none(),
        "a model without a tokenizer tokenizes nothing"
    );
    Ok(prepared)
}

fn chat(extra: serde_json::Value) -> serde_json::Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[test]
fn prepares_the_routing_facts() {
    let p = run(chat(
        json!({"stream": true, "max_tokens": 100, "stream_options": {"include_usage": true}}),
    ))
    .unwrap();
    assert_eq!(
        (p.stream, p.max_output_tokens, p.token_ids),
        (true, Some(100), None),
        "run() accepts model \"m\" only"
    );
    let body_len = serde_json::to_vec(&chat(
        json!({"stream": true, "max_tokens": 100, "stream_options": {"include_usage": true}}),
    ))
    .unwrap()
    .len();
    assert_eq!(
        p.input_tokens,
        body_len as u64 / 4,
        "without a tokenizer: about four bytes a token"
    );
    let p = run(chat(json!({"max_tokens": 10, "max_completion_tokens": 20}))).unwrap();
    assert_eq!(p.max_output_tokens, Some(20), "max_completion_tokens wins");
}

#[test]
fn every_invalid_field_gets_a_precise_400() {
    let cases = [
        (
            json!({"messages": []}),
            "missing_model",
            "model",
            "model is required",
        ),
        (
            json!({"model": 3, "messages": []}),
            "invalid_model",
            "model",
            "model must be a string",
        ),
        (
            json!({"model": "", "messages": []}),
            "invalid_model",
            "model",
            "model must not be empty",
        ),
        (
            json!({"model": "m"}),
            "invalid_messages",
            "messages",
            "messages is required",
        ),
        (
            json!({"model": "m", "messages": {}}),
            "invalid_messages",
            "messages",
            "messages must be an array of message objects",
        ),
        (
            json!({"model": "m", "messages": []}),
            "invalid_messages",
            "messages",
            "messages must not be empty",
        ),
        (
            json!({"model": "m", "messages": [3]}),
            "invalid_messages",
            "messages[0]",
            "messages[0] must be an object",
        ),
        (
            json!({"model": "m", "messages": [{"content": "x"}]}),
            "invalid_role",
            "messages[0].role",
            "messages[0].role is required",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user"}, {"role": "robot"}]}),
            "invalid_role",
            "messages[1].role",
            "messages[1].role must be one of system, developer, user, assistant, tool, function",
        ),
        (
            chat(json!({"temperature": 2.5})),
            "invalid_parameter",
            "temperature",
            "temperature must be a number between 0 and 2",
        ),
        (
            chat(json!({"top_p": 0})),
            "invalid_parameter",
            "top_p",
            "top_p must be a number greater than 0 and at most 1",
        ),
        (
            chat(json!({"presence_penalty": -3})),
            "invalid_parameter",
            "presence_penalty",
            "presence_penalty must be a number between -2 and 2",
        ),
        (
            chat(json!({"frequency_penalty": "x"})),
            "invalid_parameter",
            "frequency_penalty",
            "frequency_penalty must be a number between -2 and 2",
        ),
        (
            chat(json!({"n": 0})),
            "invalid_parameter",
            "n",
            "n must be an integer from 1 to 128",
        ),
        (
            chat(json!({"max_tokens": 0})),
            "invalid_parameter",
            "max_tokens",
            "max_tokens must be an integer from 1 to 4294967295",
        ),
        (
            chat(json!({"max_completion_tokens": 1.5})),
            "invalid_parameter",
            "max_completion_tokens",
            "max_completion_tokens must be an integer from 1 to 4294967295",
        ),
        (
            chat(json!({"stream": "yes"})),
            "invalid_parameter",
            "stream",
            "stream must be a boolean",
        ),
        (
            chat(json!({"stream_options": {"include_usage": true}})),
            "invalid_parameter",
            "stream_options",
            "stream_options is only allowed when stream is true",
        ),
        (
            chat(json!({"stream": true, "stream_options": {"include_usage": 1}})),
            "invalid_parameter",
            "stream_options.include_usage",
            "include_usage must be a boolean",
        ),
    ];
    for (body, code, param, message) in cases {
        let err = run(body.clone()).unwrap_err();
        assert_eq!(
            (err.status().as_u16(), err.code(), err.message()),
            (400, code, message),
            "{body}"
        );
        assert_eq!(err.param(), Some(param), "{body}");
    }
}

#[test]
fn malformed_json_and_unknown_models() {
    let err = prepare(&CHAT, &Bytes::from_static(b"{not json"), |_| Ok(None)).unwrap_err();
    assert_eq!(err.code(), "invalid_body");
    assert!(
        err.message()
            .starts_with("the body is not a valid chat request"),
        "{}",
        err.message()
    );
    let err =
        run(json!({"model": "other", "messages": [{"role": "user", "content": "x"}]})).unwrap_err();
    assert_eq!(
        (err.status().as_u16(), err.code(), err.message()),
        (404, "model_not_found", "model \"other\" is not served here")
    );
}

fn tiny_tokenizer() -> Arc<ChatTokenizer> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/tokenizer-tiny/tokenizer.json");
    Arc::new(ChatTokenizer::load(&path).unwrap())
}

fn hello_world() -> Bytes {
    Bytes::from(
        serde_json::to_vec(
            &json!({"model": "m", "messages": [{"role": "user", "content": "hello world"}]}),
        )
        .unwrap(),
    )
}

#[test]
fn a_tokenizer_gives_token_ids_and_the_exact_prompt_length() {
    let (p, tokenize) = prepare(&CHAT, &hello_world(), |_| Ok(Some(tiny_tokenizer()))).unwrap();
    assert!(tokenize.is_none(), "a small prompt is tokenized at once");
    assert_eq!(p.token_ids.as_deref(), Some(&[1, 2, 4, 5, 3][..]));
    assert_eq!(p.input_tokens, 5);
}

#[tokio::test]
async fn the_prompt_is_tokenized_off_the_request_thread() {
    // On this single-threaded runtime, the spawned task runs only when the test's own
    // task waits: it has run by the end only if tokenization left the thread free.
    // The prompt is long enough (100,000 words) that tokenizing it takes far longer
    // than the test's task needs to reach its wait.
    let ran = Arc::new(AtomicBool::new(false));
    let other = {
        let ran = Arc::clone(&ran);
        tokio::spawn(async move { ran.store(true, Ordering::SeqCst) })
    };
    let words = "hello world ".repeat(50_000);
    let body = Bytes::from(
        serde_json::to_vec(
            &json!({"model": "m", "messages": [{"role": "user", "content": words}]}),
        )
        .unwrap(),
    );
    let (_, tokenize) = prepare(&CHAT, &body, |_| Ok(Some(tiny_tokenizer()))).unwrap();
    assert!(body.len() > INLINE_BODY_BYTES);
    let ids = tokenize
        .expect("a tokenization to run")
        .off_thread(&TokenizePool::new(1))
        .await
        .unwrap();
    assert_eq!(
        ids.ids.len(),
        100_003,
        "<s> <|user|> 100,000 words <|assistant|>"
    );
    assert!(
        ran.load(Ordering::SeqCst),
        "another task ran on this thread while the prompt was tokenized"
    );
    other.await.unwrap();
}

#[test]
fn a_small_prompt_is_tokenized_in_preparation_and_a_large_one_is_handed_over() {
    let body = |content: &str| {
        Bytes::from(
            serde_json::to_vec(
                &json!({"model": "m", "messages": [{"role": "user", "content": content}]}),
            )
            .unwrap(),
        )
    };
    let small = body("hello world");
    assert!(small.len() <= INLINE_BODY_BYTES);
    let (prepared, tokenize) = prepare(&CHAT, &small, |_| Ok(Some(tiny_tokenizer()))).unwrap();
    assert!(tokenize.is_none(), "nothing is handed over");
    assert_eq!(
        prepared.input_tokens, 5,
        "<s> <|user|> hello world <|assistant|>"
    );
    let large = body(&"hello ".repeat(INLINE_BODY_BYTES / 6 + 1));
    let (prepared, tokenize) = prepare(&CHAT, &large, |_| Ok(Some(tiny_tokenizer()))).unwrap();
    assert!(tokenize.is_some(), "a larger prompt is handed over");
    assert_eq!(prepared.token_ids, None, "not tokenized yet");
}

/// Prepares a small `body` for `endpoint`, tokenized at once with `with`.
fn small(
    endpoint: &'static Endpoint,
    body: serde_json::Value,
    with: Option<Arc<ChatTokenizer>>,
) -> Result<Prepared, ApiError> {
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap());
    let (prepared, tokenize) = prepare(endpoint, &bytes, |_| Ok(with))?;
    assert!(tokenize.is_none(), "a small body is tokenized at once");
    Ok(prepared)
}

/// The model `body` names to `endpoint`'s preparation (what the router resolves).
fn named(endpoint: &'static Endpoint, body: serde_json::Value) -> Option<String> {
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap());
    let mut seen = None;
    prepare(endpoint, &bytes, |model| {
        seen = model.map(str::to_owned);
        Ok(None)
    })
    .unwrap();
    seen
}

fn complete(
    body: serde_json::Value,
    with: Option<Arc<ChatTokenizer>>,
) -> Result<Prepared, ApiError> {
    small(&COMPLETIONS, body, with)
}

#[test]
fn a_completion_routes_on_its_prompt_as_it_is() {
    let p = complete(
        json!({"model": "m", "prompt": [5, 6, 7], "max_tokens": 4}),
        None,
    )
    .unwrap();
    assert_eq!(
        (p.input_tokens, p.token_ids.as_deref(), p.max_output_tokens),
        (3, Some(&[5, 6, 7][..]), Some(4)),
        "token ids are routed on without a tokenizer"
    );
    let p = complete(
        json!({"model": "m", "prompt": [[1], [2, 3, 4, 5], [6, 7]]}),
        None,
    )
    .unwrap();
    assert_eq!(
        (p.input_tokens, p.token_ids.as_deref()),
        (4, Some(&[1][..])),
        "the longest prompt's length, the first prompt's ids"
    );
    let p = complete(
        json!({"model": "m", "prompt": "hello world", "stream": true}),
        Some(tiny_tokenizer()),
    )
    .unwrap();
    assert_eq!(
        p.token_ids.as_deref(),
        Some(&[4, 5][..]),
        "no chat template"
    );
    assert!(p.stream);
    let p = complete(
        json!({"model": "m", "prompt": ["hello", "hello world hello"]}),
        Some(tiny_tokenizer()),
    )
    .unwrap();
    assert_eq!(
        (p.input_tokens, p.token_ids.as_deref()),
        (3, Some(&[4][..]))
    );
    let p = complete(json!({"model": "m", "prompt": "hello world"}), None).unwrap();
    assert_eq!(p.token_ids, None, "text without a tokenizer is estimated");
}

#[test]
fn every_invalid_completion_field_gets_a_precise_400() {
    let form = "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids: ";
    let cases = [
        (json!({"model": "m"}), "prompt", "prompt is required"),
        (
            json!({"model": "m", "prompt": []}),
            "prompt",
            "prompt must not be an empty list",
        ),
        (
            json!({"model": "m", "prompt": ""}),
            "prompt",
            "prompt must not be empty",
        ),
        (
            json!({"model": "m", "prompt": [[], []]}),
            "prompt",
            "prompt must not be empty",
        ),
        (json!({"model": "m", "prompt": [1, "a"]}), "prompt", form),
        (json!({"model": "m", "prompt": ["a", 1]}), "prompt", form),
        (json!({"model": "m", "prompt": [-1]}), "prompt", form),
        (
            json!({"model": "m", "prompt": [4_294_967_296_u64]}),
            "prompt",
            form,
        ),
        (json!({"model": "m", "prompt": 7}), "prompt", form),
        (
            json!({"model": "m", "prompt": "a", "max_tokens": -1}),
            "max_tokens",
            "max_tokens must be an integer from 0 to 4294967295",
        ),
        (
            json!({"model": "m", "prompt": "a", "add_special_tokens": "yes"}),
            "add_special_tokens",
            "add_special_tokens must be a boolean",
        ),
        (
            json!({"model": "m", "prompt": "a", "stream_options": {}}),
            "stream_options",
            "stream_options is only allowed when stream is true",
        ),
        (
            json!({"model": "m", "prompt": "a", "temperature": 3}),
            "temperature",
            "temperature must be a number between 0 and 2",
        ),
    ];
    for (body, param, message) in cases {
        let err = complete(body.clone(), None).unwrap_err();
        assert_eq!(
            (err.status().as_u16(), err.param()),
            (400, Some(param)),
            "{body}"
        );
        assert!(
            err.message().starts_with(message),
            "{body}: {}",
            err.message()
        );
    }
}

#[test]
fn a_completion_defaults_to_16_output_tokens_and_allows_0() {
    let p = complete(json!({"model": "m", "prompt": [1]}), None).unwrap();
    assert_eq!(p.max_output_tokens, Some(16), "vLLM's and SGLang's default");
    let p = complete(
        json!({"model": "m", "prompt": [1], "max_tokens": 0, "echo": true}),
        None,
    )
    .unwrap();
    assert_eq!(
        p.max_output_tokens,
        Some(0),
        "a prompt scored without output"
    );
    let p = complete(
        json!({"model": "m", "prompt": [1], "max_tokens": null}),
        None,
    )
    .unwrap();
    assert_eq!(p.max_output_tokens, None, "no budget");
}

#[test]
fn a_body_of_token_ids_is_bounded() {
    let over = vec![1_u32; completions::MAX_PROMPT_IDS + 1];
    let err = complete(json!({"model": "m", "prompt": over}), None).unwrap_err();
    assert!(
        err.message().contains("more than 4194304 token ids"),
        "{}",
        err.message()
    );
    let split = vec![vec![1_u32; completions::MAX_PROMPT_IDS / 2 + 1]; 2];
    let err = complete(json!({"model": "m", "prompt": split}), None).unwrap_err();
    assert!(
        err.message().contains("more than 4194304 token ids"),
        "{}",
        err.message()
    );
    let many = vec![vec![1_u32]; completions::MAX_PROMPTS + 1];
    let err = complete(json!({"model": "m", "prompt": many}), None).unwrap_err();
    assert!(
        err.message().contains("more than 65536 prompts"),
        "{}",
        err.message()
    );
    let texts = vec!["a"; completions::MAX_PROMPTS + 1];
    let err = complete(json!({"model": "m", "prompt": texts}), None).unwrap_err();
    assert!(
        err.message().contains("more than 65536 prompts"),
        "{}",
        err.message()
    );
}

#[test]
fn texts_without_a_tokenizer_are_estimated_by_the_longest() {
    let long = "x".repeat(400);
    let p = complete(json!({"model": "m", "prompt": ["short", long]}), None).unwrap();
    assert_eq!((p.input_tokens, p.token_ids), (100, None));
}

#[test]
fn an_embedding_routes_on_its_input_with_no_output() {
    let embed = |body: serde_json::Value| {
        let bytes = Bytes::from(serde_json::to_vec(&body).unwrap());
        prepare(&EMBEDDINGS, &bytes, |_| Ok(Some(tiny_tokenizer()))).map(|(p, _)| p)
    };
    let p = embed(json!({"model": "m", "input": ["hello", "hello world hello"]})).unwrap();
    assert_eq!(
        (
            p.input_tokens,
            p.token_ids.as_deref(),
            p.max_output_tokens,
            p.stream
        ),
        (3, Some(&[4][..]), Some(0), false),
        "the longest input's length, the first's ids"
    );
    let p = embed(
        json!({"model": "m", "input": [3, 4, 5], "encoding_format": "base64", "dimensions": 4}),
    )
    .unwrap();
    assert_eq!(p.input_tokens, 3);
    for (body, param) in [
        (json!({"model": "m"}), "input"),
        (json!({"model": "m", "input": []}), "input"),
        (
            json!({"model": "m", "input": "a", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (
            json!({"model": "m", "input": "a", "dimensions": 0}),
            "dimensions",
        ),
        (
            json!({"model": "m", "input": "a", "dimensions": -1}),
            "dimensions",
        ),
        (
            json!({"model": "m", "input": "a", "add_special_tokens": 1}),
            "add_special_tokens",
        ),
    ] {
        let err = embed(body.clone()).unwrap_err();
        assert_eq!(
            (err.status().as_u16(), err.param()),
            (400, Some(param)),
            "{body}"
        );
    }
}

#[test]
fn a_list_of_prompts_is_a_batch_even_of_one() {
    let batch = |prompt: serde_json::Value| {
        complete(json!({"model": "m", "prompt": prompt}), None)
            .unwrap()
            .batch
    };
    assert_eq!(batch(json!("x")), None);
    assert_eq!(
        batch(json!([1, 2, 3])),
        None,
        "a flat list of ids is one prompt"
    );
    assert_eq!(batch(json!(["x"])), Some(1));
    assert_eq!(batch(json!(["x", "y"])), Some(2));
    assert_eq!(batch(json!([[1], [2, 3], [4]])), Some(3));
    let p = run(chat(json!({}))).unwrap();
    assert_eq!(p.batch, None, "a chat is one conversation");
}

fn generate(
    body: serde_json::Value,
    with: Option<Arc<ChatTokenizer>>,
) -> Result<Prepared, ApiError> {
    small(&GENERATE, body, with)
}

#[test]
fn a_generate_body_routes_on_text_or_input_ids() {
    let p = generate(json!({"text": "hello world"}), Some(tiny_tokenizer())).unwrap();
    assert_eq!(
        (
            p.token_ids.as_deref(),
            p.max_output_tokens,
            p.stream,
            p.batch
        ),
        (Some(&[4, 5][..]), Some(128), false, None),
        "text tokenized as it is, SGLang's default budget"
    );
    assert_eq!(named(&GENERATE, json!({"text": "x"})), None, "no model");
    assert_eq!(
        named(&GENERATE, json!({"text": "x", "model": null})),
        None,
        "a null model is none"
    );
    assert_eq!(
        named(&GENERATE, json!({"text": "x", "model": "m"})).as_deref(),
        Some("m")
    );
    let p = generate(
        json!({"model": "m", "input_ids": [[1, 2], [3, 4, 5]], "stream": true,
               "sampling_params": [{"max_new_tokens": 5}, {"max_new_tokens": 9}],
               "rid": ["a", "b"], "lora_path": ["sql", "sql"]}),
        None,
    )
    .unwrap();
    assert_eq!(
        (
            p.input_tokens,
            p.token_ids.as_deref(),
            p.max_output_tokens,
            p.stream,
            p.batch
        ),
        (3, Some(&[1, 2][..]), Some(9), true, Some(2)),
        "a batch: the longest prompt, the first's ids, the largest budget"
    );
    let budget = |params: serde_json::Value| {
        generate(json!({"input_ids": [1], "sampling_params": params}), None)
            .unwrap()
            .max_output_tokens
    };
    assert_eq!(budget(json!({"temperature": 0})), Some(128));
    assert_eq!(budget(json!({"max_new_tokens": 0})), Some(0));
    assert_eq!(budget(json!({"max_new_tokens": null})), None, "no budget");
    assert_eq!(
        budget(json!([{"max_new_tokens": 3}, {"max_new_tokens": null}])),
        None
    );
    assert_eq!(budget(json!(null)), Some(128));
    let p = generate(json!({"text": ["a", "b"], "model": null}), None).unwrap();
    assert_eq!((p.batch, p.adapter), (Some(2), None));
    let p = generate(json!({"text": "a", "lora_path": "sql"}), None).unwrap();
    assert_eq!(
        p.adapter.as_deref(),
        Some("sql"),
        "lora_path names the adapter"
    );
}

#[test]
fn every_invalid_generate_field_gets_a_precise_400() {
    let cases = [
        (json!({}), "text", "text or input_ids is required"),
        (
            json!({"text": "a", "input_ids": [1]}),
            "text",
            "send either text or input_ids, not both",
        ),
        (
            json!({"text": [1, 2]}),
            "text",
            "text must be a string or a list of strings",
        ),
        (
            json!({"input_ids": "a"}),
            "input_ids",
            "input_ids must be a list of token ids",
        ),
        (
            json!({"input_ids": []}),
            "input_ids",
            "input_ids must not be an empty list",
        ),
        (
            json!({"input_embeds": [[0.5]]}),
            "input_embeds",
            "input_embeds cannot be routed on",
        ),
        (
            json!({"text": "a", "model": 3}),
            "model",
            "model must be a string",
        ),
        (
            json!({"text": "a", "stream": "yes"}),
            "stream",
            "stream must be a boolean",
        ),
        (
            json!({"text": "a", "sampling_params": 3}),
            "sampling_params",
            "sampling_params must be an object",
        ),
        (
            json!({"text": "a", "sampling_params": [{"max_new_tokens": -1}]}),
            "sampling_params.max_new_tokens",
            "sampling_params.max_new_tokens must be an integer from 0",
        ),
        (
            json!({"text": "a", "rid": 3}),
            "rid",
            "rid must be a string",
        ),
        (
            json!({"text": "a", "lora_path": {"x": 1}}),
            "lora_path",
            "lora_path must be a string",
        ),
        (
            json!({"text": ["a", "b"], "lora_path": [null, "sql"]}),
            "lora_path",
            "the prompts of a batch must name one adapter",
        ),
        (
            json!({"text": "a", "lora_path": "x".repeat(257)}),
            "lora_path",
            "lora_path must name an adapter of at most 256 bytes",
        ),
        (
            json!({"text": "a", "model": "m".repeat(257)}),
            "model",
            "model must be at most 256 bytes",
        ),
    ];
    for (body, param, message) in cases {
        let err = generate(body.clone(), None).unwrap_err();
        assert_eq!(
            (err.status().as_u16(), err.param()),
            (400, Some(param)),
            "{body}"
        );
        assert!(
            err.message().starts_with(message),
            "{body}: {}",
            err.message()
        );
    }
}

#[test]
fn a_field_the_router_owns_is_found_whatever_its_value() {
    for value in [json!(null), json!(7), json!({"remote_host": "x"})] {
        for field in ["bootstrap_room", "kv_transfer_params", "data_parallel_rank"] {
            let p = run(chat(json!({field: value.clone()}))).unwrap();
            assert!(p.owned, "{field}: {value}");
        }
    }
    assert!(!run(chat(json!({}))).unwrap().owned);
}

mod bounds;
mod template;
