//! The route table: each path and the handler module that answers it.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use super::state::AppState;
use super::{admin, chat, embeddings, info, metrics};

/// The largest request body taken: past the router's own bound (32 MiB), as real
/// engines take what a router forwards.
const MAX_BODY_BYTES: usize = 64 << 20;

/// Every route of the main HTTP port.
pub(crate) fn routes(state: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(chat::completions))
        .route("/generate", post(chat::generate))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/health", get(info::health))
        .route("/server_info", get(info::server_info))
        .route("/v1/models", get(info::models))
        .route("/metrics", get(metrics::metrics))
        .route(
            "/flush_cache",
            get(admin::flush_cache).post(admin::flush_cache),
        )
        .merge(admin_routes())
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// The admin routes, also served alone on the admin port.
pub(crate) fn admin_routes() -> axum::Router<Arc<AppState>> {
    axum::Router::new()
        .route(
            "/admin/faults",
            get(admin::get_faults).post(admin::set_faults),
        )
        .route("/admin/restart_publisher", post(admin::restart_publisher))
        .route("/admin/requests", get(admin::recent_requests))
        .route("/admin/visits", get(admin::visits))
}
