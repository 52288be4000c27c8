//! `POST /v1/embeddings` in the OpenAI shape: each input tokenized (with the
//! tokenizer's special tokens) and given a deterministic vector of
//! [`DIMENSIONS`] floats made from its token ids.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use super::config::EngineRole;
use super::error::error_response;
use super::state::AppState;

/// The length of every embedding.
const DIMENSIONS: usize = 8;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
struct EmbeddingRequest {
    input: Input,
}

/// `POST /v1/embeddings`.
pub(crate) async fn embeddings(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    let visit = app.visits.arrive();
    let response = answer(&app, &body);
    visit.answered();
    response
}

fn answer(app: &AppState, body: &[u8]) -> Response {
    let request: EmbeddingRequest = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("invalid request body: {e}"),
            );
        }
    };
    if app.config.role != EngineRole::Plain {
        return error_response(
            StatusCode::BAD_REQUEST,
            "a prefill or decode engine does not serve embeddings",
        );
    }
    if let Some(status) = app.faults.draw_error() {
        return error_response(status, "simulated engine failure");
    }
    let inputs: Result<Vec<Vec<u32>>, String> = match request.input {
        Input::Text(text) => app.tokenizer.encode_text(&text).map(|ids| vec![ids]),
        Input::Ids(ids) => Ok(vec![ids]),
        Input::Texts(texts) => texts.iter().map(|t| app.tokenizer.encode_text(t)).collect(),
        Input::IdLists(lists) => Ok(lists),
    };
    let inputs = match inputs {
        Ok(inputs) if !inputs.is_empty() && inputs.iter().all(|ids| !ids.is_empty()) => inputs,
        Ok(_) => return error_response(StatusCode::BAD_REQUEST, "input must not be empty"),
        Err(e) => return error_response(StatusCode::BAD_REQUEST, e),
    };
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(
            |(index, ids)| json!({"object": "embedding", "index": index, "embedding": vector(ids)}),
        )
        .collect();
    let body = json!({
        "object": "list",
        "data": data,
        "model": app.config.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A unit-length vector that depends on every id and their order.
fn vector(ids: &[u32]) -> Vec<f64> {
    let mut state: u64 = 0xcbf2_9ce4_8422_2325;
    let mut values: Vec<f64> = (0..DIMENSIONS)
        .map(|d| {
            for &id in ids {
                state = (state ^ u64::from(id) ^ d as u64).wrapping_mul(0x0100_0000_01b3);
            }
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        })
        .collect();
    let norm = values
        .iter()
        .map(|v| v * v)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    values.iter_mut().for_each(|v| *v /= norm);
    values
}
