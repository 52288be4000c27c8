//! Where a request runs on the simulated engine: the LoRA adapter it names, the
//! fields a batch gives one value a prompt, and the rank it starts on, a decode
//! engine first taking its prompt from the prefill engine's bootstrap room.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;

use super::bootstrap::fetch_room;
use super::config::{EngineRole, SimConfig};
use super::error::ApiError;
use super::state::AppState;
use crate::engine::Run;

/// A field of a request that may be a batch (bootstrap fields, `/generate`'s
/// `sampling_params`): one value, or a batch's list with one value a prompt.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum PerPrompt<T> {
    One(T),
    List(Vec<T>),
}

impl<T: Clone> PerPrompt<T> {
    /// The value of the request's one prompt: a single value, or a list of one when
    /// the prompt is a batch of one (SGLang reads a batch's fields item by item).
    pub(crate) fn of(field: Option<&Self>, batch: bool, name: &str) -> Result<Option<T>, String> {
        match (field, batch) {
            (None, _) => Ok(None),
            (Some(Self::One(v)), false) => Ok(Some(v.clone())),
            (Some(Self::List(list)), true) if list.len() == 1 => Ok(list.first().cloned()),
            (Some(Self::One(_)), true) => {
                Err(format!("{name} must be a list, one a prompt, for a batch"))
            }
            (Some(Self::List(_)), _) => {
                Err(format!("{name} must hold one value a prompt of the batch"))
            }
        }
    }
}

/// The LoRA adapter a request names: `model` as an adapter's name (vLLM) or as
/// `model:adapter` (SGLang), else `/generate`'s `lora_path` (a batch's first).
///
/// # Errors
/// An adapter the engine does not serve, for a 404.
pub(crate) fn adapter_of(
    config: &SimConfig,
    model: Option<&str>,
    lora_path: Option<&Value>,
) -> Result<Option<Arc<str>>, String> {
    let named = match (model, lora_path) {
        (Some(model), _) if config.lora_adapters.iter().any(|a| a == model) => Some(model),
        (Some(model), _)
            if model
                .split_once(':')
                .is_some_and(|(base, _)| base == config.model) =>
        {
            model.split_once(':').map(|(_, adapter)| adapter)
        }
        (_, Some(Value::String(path))) => Some(path.as_str()),
        (_, Some(Value::Array(paths))) => paths.first().and_then(Value::as_str),
        _ => None,
    };
    match named {
        None => Ok(None),
        Some(name) if config.lora_adapters.iter().any(|a| a == name) => Ok(Some(Arc::from(name))),
        Some(name) => Err(format!("the adapter {name} is not loaded")),
    }
}

/// A prompt in a list form (texts, or lists of ids): a batch, even of one.
pub(crate) fn is_batch(prompt: &Value) -> bool {
    prompt
        .as_array()
        .and_then(|items| items.first())
        .is_some_and(|first| first.is_string() || first.is_array())
}

/// The bootstrap fields of the request's one prompt.
pub(crate) struct Rendezvous {
    pub(crate) host: Option<String>,
    pub(crate) port: Option<u16>,
    pub(crate) room: Option<u64>,
}

/// Registers the request on its rank (the pinned one, else: a PD engine's follows
/// the bootstrap room, a plain engine's rotates); a decode engine first waits for its
/// room, which must have been prefilled on the rank the room points at (SGLang's
/// `follow_bootstrap_room`: room mod the prefill engine's ranks). Returns the run and
/// the prompt tokens its room says the prefill engine found cached (0 but for a
/// decode engine).
pub(crate) async fn start_run(
    app: &AppState,
    bootstrap: &Rendezvous,
    pinned: Option<u32>,
    adapter: Option<Arc<str>>,
    tokens: Vec<u32>,
) -> Result<(Run, u64), ApiError> {
    let bad = ApiError::bad_request;
    let pinned = pinned.map(u64::from);
    match app.config.role {
        EngineRole::Plain => Ok((app.engine.start_for(tokens, pinned, adapter), 0)),
        EngineRole::Prefill => {
            let room = bootstrap
                .room
                .ok_or_else(|| bad("a prefill engine needs bootstrap_room"))?;
            let run = app.engine.start_for(tokens, pinned.or(Some(room)), adapter);
            Ok((run, 0))
        }
        EngineRole::Decode => {
            let (Some(host), Some(port), Some(room)) =
                (&bootstrap.host, bootstrap.port, bootstrap.room)
            else {
                return Err(bad(
                    "a decode engine needs bootstrap_host, bootstrap_port and bootstrap_room",
                ));
            };
            let timeout = Duration::from_millis(app.config.bootstrap_timeout_ms);
            let failed = |e: String| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("KV transfer failed: {e}"),
                )
            };
            let info = fetch_room(&app.client, host, port, room, timeout)
                .await
                .map_err(failed)?;
            if let Some(refusal) = info.refusal(app.config.page_size, &app.config.transfer_backend)
            {
                return Err(failed(refusal));
            }
            let expected = room % u64::from(info.dp_size.max(1));
            if u64::from(info.rank) != expected {
                return Err(failed(format!(
                    "bootstrap room {room} was prefilled on rank {}, but the room points at rank {expected}",
                    info.rank
                )));
            }
            let run = app.engine.start_for(tokens, pinned.or(Some(room)), adapter);
            Ok((run, info.cached_tokens))
        }
    }
}
