//! Prefill/decode hand-over through bootstrap rooms.

use crate::common;

use common::*;
use engine_sim::free_port_ranges;
use engine_sim::{EngineRole, SimConfig};
use serde_json::{Value, json};

fn role(role: EngineRole) -> SimConfig {
    let mut config = SimConfig::for_tests();
    config.role = role;
    config.bootstrap_timeout_ms = 300;
    if role == EngineRole::Prefill {
        config.bootstrap_port = Some(0);
    }
    config
}

fn pd_body(host: &str, port: u16, room: u64) -> Value {
    let mut body = chat_body(&words(50, "pd"));
    body["bootstrap_host"] = json!(host);
    body["bootstrap_port"] = json!(port);
    body["bootstrap_room"] = json!(room);
    body["max_tokens"] = json!(4);
    body
}

#[tokio::test]
async fn decode_generates_once_prefill_has_filled_the_room() {
    let prefill = engine(role(EngineRole::Prefill)).await;
    let decode = engine(role(EngineRole::Decode)).await;
    let info = get_json(format!("{}/server_info", prefill.url())).await;
    assert_eq!(info["disaggregation_mode"], "prefill");
    let port = info["disaggregation_bootstrap_port"].as_u64().unwrap() as u16;
    assert_eq!(Some(port), prefill.ports().bootstrap);
    let body = pd_body("127.0.0.1", port, 4242);
    let (decoded, prefilled) = tokio::join!(chat(&decode, &body), chat(&prefill, &body));
    assert_eq!(prefilled.0, 200);
    assert_eq!(
        prefilled.1["usage"]["completion_tokens"], 1,
        "a prefill engine emits the first token only"
    );
    assert_eq!(decoded.0, 200, "{}", decoded.1);
    assert_eq!(decoded.1["usage"]["completion_tokens"], 4);
    prefill.shutdown().await;
    decode.shutdown().await;
}

#[tokio::test]
async fn the_decode_engine_reports_the_cached_tokens_the_prefill_engine_found() {
    let prefill = engine(role(EngineRole::Prefill)).await;
    let decode = engine(role(EngineRole::Decode)).await;
    let port = prefill.ports().bootstrap.unwrap();
    let cached = |answer: &Value| answer["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    for (room, warm) in [(1, false), (2, true)] {
        let body = pd_body("127.0.0.1", port, room);
        let (decoded, prefilled) = tokio::join!(chat(&decode, &body), chat(&prefill, &body));
        assert_eq!(prefilled.0, 200);
        assert_eq!(decoded.0, 200, "{}", decoded.1);
        let found = prefilled.1["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert_eq!(
            found > 0,
            warm,
            "the prompt is cached the second time: {found}"
        );
        assert_eq!(
            cached(&decoded.1),
            json!(found),
            "SGLang's decode engine reports what the prefill engine found"
        );
    }
    prefill.shutdown().await;
    decode.shutdown().await;
}

#[tokio::test]
async fn a_decode_engine_refuses_a_room_of_another_page_size_or_transfer_backend() {
    let prefill = engine(role(EngineRole::Prefill)).await;
    let info = get_json(format!("{}/server_info", prefill.url())).await;
    assert_eq!(
        (&info["disaggregation_transfer_backend"], &info["page_size"]),
        (&json!("mooncake"), &json!(16))
    );
    let port = prefill.ports().bootstrap.unwrap();
    for (room, (page_size, backend)) in [(7, (32, "mooncake")), (8, (16, "nixl"))] {
        let mut config = role(EngineRole::Decode);
        config.page_size = page_size;
        config.transfer_backend = backend.into();
        let decode = engine(config).await;
        let body = pd_body("127.0.0.1", port, room);
        let (decoded, prefilled) = tokio::join!(chat(&decode, &body), chat(&prefill, &body));
        assert_eq!(prefilled.0, 200);
        assert_eq!(decoded.0, 500, "{}", decoded.1);
        let message = decoded.1["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.starts_with("KV transfer failed: "), "{message}");
        assert!(
            message.contains("page_size=16") || message.contains("speaks mooncake"),
            "{message}"
        );
        decode.shutdown().await;
    }
    prefill.shutdown().await;
}

#[tokio::test]
async fn a_wrong_room_or_host_fails_the_decode_request() {
    let prefill = engine(role(EngineRole::Prefill)).await;
    let decode = engine(role(EngineRole::Decode)).await;
    let port = prefill.ports().bootstrap.unwrap();
    let (status, _) = chat(&prefill, &pd_body("127.0.0.1", port, 1)).await;
    assert_eq!(status, 200);
    let (status, body) = chat(&decode, &pd_body("127.0.0.1", port, 2)).await;
    assert_eq!(status, 500, "room 2 never fills");
    assert_eq!(
        body["error"]["message"],
        format!(
            "KV transfer failed: bootstrap room 2 at 127.0.0.1:{port} was not ready within 300 ms"
        )
    );
    let [closed] = free_port_ranges([1]);
    let (status, body) = chat(&decode, &pd_body("127.0.0.1", closed, 1)).await;
    assert_eq!(status, 500, "nothing listens there");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unreachable"),
        "{body}"
    );
    let (status, body) = chat(&decode, &chat_body("no bootstrap fields")).await;
    assert_eq!(status, 400);
    assert_eq!(
        body["error"]["message"],
        "a decode engine needs bootstrap_host, bootstrap_port and bootstrap_room"
    );
    prefill.shutdown().await;
    decode.shutdown().await;
}

#[tokio::test]
async fn a_batch_needs_a_list_of_bootstrap_fields_one_a_prompt() {
    let prefill = engine(role(EngineRole::Prefill)).await;
    let decode = engine(role(EngineRole::Decode)).await;
    let port = prefill.ports().bootstrap.unwrap();
    let generate = |engine: &engine_sim::RunningEngine, body: Value| {
        let url = format!("{}/generate", engine.url());
        async move {
            let response = client().post(url).json(&body).send().await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    let scalar = json!({"text": ["a batch of one"], "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": 9});
    let (status, body) = generate(&prefill, scalar).await;
    assert_eq!(
        (status, body["error"]["message"].as_str()),
        (
            400,
            Some("bootstrap_host must be a list, one a prompt, for a batch")
        )
    );
    let listed = json!({"text": ["a batch of one"], "bootstrap_host": ["127.0.0.1"], "bootstrap_port": [port], "bootstrap_room": [9], "sampling_params": {"max_new_tokens": 2}});
    let (decoded, prefilled) = tokio::join!(
        generate(&decode, listed.clone()),
        generate(&prefill, listed)
    );
    assert_eq!(prefilled.0, 200, "{}", prefilled.1);
    assert_eq!(
        (decoded.0, &decoded.1[0]["meta_info"]["completion_tokens"]),
        (200, &json!(2))
    );
    let one = json!({"text": "one prompt", "bootstrap_host": ["127.0.0.1"], "bootstrap_port": [port], "bootstrap_room": [10]});
    let (status, _) = generate(&prefill, one).await;
    assert_eq!(status, 400, "one prompt takes one value a field");
    prefill.shutdown().await;
    decode.shutdown().await;
}

fn vllm(role: EngineRole) -> SimConfig {
    let mut config = self::role(role);
    config.pd_protocol = engine_sim::PdProtocol::Vllm;
    config
}

async fn post(engine: &engine_sim::RunningEngine, body: &Value) -> (u16, Value) {
    let response = client()
        .post(format!("{}/v1/chat/completions", engine.url()))
        .json(body)
        .send()
        .await
        .unwrap();
    (
        response.status().as_u16(),
        response.json::<Value>().await.unwrap(),
    )
}

#[tokio::test]
async fn vllm_decode_takes_the_blocks_a_prefill_offered_once_and_refuses_any_other_params() {
    let prefill = engine(vllm(EngineRole::Prefill)).await;
    let decode = engine(vllm(EngineRole::Decode)).await;
    let info = client()
        .get(format!("{}/server_info", prefill.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(info.status(), 404, "vLLM serves no /server_info");
    let mut body = chat_body(&words(40, "nixl"));
    let (status, refused) = post(&prefill, &body).await;
    assert_eq!(status, 400, "{refused}");
    body["kv_transfer_params"] = json!({"do_remote_decode": true});
    body["max_tokens"] = json!(1);
    let (status, prefilled) = post(&prefill, &body).await;
    assert_eq!(status, 200, "{prefilled}");
    let params = prefilled["kv_transfer_params"].clone();
    assert_eq!(
        (
            &params["do_remote_prefill"],
            &params["remote_port"],
            params["remote_block_ids"][0].as_array().map(Vec::len)
        ),
        (
            &json!(true),
            &json!(prefill.ports().bootstrap.unwrap()),
            Some(3)
        ),
        "40 prompt tokens in pages of 16: {params}"
    );
    let mut decoded = chat_body(&words(40, "nixl"));
    decoded["kv_transfer_params"] = params.clone();
    decoded["max_tokens"] = json!(4);
    let (status, answer) = post(&decode, &decoded).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 4);
    let (status, again) = post(&decode, &decoded).await;
    assert_eq!(
        (status, again["error"]["message"].as_str()),
        (
            400,
            Some(
                format!(
                    "invalid KVTransferParams: no prefill offered {} (or it was taken already)",
                    params["remote_request_id"].as_str().unwrap()
                )
                .as_str()
            )
        ),
        "params are single-use"
    );
    let (_, prefilled) = post(&prefill, &body).await;
    let mut forged = prefilled["kv_transfer_params"].clone();
    forged["remote_engine_id"] = json!("someone-else");
    decoded["kv_transfer_params"] = forged;
    let (status, refused) = post(&decode, &decoded).await;
    assert_eq!(
        (status, refused["error"]["message"].as_str()),
        (
            400,
            Some(
                "invalid KVTransferParams: the engine id or block ids differ from what the prefill offered"
            )
        ),
        "params no prefill offered"
    );
    prefill.shutdown().await;
    decode.shutdown().await;
}
