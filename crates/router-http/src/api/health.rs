//! `GET /health` (the router is alive) and `GET /ready` (at least one engine is
//! routable).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use crate::app::AppContext;

pub(super) async fn live() -> StatusCode {
    StatusCode::OK
}

pub(super) async fn ready(State(ctx): State<Arc<AppContext>>) -> Response {
    if ctx.fleet.snapshot().any_healthy() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no engine is routable\n").into_response()
    }
}
