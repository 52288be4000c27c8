//! `GET /v1/models`: the models served, in the OpenAI list shape.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use crate::app::AppContext;

pub(super) async fn list(State(ctx): State<Arc<AppContext>>) -> Json<Value> {
    let data: Vec<Value> = ctx
        .routing
        .model_ids()
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "switchyard"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}
