//! The router's HTTP surface: one module per surface, each route declared here.

pub(crate) mod admin;
mod chat;
mod explain;
mod health;
mod metrics;
mod models;
#[cfg(feature = "picker")]
pub(crate) mod picker;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{delete, get};

use crate::app::AppContext;
use crate::error::ApiError;
use crate::prepare::{CHAT, COMPLETIONS, EMBEDDINGS, GENERATE};

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// The public routes, with the admin API unless it has an address of its own.
pub(crate) fn router(ctx: Arc<AppContext>, with_admin: bool) -> axum::Router {
    let public = axum::Router::new()
        .route(CHAT.path, chat::routed(&CHAT))
        .route(COMPLETIONS.path, chat::routed(&COMPLETIONS))
        .route(EMBEDDINGS.path, chat::routed(&EMBEDDINGS))
        .route(GENERATE.path, chat::routed(&GENERATE))
        .route("/v1/models", get(models::list))
        .route("/health", get(health::live))
        .route("/ready", get(health::ready))
        .route("/metrics", get(metrics::scrape))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES));
    let public = if with_admin {
        public.merge(admin_routes(&ctx))
    } else {
        public
    };
    public.with_state(ctx)
}

/// The probes alone (`/health`, `/ready`, `/metrics`), for connections taken past
/// `limits.max_connections`; any other request gets 503 `overloaded`.
pub(crate) fn probe_router(ctx: Arc<AppContext>) -> axum::Router {
    axum::Router::new()
        .route("/health", get(health::live))
        .route("/ready", get(health::ready))
        .route("/metrics", get(metrics::scrape))
        .fallback(|| async {
            let mut refused = ApiError::overloaded(
                "every connection slot (limits.max_connections) is serving a request; this connection answers only /health, /ready and /metrics",
            )
            .into_response();
            refused
                .headers_mut()
                .insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            refused
        })
        .with_state(ctx)
}

/// The admin API alone, for its own address.
pub(crate) fn admin_router(ctx: Arc<AppContext>) -> axum::Router {
    admin_routes(&ctx).with_state(ctx)
}

/// `/workers` and `/explain/...`, each request authorized before its body is read.
fn admin_routes(ctx: &Arc<AppContext>) -> axum::Router<Arc<AppContext>> {
    let explained = [&CHAT, &COMPLETIONS, &EMBEDDINGS, &GENERATE];
    explained
        .into_iter()
        .fold(axum::Router::new(), |routes, endpoint| {
            routes.route(&explain::path(endpoint), explain::explained(endpoint))
        })
        .route("/workers", get(admin::list).post(admin::add))
        .route("/workers/{id}", delete(admin::remove))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(ctx),
            admin::authorize,
        ))
}
