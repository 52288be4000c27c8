//! The engine admin API under `/workers` (the path peer routers and their users
//! know): list, add and remove engines, behind a bearer token when one is set.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};
use router_fleet::Change;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::AppContext;
use crate::config::{EngineConfig, EngineRole, engine_spec};
use crate::error::ApiError;

fn authorize(ctx: &AppContext, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &ctx.admin_token else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    // Compare in time independent of where the first difference is.
    let equal = given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if equal {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

pub(super) async fn list(
    State(ctx): State<Arc<AppContext>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&ctx, &headers)?;
    let snapshot = ctx.fleet.snapshot();
    let load = ctx.fleet.load().snapshot();
    let workers: Vec<Value> = snapshot
        .engines()
        .map(|w| {
            json!({
                "id": w.id().as_str(), "url": w.url(), "model": w.model(), "role": w.role().as_str(),
                "healthy": w.is_healthy(), "in_flight": load.observe(w.id()).in_flight,
                "bootstrap_port": w.bootstrap_port(), "dp_size": w.dp_size().get(),
            })
        })
        .collect();
    Ok(Json(json!({"workers": workers})))
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
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    authorize(&ctx, &headers)?;
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
    let engine = ctx
        .fleet
        .apply(Change::Add(engine_spec(&config, &add.model)))
        .await
        .map_err(|e| invalid(&e))?;
    // The fleet's observer gave a new model its catch-all bucket (this call is then
    // a lookup); when the default policies cannot serve one, the engine does not
    // stay.
    if let Err(e) = ctx.routing.serve_new_model(&engine) {
        drop(ctx.fleet.apply(Change::Remove(engine.id().clone())).await);
        return Err(invalid(&e));
    }
    let body = json!({"id": engine.id().as_str(), "model": engine.model(), "role": engine.role().as_str(), "healthy": engine.is_healthy()});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

pub(super) async fn remove(
    State(ctx): State<Arc<AppContext>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    authorize(&ctx, &headers)?;
    ctx.fleet
        .apply(Change::Remove(id.into()))
        .await
        .map_err(|e| ApiError::admin(StatusCode::NOT_FOUND, e.to_string()))?;
    Ok(StatusCode::NO_CONTENT)
}
