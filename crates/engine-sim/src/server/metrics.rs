//! `GET /metrics`: each rank's queues and KV-cache use, as vLLM exposes them.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::state::AppState;
use crate::engine::LoadSample;

/// `GET /metrics`, in the Prometheus text format.
pub(crate) async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    let model = &app.config.model;
    let ranks: Vec<_> = app.engine.ranks().iter().map(|r| r.load()).collect();
    type Value = fn(&LoadSample) -> f64;
    let gauges: [(&str, &str, Value); 3] = [
        (
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            |l| l.running_requests as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            |l| l.waiting_requests as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            |l| l.used_kv_tokens as f64 / l.max_kv_tokens.max(1) as f64,
        ),
    ];
    let mut text = String::new();
    for (name, help, value) in gauges {
        text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (rank, load) in ranks.iter().enumerate() {
            text.push_str(&format!(
                "{name}{{engine=\"{rank}\",model_name=\"{model}\"}} {:?}\n",
                value(load)
            ));
        }
    }
    let page = u64::from(app.config.page_size);
    text.push_str("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n");
    for (rank, load) in ranks.iter().enumerate() {
        text.push_str(&format!(
            "vllm:cache_config_info{{block_size=\"{page}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"{rank}\",num_gpu_blocks=\"{}\"}} 1.0\n",
            load.max_kv_tokens / page.max(1)
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
