//! The operator's routes: SGLang's `/flush_cache`, and the simulator's `/admin/faults`,
//! `/admin/restart_publisher`, `/admin/requests` and `/admin/visits`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::error::error_response;
use super::state::AppState;
use crate::faults::FaultConfig;

/// `GET` or `POST /flush_cache`: empties every rank's cache.
pub(crate) async fn flush_cache(State(app): State<Arc<AppState>>) -> &'static str {
    app.engine.flush_cache();
    "Cache flushed.\n"
}

/// `GET /admin/faults`: the fault set in force.
pub(crate) async fn get_faults(State(app): State<Arc<AppState>>) -> Json<FaultConfig> {
    Json(app.faults.current())
}

/// `POST /admin/faults`: replaces the fault set whole.
pub(crate) async fn set_faults(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    let config: FaultConfig = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return error_response(StatusCode::BAD_REQUEST, format!("invalid fault set: {e}"));
        }
    };
    if let Err(e) = config.validate() {
        return error_response(StatusCode::BAD_REQUEST, e);
    }
    app.faults.replace(config.clone());
    Json(config).into_response()
}

/// `GET /admin/requests`: the routing-relevant fields of recent requests, and the
/// request counts.
pub(crate) async fn recent_requests(State(app): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"requests": app.recent(), "visits": app.visits.current()}))
}

/// `GET /admin/visits`: the request counts and the health probes answered.
pub(crate) async fn visits(State(app): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"visits": app.visits.current(), "health_probes": app.visits.health_probes()}))
}

/// `POST /admin/restart_publisher`: restarts every rank's KV-event publisher.
pub(crate) async fn restart_publisher(State(app): State<Arc<AppState>>) -> StatusCode {
    app.engine.restart_publishers();
    StatusCode::NO_CONTENT
}
