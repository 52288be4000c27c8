//! vLLM engines through the router, against simulated engines in vLLM mode (no
//! `/server_info`, so no `LoadStat` feed; a decode engine refuses
//! `kv_transfer_params` no prefill offered): the prefill/decode hand-over, and load
//! read from their `/metrics`.

use crate::common;

use std::time::Duration;

use common::*;
use engine_sim::{RunningEngine, SimConfig, Visits};
use router_config::{EngineRole, ModelConfig, PdProtocol};
use router_http::RunningRouter;
use serde_json::{Value, json};

const GUARD: Duration = Duration::from_secs(30);

async fn vllm(
    role: engine_sim::EngineRole,
    configure: impl FnOnce(&mut SimConfig),
) -> RunningEngine {
    sim(|c| {
        c.role = role;
        c.pd_protocol = engine_sim::PdProtocol::Vllm;
        if role == engine_sim::EngineRole::Prefill {
            c.bootstrap_port = Some(0);
        }
        configure(c);
    })
    .await
}

async fn vllm_router(prefill: &RunningEngine, decode: &RunningEngine) -> RunningRouter {
    let mut model = ModelConfig::new(
        "m",
        vec![
            engine("P1", prefill, EngineRole::Prefill),
            engine("D1", decode, EngineRole::Decode),
        ],
    );
    model.pd_protocol = PdProtocol::Vllm;
    router(config(vec![model])).await
}

async fn send(router: &RunningRouter, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url(router, path))
        .json(body)
        .send()
        .await
        .expect("the router answers")
}

#[tokio::test]
async fn the_prefill_runs_first_and_its_transfer_params_go_with_the_decode_leg() {
    let (prefill, decode) = (
        vllm(engine_sim::EngineRole::Prefill, |_| {}).await,
        vllm(engine_sim::EngineRole::Decode, |_| {}).await,
    );
    let router = vllm_router(&prefill, &decode).await;
    let mut streamed = chat("m", "stream it please");
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    streamed["max_tokens"] = json!(3);
    let response = send(&router, "/v1/chat/completions", &streamed).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        (
            response.headers()["x-switchyard-prefill"].to_str().unwrap(),
            response.headers()["x-switchyard-decode"].to_str().unwrap()
        ),
        ("P1", "D1")
    );
    let text = response.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(text.contains(r#""completion_tokens":3"#), "{text}");
    let completion = json!({"model": "m", "prompt": [5, 6, 7, 8], "max_tokens": 2});
    let response = send(&router, "/v1/completions", &completion).await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], 2);
    let (p, d) = (
        recent_requests(&prefill).await,
        recent_requests(&decode).await,
    );
    assert_eq!((p.len(), d.len()), (2, 2));
    for (p, d) in p.iter().zip(&d) {
        assert_eq!(
            (
                &p["stream"],
                &p["max_tokens"],
                &p["kv_transfer_params"]["do_remote_decode"]
            ),
            (&json!(false), &json!(1), &json!(true)),
            "the prefill leg: {p}"
        );
        assert_eq!(
            d["kv_transfer_params"]["do_remote_prefill"], true,
            "the decode leg brings the prefill's params: {d}"
        );
        assert!(d["kv_transfer_params"]["remote_request_id"].is_string());
        assert_eq!(p["request_id"], d["request_id"], "one request id");
    }
    assert_eq!(
        (&d[0]["stream"], &d[0]["max_tokens"], &d[1]["max_tokens"]),
        (&json!(true), &json!(3), &json!(2)),
        "the decode leg is the client's own request"
    );
    router.shutdown().await;
}

#[tokio::test]
async fn a_failed_prefill_never_reaches_the_decode_engine() {
    let (prefill, decode) = (
        vllm(engine_sim::EngineRole::Prefill, |c| {
            c.faults.error_rate = 1.0
        })
        .await,
        vllm(engine_sim::EngineRole::Decode, |_| {}).await,
    );
    let router = vllm_router(&prefill, &decode).await;
    let response = send(&router, "/v1/chat/completions", &chat("m", "fail first")).await;
    assert_eq!(response.status(), 502);
    let error: Value = response.json().await.unwrap();
    assert_eq!(
        error["error"]["message"],
        "prefill engine P1 failed with status 500 Internal Server Error"
    );
    assert_eq!(decode.visits(), Visits::default(), "decode never asked");
    router.shutdown().await;
}

#[tokio::test]
async fn a_client_leaving_during_the_prefill_aborts_it_and_never_reaches_the_decode_engine() {
    // A prefill of 1,000 s a token is still computing whatever the test's pace.
    let (prefill, decode) = (
        vllm(engine_sim::EngineRole::Prefill, |c| {
            c.prefill_tokens_per_sec = 0.001
        })
        .await,
        vllm(engine_sim::EngineRole::Decode, |_| {}).await,
    );
    let router = vllm_router(&prefill, &decode).await;
    let request = {
        let url = url(&router, "/v1/chat/completions");
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .json(&chat("m", "never mind"))
                .send()
                .await
        })
    };
    tokio::time::timeout(GUARD, prefill.visits_until(|v| v.open == 1))
        .await
        .expect("the prefill leg arrives");
    request.abort();
    let settled = tokio::time::timeout(GUARD, prefill.visits_until(|v| v.open == 0))
        .await
        .expect("the prefill leg ends");
    assert_eq!(settled.abandoned, 1, "the prefill was aborted");
    let load = prefill.engine().load();
    assert_eq!(load.running_requests + load.waiting_requests, 0);
    assert_eq!(decode.visits(), Visits::default(), "decode never asked");
    router.shutdown().await;
}

#[tokio::test]
async fn generate_and_batches_are_refused_before_any_engine_is_asked() {
    let (prefill, decode) = (
        vllm(engine_sim::EngineRole::Prefill, |_| {}).await,
        vllm(engine_sim::EngineRole::Decode, |_| {}).await,
    );
    let router = vllm_router(&prefill, &decode).await;
    let generate = send(&router, "/generate", &json!({"text": "hello"})).await;
    assert_eq!(generate.status(), 400);
    let error: Value = generate.json().await.unwrap();
    assert_eq!(error["error"]["code"], "invalid_model");
    let batch = send(
        &router,
        "/v1/completions",
        &json!({"model": "m", "prompt": ["one", "two"]}),
    )
    .await;
    assert_eq!(batch.status(), 400);
    let error: Value = batch.json().await.unwrap();
    assert_eq!(
        error["error"]["message"],
        "vLLM prefill/decode engines take one prompt a request"
    );
    assert_eq!(
        (prefill.visits(), decode.visits()),
        (Visits::default(), Visits::default())
    );
    router.shutdown().await;
}

#[tokio::test]
async fn load_read_from_a_vllm_engines_metrics_moves_load_based_picks() {
    // A decodes slowly, so requests sent to it directly (not through the router:
    // only its metrics can tell) stay running.
    let (a, b) = (
        vllm(engine_sim::EngineRole::Plain, |c| {
            c.decode_tokens_per_sec = 0.001
        })
        .await,
        vllm(engine_sim::EngineRole::Plain, |_| {}).await,
    );
    let mut model = ModelConfig::new(
        "m",
        vec![
            engine("A", &a, EngineRole::Plain),
            engine("B", &b, EngineRole::Plain),
        ],
    );
    model.policies.plain = Some(serde_json::from_value(json!({"type": "load_based"})).unwrap());
    let mut config = config(vec![model]);
    config.load.metrics_interval_ms = 20;
    let router = router(config).await;
    let busy: Vec<_> = (0..3)
        .map(|n| {
            let url = format!("{}/v1/chat/completions", a.url());
            let mut body = chat("m", &format!("busy {n}"));
            body["stream"] = json!(true);
            body["max_tokens"] = json!(100);
            tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await })
        })
        .collect();
    let fleet = router.context().fleet();
    let reported = |id: &str| {
        fleet
            .load()
            .snapshot()
            .observe(&id.into())
            .reported
            .map(|r| r.running_requests)
    };
    tokio::time::timeout(GUARD, async {
        let mut seen = 0;
        while reported("A") != Some(3) || reported("B") != Some(0) {
            seen = fleet.feed_stats().applied_after(seen).await;
        }
    })
    .await
    .expect("the router reads both engines' metrics");
    for n in 0..4 {
        let response = send(
            &router,
            "/v1/chat/completions",
            &chat("m", &format!("pick {n}")),
        )
        .await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["x-switchyard-engine"],
            "B",
            "A's metrics say it runs 3 requests"
        );
        response.bytes().await.unwrap();
    }
    for request in busy {
        request.abort();
    }
    router.shutdown().await;
}

#[tokio::test]
async fn a_vllm_engine_down_at_startup_has_its_metrics_read_once_it_answers() {
    let [port] = engine_sim::free_port_ranges([1]);
    let url = format!("http://127.0.0.1:{port}");
    let model = ModelConfig::new(
        "m",
        vec![router_config::EngineConfig {
            role: Some(EngineRole::Plain),
            ..router_config::EngineConfig::new("A", &url)
        }],
    );
    let mut config = config(vec![model]);
    config.load.metrics_interval_ms = 20;
    let router = router(config).await;
    let engine = vllm(engine_sim::EngineRole::Plain, |c| c.port = port).await;
    let fleet = router.context().fleet();
    tokio::time::timeout(GUARD, async {
        let mut seen = 0;
        while fleet
            .load()
            .snapshot()
            .observe(&"A".into())
            .reported
            .is_none()
        {
            seen = fleet.feed_stats().applied_after(seen).await;
        }
    })
    .await
    .expect("the router reads the engine's /metrics once it answers");
    engine.shutdown().await;
    router.shutdown().await;
}

#[tokio::test]
async fn the_fields_the_router_owns_never_reach_an_engine_as_a_client_sent_them() {
    let smuggled = |mut body: Value| {
        body["kv_transfer_params"] = json!({"do_remote_prefill": true, "remote_host": "10.9.9.9"});
        body["bootstrap_host"] = json!("10.9.9.9");
        body["bootstrap_port"] = json!(1);
        body["bootstrap_room"] = json!(5);
        body["data_parallel_rank"] = json!(0);
        body
    };
    // A plain engine gets none of them.
    let plain = vllm(engine_sim::EngineRole::Plain, |_| {}).await;
    let mut model = ModelConfig::new("m", vec![engine("A", &plain, EngineRole::Plain)]);
    model.pd_protocol = PdProtocol::Vllm;
    let router = router(config(vec![model])).await;
    let response = send(&router, "/v1/chat/completions", &smuggled(chat("m", "hi"))).await;
    assert_eq!(response.status(), 200);
    let seen = recent_requests(&plain).await;
    let seen = seen.last().unwrap();
    for field in [
        "kv_transfer_params",
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
        "dp_rank",
    ] {
        assert_eq!(seen[field], Value::Null, "{field}: {seen}");
    }
    router.shutdown().await;
    // A decode leg gets the prefill's transfer params, once.
    let (prefill, decode) = (
        vllm(engine_sim::EngineRole::Prefill, |_| {}).await,
        vllm(engine_sim::EngineRole::Decode, |_| {}).await,
    );
    let router = vllm_router(&prefill, &decode).await;
    let response = send(&router, "/v1/chat/completions", &smuggled(chat("m", "hi"))).await;
    assert_eq!(response.status(), 200);
    let decoded = recent_requests(&decode).await;
    let params = &decoded.last().unwrap()["kv_transfer_params"];
    assert_eq!(params["do_remote_prefill"], true, "{params}");
    assert_ne!(params["remote_host"], "10.9.9.9", "{params}");
    assert!(params["remote_request_id"].is_string(), "{params}");
    router.shutdown().await;
}
