//! Prefill/decode hand-over through bootstrap rooms.

mod common;

use common::*;
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
