//! The router's HTTP surface: one module per surface, each route declared here.

mod admin;
mod chat;
mod health;
mod metrics;
mod models;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get};

use crate::app::AppContext;
use crate::prepare::CHAT;

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 << 20;

pub(crate) fn router(ctx: Arc<AppContext>) -> axum::Router {
    axum::Router::new()
        .route(CHAT.path, chat::routed(&CHAT))
        .route("/v1/models", get(models::list))
        .route("/health", get(health::live))
        .route("/ready", get(health::ready))
        .route("/metrics", get(metrics::scrape))
        .route("/workers", get(admin::list).post(admin::add))
        .route("/workers/{id}", delete(admin::remove))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(ctx)
}
