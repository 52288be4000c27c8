//! `POST /v1/chat/completions` and `POST /v1/completions` in the exact OpenAI shapes,
//! and SGLang's native `POST /generate`, JSON and SSE: a request is read and checked
//! (`request`), meets the faults, starts on the engine after its hand-over, and is
//! answered whole (`generation`) or streamed (`stream`).

mod generation;
mod request;
mod stream;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use self::generation::{Generation, json_response};
use self::request::{Ask, Shape};
use self::stream::stream_response;
use super::config::{EngineRole, PdProtocol};
use super::error::ApiError;
use super::nixl;
use super::placement::start_run;
use super::state::AppState;
use crate::engine::Run;

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    respond(app, &headers, &body, Shape::Chat).await
}

/// `POST /v1/completions`.
pub(crate) async fn completions(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    respond(app, &headers, &body, Shape::Text).await
}

/// `POST /generate`.
pub(crate) async fn generate(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    respond(app, &headers, &body, Shape::Generate).await
}

async fn respond(app: Arc<AppState>, headers: &HeaderMap, body: &[u8], shape: Shape) -> Response {
    let visit = app.visits.arrive();
    match answer(app, headers, body, shape).await {
        Answer::Whole(response) => {
            visit.answered();
            response
        }
        Answer::Stream(generation, include_usage) => {
            stream_response(*generation, include_usage, visit)
        }
    }
}

/// A chat request's answer: whole, or a generation to stream.
enum Answer {
    Whole(Response),
    Stream(Box<Generation>, bool),
}

async fn answer(app: Arc<AppState>, headers: &HeaderMap, body: &[u8], shape: Shape) -> Answer {
    let (ask, run, handed_cached) = match begin(&app, headers, body, shape).await {
        Ok(begun) => begun,
        Err(error) => return Answer::Whole(error.into_response()),
    };
    let generation =
        Generation::new(Arc::clone(&app), &ask, run, shape).with_handed_cached(handed_cached);
    if ask.stream() {
        let include_usage = shape != Shape::Generate && ask.include_usage();
        Answer::Stream(Box::new(generation), include_usage)
    } else {
        let response = json_response(generation).await;
        app.faults.hold_whole().await;
        Answer::Whole(response)
    }
}

/// Reads and checks a request, remembers it, lets the faults act, and starts it on
/// the engine; with it, the prompt tokens a decode engine's room says the prefill
/// engine found cached.
async fn begin(
    app: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    shape: Shape,
) -> Result<(Ask, Run, u64), ApiError> {
    let ask = Ask::read(&app.config, headers, body, shape)?;
    app.remember(ask.record(headers));
    poisoned(app, body)?;
    meet_faults(app).await?;
    let tokens = ask.tokens(&app.tokenizer)?;
    let (run, handed_cached) = start_after_handover(app, &ask, tokens).await?;
    Ok((ask, run, handed_cached))
}

/// A 500 for a body that holds the `error_on` text.
fn poisoned(app: &AppState, body: &[u8]) -> Result<(), ApiError> {
    let marker = app.faults.current().error_on;
    match marker {
        Some(marker)
            if !marker.is_empty() && body.windows(marker.len()).any(|w| w == marker.as_bytes()) =>
        {
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "simulated failure on this input",
            ))
        }
        _ => Ok(()),
    }
}

/// The faults a request meets before its answer begins: the hold, a slow start, a
/// hang, and an error drawn.
async fn meet_faults(app: &AppState) -> Result<(), ApiError> {
    app.faults.hold(0).await;
    let faults = app.faults.current();
    if faults.slow_start_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.slow_start_ms)).await;
    }
    if faults.hang_before_first_byte {
        std::future::pending::<()>().await;
    }
    match app.faults.draw_error() {
        Some(status) => Err(ApiError::new(status, "simulated engine failure")),
        None => Ok(()),
    }
}

/// Starts the request on the engine once its hand-over allows: vLLM's through
/// `kv_transfer_params`, SGLang's through a bootstrap room (`placement`), whose
/// prefill engine's cached tokens come with it.
async fn start_after_handover(
    app: &AppState,
    ask: &Ask,
    tokens: Vec<u32>,
) -> Result<(Run, u64), ApiError> {
    let adapter = ask.adapter.clone();
    if app.config.pd_protocol != PdProtocol::Vllm {
        return start_run(app, &ask.bootstrap, ask.pinned, adapter, tokens).await;
    }
    let handover = match app.config.role {
        EngineRole::Prefill => {
            nixl::check_prefill(ask.kv_transfer_params(), ask.stream(), ask.limit)
        }
        EngineRole::Decode => match ask.kv_transfer_params() {
            Some(params) => nixl::receive(app, params).await,
            // No hand-over: the decode engine computes the prompt itself.
            None => Ok(()),
        },
        EngineRole::Plain => Ok(()),
    };
    handover.map_err(ApiError::bad_request)?;
    let run = app
        .engine
        .start_for(tokens, ask.pinned.map(u64::from), adapter);
    Ok((run, 0))
}
