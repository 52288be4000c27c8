//! The engine's HTTP surface, spoken to over real sockets.

use crate::common;

use common::*;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{Value, json};

/// `POST url` with `body`, answered with JSON.
async fn post_json(url: &str, body: &Value) -> Value {
    client()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The JSON events of an SSE answer, which must end with `data: [DONE]`.
async fn chunks(response: reqwest::Response) -> Vec<Value> {
    let events: Vec<String> = response
        .bytes_stream()
        .eventsource()
        .map(|event| event.expect("well-formed SSE").data)
        .collect()
        .await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    events[..events.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test]
async fn a_chat_completion_has_the_openai_shape_and_honours_max_tokens() {
    let engine = engine(config()).await;
    let mut body = chat_body("hello there engine");
    body["max_tokens"] = json!(5);
    let (status, reply) = chat(&engine, &body).await;
    assert_eq!(status, 200);
    assert_eq!(reply["object"], "chat.completion");
    assert!(reply["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(reply["model"], "sim-model");
    let choice = &reply["choices"][0];
    assert_eq!(
        (choice["index"].as_u64(), choice["message"]["role"].as_str()),
        (Some(0), Some("assistant"))
    );
    assert_eq!(
        choice["message"]["content"]
            .as_str()
            .unwrap()
            .split(' ')
            .count(),
        5
    );
    assert_eq!(choice["finish_reason"], "length", "max_tokens reached");
    let usage = &reply["usage"];
    assert_eq!(
        usage["prompt_tokens"], 5,
        "role marker, three words, generation marker"
    );
    assert_eq!(usage["completion_tokens"], 5);
    assert_eq!(usage["total_tokens"], 10);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, unlimited) = chat(&engine, &chat_body("hello")).await;
    assert_eq!(unlimited["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        unlimited["usage"]["completion_tokens"], 32,
        "the default output length"
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn input_ids_replace_tokenization() {
    let engine = engine(config()).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "ignored"}], "input_ids": [1, 2, 3, 4, 5, 6, 7], "max_tokens": 1});
    let (status, reply) = chat(&engine, &body).await;
    assert_eq!(status, 200);
    assert_eq!(reply["usage"]["prompt_tokens"], 7);
    engine.shutdown().await;
}

#[tokio::test]
async fn a_stream_parses_as_server_sent_events_in_the_openai_chunk_shape() {
    let engine = engine(config()).await;
    let mut body = chat_body("stream me something");
    body["stream"] = json!(true);
    body["max_tokens"] = json!(3);
    body["stream_options"] = json!({"include_usage": true});
    let response = client()
        .post(format!("{}/v1/chat/completions", engine.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let chunks = chunks(response).await;
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""}),
        "role delta first"
    );
    let text: String = chunks[1..4]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text.split(' ').count(), 3);
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(
        chunks[5]["choices"],
        json!([]),
        "the usage chunk has no choices"
    );
    assert_eq!(chunks[5]["usage"]["completion_tokens"], 3);
    assert_eq!(chunks.len(), 6);
    engine.shutdown().await;
}

#[tokio::test]
async fn the_same_long_prompt_twice_is_cached_and_prefills_faster() {
    let mut config = config();
    config.prefill_tokens_per_sec = 1_000_000.0;
    let engine = engine(config).await;
    let mut load = subscribe(engine.ports().load[0], "").await;
    let busy = |fields: &[u64]| fields[9];
    let before = busy(&next_load(&mut load).await);
    let body = chat_body(&words(2000, "w"));
    let (_, first) = chat(&engine, &body).await;
    let after_first = wait_for_busy_change(&mut load, before).await;
    let (_, second) = chat(&engine, &body).await;
    let after_second = wait_for_busy_change(&mut load, after_first).await;
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        prompt / 16 * 16,
        "every full 16-token page is cached"
    );
    let (first_us, second_us) = (after_first - before, after_second - after_first);
    assert_eq!(first_us, prompt, "2002 uncached tokens at 1M tokens/s");
    assert_eq!(
        second_us,
        prompt % 16,
        "only the partial page is prefilled again"
    );
    engine.shutdown().await;

    async fn wait_for_busy_change(load: &mut zeromq::SubSocket, from: u64) -> u64 {
        loop {
            let busy = next_load(load).await[9];
            if busy != from {
                return busy;
            }
        }
    }
}

#[tokio::test]
async fn bad_requests_get_openai_shaped_400s() {
    let engine = engine(config()).await;
    let url = format!("{}/v1/chat/completions", engine.url());
    let response = client().post(&url).body("{not json").send().await.unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid request body")
    );
    let (status, body) = chat(&engine, &json!({"model": "m", "messages": []})).await;
    assert_eq!(
        (status.as_u16(), body["error"]["message"].as_str()),
        (400, Some("messages must not be empty"))
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn server_info_advertises_exactly_the_bound_ports() {
    let mut config = config();
    config.model = "qwen-sim".into();
    config.page_size = 32;
    let engine = engine(config).await;
    let info = get_json(format!("{}/server_info", engine.url())).await;
    let ports = engine.ports();
    assert_eq!(info["disaggregation_mode"], "null");
    assert_eq!(info["page_size"], 32);
    assert_eq!(info["dp_size"], 1);
    assert_eq!(info["disaggregation_bootstrap_port"], Value::Null);
    let kv = &info["kv_events"];
    assert_eq!(kv["publisher"], "zmq");
    assert_eq!(kv["endpoint_host"], "127.0.0.1");
    assert_eq!(kv["endpoint_port_base"], ports.kv[0]);
    assert_eq!(kv["replay_endpoint_port_base"], ports.replay[0]);
    assert_eq!(kv["load_endpoint_port_base"], ports.load[0]);
    assert_eq!(
        (kv["load_topic"].as_str(), kv["topic"].as_str()),
        (Some("load"), Some(""))
    );
    assert_eq!(
        (kv["block_size"].as_u64(), kv["dp_size"].as_u64()),
        (Some(32), Some(1))
    );
    let models: Value = client()
        .get(format!("{}/v1/models", engine.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "qwen-sim");
    engine.shutdown().await;

    let quiet = common::engine(engine_sim::SimConfig::for_tests()).await;
    let info: Value = client()
        .get(format!("{}/server_info", quiet.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        info["kv_events"],
        Value::Null,
        "no --kv-port: no events advertised"
    );
    quiet.shutdown().await;
}

#[tokio::test]
async fn health_metrics_and_flush() {
    let engine = engine(config()).await;
    let health = client()
        .get(format!("{}/health", engine.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let metrics = client()
        .get(format!("{}/metrics", engine.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for gauge in [
        "vllm:num_requests_running{engine=\"0\",model_name=\"sim-model\"} 0.0\n",
        "vllm:num_requests_waiting{engine=\"0\",model_name=\"sim-model\"} 0.0\n",
        "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"sim-model\"} 0.0\n",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",num_gpu_blocks=\"65536\"} 1.0\n",
    ] {
        assert!(metrics.contains(gauge), "{gauge} in {metrics}");
    }
    let body = chat_body(&words(64, "f"));
    chat(&engine, &body).await;
    let flushed = client()
        .post(format!("{}/flush_cache", engine.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(flushed.status(), 200);
    let (_, again) = chat(&engine, &body).await;
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "the flush emptied the cache"
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn a_text_completion_has_the_openai_shape_for_text_and_token_id_prompts() {
    let engine = engine(config()).await;
    let url = format!("{}/v1/completions", engine.url());
    for (prompt, tokens) in [
        (json!("three words here"), 3),
        (json!([7, 8, 9, 10]), 4),
        (json!(["one prompt in a list"]), 5),
        (json!([[1, 2]]), 2),
    ] {
        let body = json!({"model": "m", "prompt": prompt, "max_tokens": 2});
        let response = client().post(&url).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 200, "{prompt}");
        let reply: Value = response.json().await.unwrap();
        assert_eq!(reply["object"], "text_completion");
        assert!(reply["id"].as_str().unwrap().starts_with("cmpl-"));
        let choice = &reply["choices"][0];
        assert_eq!(choice["text"].as_str().unwrap().split(' ').count(), 2);
        assert_eq!(choice["finish_reason"], "length");
        assert_eq!(reply["usage"]["prompt_tokens"], tokens, "{prompt}");
    }
    let batch = json!({"model": "m", "prompt": ["a", "b"]});
    let response = client().post(&url).json(&batch).send().await.unwrap();
    assert_eq!(response.status(), 400, "one prompt a request");
    let missing = client()
        .post(&url)
        .json(&json!({"model": "m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);
    engine.shutdown().await;
}

#[tokio::test]
async fn a_streamed_text_completion_has_no_role_event() {
    let engine = engine(config()).await;
    let body = json!({"model": "m", "prompt": "stream me", "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}});
    let response = client()
        .post(format!("{}/v1/completions", engine.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let chunks = chunks(response).await;
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let text: String = chunks[..3]
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        text.split(' ').count(),
        3,
        "three words, no role event first"
    );
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[4]["usage"]["prompt_tokens"], 2);
    assert_eq!(chunks.len(), 5);
    engine.shutdown().await;
}

#[tokio::test]
async fn embeddings_have_the_openai_shape_one_unit_vector_an_input() {
    let engine = engine(config()).await;
    let url = format!("{}/v1/embeddings", engine.url());
    let body = json!({"model": "m", "input": ["one two", "three four five"]});
    let reply = post_json(&url, &body).await;
    assert_eq!(reply["object"], "list");
    let data = reply["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (index, item) in data.iter().enumerate() {
        assert_eq!(
            (item["object"].as_str(), item["index"].as_u64()),
            (Some("embedding"), Some(index as u64))
        );
        let norm: f64 = item["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap().powi(2))
            .sum();
        assert!((norm - 1.0).abs() < 1e-9, "unit length: {norm}");
    }
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    assert_eq!(reply["usage"]["prompt_tokens"], 5);
    let again: Value = client()
        .post(&url)
        .json(&json!({"model": "m", "input": "one two"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        again["data"][0]["embedding"], data[0]["embedding"],
        "deterministic"
    );
    let empty = client()
        .post(&url)
        .json(&json!({"model": "m", "input": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(empty.status(), 400);
    engine.shutdown().await;
}

#[tokio::test]
async fn generate_answers_in_sglangs_native_shape() {
    let engine = engine(config()).await;
    let url = format!("{}/generate", engine.url());
    let body =
        json!({"text": "three words here", "sampling_params": {"max_new_tokens": 3}, "rid": "r-1"});
    let reply = post_json(&url, &body).await;
    assert_eq!(reply["text"].as_str().unwrap().split(' ').count(), 3);
    assert_eq!(reply["output_ids"], json!([1, 2, 3]));
    let meta = &reply["meta_info"];
    assert_eq!(
        (
            &meta["id"],
            &meta["finish_reason"],
            &meta["prompt_tokens"],
            &meta["completion_tokens"]
        ),
        (
            &json!("r-1"),
            &json!({"type": "length", "length": 3}),
            &json!(3),
            &json!(3)
        )
    );
    let batch = json!({"input_ids": [[5, 6]], "sampling_params": [{"max_new_tokens": 1}]});
    let reply = post_json(&url, &batch).await;
    assert_eq!(
        reply[0]["meta_info"]["prompt_tokens"], 2,
        "a batch of one is answered with a list of one: {reply}"
    );
    let stream =
        json!({"text": "stream me", "sampling_params": {"max_new_tokens": 3}, "stream": true});
    let response = client().post(&url).json(&stream).send().await.unwrap();
    let chunks = chunks(response).await;
    let texts: Vec<&str> = chunks.iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(chunks.len(), 4, "three tokens, then the finish: {texts:?}");
    for pair in texts.windows(2) {
        assert!(pair[1].starts_with(pair[0]), "cumulative text: {texts:?}");
    }
    assert_eq!(texts[3].split(' ').count(), 3);
    assert!(
        chunks[..3]
            .iter()
            .all(|c| c["meta_info"]["finish_reason"].is_null())
    );
    assert_eq!(chunks[3]["meta_info"]["finish_reason"]["type"], "length");
    engine.shutdown().await;
}
