//! The engine admin API under `/workers` (the path peer routers and their users
//! know): list, add and remove engines; it removes only engines it added. Off unless
//! a token is configured; every request is authorized before its body is read, and
//! bodies are capped at 64 KiB. The shared prefix indexer serves the same handlers
//! over its own fleet (`indexer/admin`).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use router_config::{EngineConfig, EngineRole};
use router_fleet::{Change, Fleet, FleetError, Source};
use router_state::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::access::AdminAccess;
use crate::app::AppContext;
use crate::error::ApiError;
use crate::validated::engine_spec;

/// The largest admin request body accepted.
const MAX_ADMIN_BODY_BYTES: usize = 64 << 10;

/// Lets a request through only with the admin token (`Authorization: Bearer`, the
/// scheme in any case), before anything else is read: 403 `admin_disabled` when the
/// API is off, 401 otherwise.
pub(super) async fn authorize(
    State(ctx): State<Arc<AppContext>>,
    request: Request,
    next: Next,
) -> Response {
    // The token in force when the request arrived (a reload may replace it).
    match admitted(&ctx.admin.load_full(), &request) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

/// Whether `access` lets `request` through: 403 `admin_disabled` when the API is
/// off, 401 without the token.
pub(crate) fn admitted(access: &AdminAccess, request: &Request) -> Result<(), ApiError> {
    if *access == AdminAccess::Off {
        return Err(ApiError::admin_disabled());
    }
    if access.admits(request.headers()) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

pub(super) async fn list(State(ctx): State<Arc<AppContext>>) -> Json<Value> {
    listed(&ctx.fleet)
}

/// Every engine of `fleet`, with its source, health and load.
pub(crate) fn listed(fleet: &Fleet) -> Json<Value> {
    let snapshot = fleet.snapshot();
    let load = fleet.load().snapshot();
    let workers: Vec<Value> = snapshot
        .engines()
        .map(|w| {
            let source = fleet.spec(w.id()).map(|spec| spec.source.as_str());
            json!({
                "id": w.id().as_str(), "url": w.url(), "model": w.model(), "role": w.role().as_str(),
                "source": source,
                "healthy": w.is_healthy(), "in_flight": load.observe(w.id()).in_flight,
                "bootstrap_port": w.bootstrap_port(), "dp_size": w.dp_size().get(),
            })
        })
        .collect();
    Json(json!({"workers": workers}))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddEngine {
    id: String,
    url: String,
    model: String,
    #[serde(default)]
    role: Option<EngineRole>,
    #[serde(default)]
    bootstrap_port: Option<u16>,
    #[serde(default)]
    dp_size: Option<u32>,
    #[serde(default)]
    load_port: Option<u16>,
    #[serde(default)]
    kv_port: Option<u16>,
    #[serde(default)]
    kv_replay_port: Option<u16>,
}

pub(super) async fn add(
    State(ctx): State<Arc<AppContext>>,
    request: Request,
) -> Result<Response, ApiError> {
    let engine = added(&ctx.fleet, request, ctx.client_body_timeout).await?;
    // The fleet's observer gave a new model its catch-all bucket (this call is then
    // a lookup); when the default policies cannot serve one, the engine does not
    // stay.
    if let Err(e) = ctx.routing.serve_new_model(&engine) {
        let added = Change::Remove(engine.id().clone(), Source::Admin);
        drop(ctx.fleet.apply(added).await);
        return Err(ApiError::admin(StatusCode::BAD_REQUEST, e.to_string()));
    }
    Ok(created(&engine))
}

/// The answer to an engine added.
pub(crate) fn created(engine: &Engine) -> Response {
    let body = json!({"id": engine.id().as_str(), "model": engine.model(), "role": engine.role().as_str(), "healthy": engine.is_healthy()});
    (StatusCode::CREATED, Json(body)).into_response()
}

/// Adds to `fleet` the engine `request` describes (its body read within `limit`), as
/// the admin API's.
pub(crate) async fn added(
    fleet: &Fleet,
    request: Request,
    limit: Duration,
) -> Result<Arc<Engine>, ApiError> {
    let body = tokio::time::timeout(
        limit,
        Limited::new(request.into_body(), MAX_ADMIN_BODY_BYTES).collect(),
    )
    .await
    .map_err(|_| ApiError::body_timeout(limit))?
    .map_err(|e| {
        if e.is::<LengthLimitError>() {
            ApiError::too_large(MAX_ADMIN_BODY_BYTES)
        } else {
            ApiError::bad_body(format!("the request body could not be read: {e}"))
        }
    })?
    .to_bytes();
    let add: AddEngine = serde_json::from_slice(&body)
        .map_err(|e| ApiError::admin(StatusCode::BAD_REQUEST, e.to_string()))?;
    let config = EngineConfig {
        id: add.id,
        url: add.url,
        role: add.role,
        bootstrap_port: add.bootstrap_port,
        dp_size: add.dp_size,
        load_port: add.load_port,
        kv_port: add.kv_port,
        kv_replay_port: add.kv_replay_port,
    };
    let invalid =
        |e: &dyn std::fmt::Display| ApiError::admin(StatusCode::BAD_REQUEST, e.to_string());
    fleet
        .apply(Change::Add(
            engine_spec(&config, &add.model).with_source(Source::Admin),
        ))
        .await
        .map_err(|e| match e {
            FleetError::Name { field, .. } => {
                ApiError::invalid("invalid_parameter", field, e.to_string())
            }
            FleetError::DpSize {
                introspected: false,
                ..
            } => ApiError::invalid("invalid_parameter", "dp_size", e.to_string()),
            e => invalid(&e),
        })
}

pub(super) async fn remove(
    State(ctx): State<Arc<AppContext>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    removed(&ctx.fleet, id).await
}

/// Removes engine `id` from `fleet`, when the admin API added it.
pub(crate) async fn removed(fleet: &Fleet, id: String) -> Result<StatusCode, ApiError> {
    fleet
        .apply(Change::Remove(id.into(), Source::Admin))
        .await
        .map_err(|e| match e {
            FleetError::Owned { .. } => ApiError::admin(StatusCode::CONFLICT, e.to_string()),
            e => ApiError::admin(StatusCode::NOT_FOUND, e.to_string()),
        })?;
    Ok(StatusCode::NO_CONTENT)
}
