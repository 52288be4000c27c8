//! The indexer's engine admin API: the routers' `/workers` (list, add, remove; it
//! removes only engines it added), under the same rules: off unless the file's
//! `admin` section (or `SWITCHYARD_ADMIN_TOKEN`) gives a token, each request
//! authorized before its body is read, bodies capped at 64 KiB. An engine is added
//! to every replica and the indexer alike; one of a model without a cache-aware
//! group joins, and feeds the model's index once a reload gives it one.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use http::StatusCode;

use super::follow::IndexerContext;
use crate::api::admin::{added, admitted, created, listed, removed};
use crate::error::ApiError;

/// `/workers` and `/workers/{id}`, each request authorized first.
pub(super) fn routes(ctx: Arc<IndexerContext>) -> axum::Router {
    axum::Router::new()
        .route("/workers", get(list).post(add))
        .route("/workers/{id}", delete(remove))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&ctx), authorize))
        .with_state(ctx)
}

async fn authorize(
    State(ctx): State<Arc<IndexerContext>>,
    request: Request,
    next: Next,
) -> Response {
    // The token in force when the request arrived (a reload may replace it).
    match admitted(&ctx.admin.load_full(), &request) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

async fn list(State(ctx): State<Arc<IndexerContext>>) -> Response {
    listed(&ctx.fleet).into_response()
}

async fn add(
    State(ctx): State<Arc<IndexerContext>>,
    request: Request,
) -> Result<Response, ApiError> {
    let engine = added(&ctx.fleet, request, ctx.body_timeout).await?;
    tracing::info!(engine = %engine.id(), model = engine.model(), "the admin API added an engine");
    Ok(created(&engine))
}

async fn remove(
    State(ctx): State<Arc<IndexerContext>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let removed = removed(&ctx.fleet, id.clone()).await?;
    tracing::info!(engine = id, "the admin API removed an engine");
    Ok(removed)
}
