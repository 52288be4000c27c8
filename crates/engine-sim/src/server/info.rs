//! `GET /health`, `GET /server_info` and `GET /v1/models`: whether the engine is up,
//! what it serves and where its feeds are.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::config::PdProtocol;
use super::error::error_response;
use super::publish::LOAD_TOPIC;
use super::state::AppState;

/// `GET /health`: 503 under the failing-health fault. Every probe is counted.
pub(crate) async fn health(State(app): State<Arc<AppState>>) -> StatusCode {
    app.visits.probed();
    if app.faults.current().fail_health {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

/// `GET /server_info`, as SGLang answers it (vLLM has none).
pub(crate) async fn server_info(State(app): State<Arc<AppState>>) -> Response {
    if app.config.pd_protocol == PdProtocol::Vllm {
        return error_response(StatusCode::NOT_FOUND, "vLLM serves no /server_info");
    }
    let c = &app.config;
    let p = app.ports();
    let kv_events = p.kv.first().map(|&base| {
        let mut block = json!({
            "publisher": "zmq",
            "endpoint_host": c.host.to_string(),
            "endpoint_port_base": base,
            "topic": c.kv_topic,
            "block_size": c.page_size,
            "dp_size": c.dp_size,
        });
        if let Some(&replay) = p.replay.first() {
            block["replay_endpoint_port_base"] = json!(replay);
        }
        if let Some(&load) = p.load.first() {
            block["load_endpoint_port_base"] = json!(load);
            block["load_topic"] = json!(LOAD_TOPIC);
        }
        block
    });
    Json(json!({
        "model_path": c.model,
        "served_model_name": c.model,
        "disaggregation_mode": c.role.disaggregation_mode(),
        "disaggregation_bootstrap_port": p.bootstrap,
        "disaggregation_transfer_backend": c.transfer_backend,
        "page_size": c.page_size,
        "dp_size": c.dp_size,
        "max_running_requests": c.max_running_requests,
        "max_total_num_tokens": c.kv_capacity_tokens,
        "kv_events": kv_events,
        "version": concat!("switchyard-engine-sim ", env!("CARGO_PKG_VERSION")),
    }))
    .into_response()
}

/// `GET /v1/models`: the model and its LoRA adapters.
pub(crate) async fn models(State(app): State<Arc<AppState>>) -> Json<Value> {
    let base = &app.config.model;
    let mut data = vec![
        json!({"id": base, "object": "model", "created": 0, "owned_by": "sglang", "root": base, "parent": null}),
    ];
    for adapter in &app.config.lora_adapters {
        data.push(json!({"id": adapter, "object": "model", "created": 0, "owned_by": "sglang", "root": format!("/adapters/{adapter}"), "parent": base}));
    }
    Json(json!({"object": "list", "data": data}))
}
