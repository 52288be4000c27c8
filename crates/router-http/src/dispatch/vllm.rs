//! vLLM's prefill/decode hand-over (its NIXL connector, driven as vLLM's own proxy
//! drives it): the prefill leg first, for one token, not streamed, with
//! `kv_transfer_params` asking for a remote decode; the `kv_transfer_params` of its
//! answer, copied byte for byte, then go with the client's own body to the decode
//! leg, whose answer the client gets. A prefill that fails never reaches the decode
//! engine; a client that leaves while the prefill computes closes its connection,
//! which is how vLLM learns to abort it.

use std::fmt;
use std::sync::Arc;

use axum::response::Response;
use bytes::Bytes;
use http::HeaderValue;
use http_body_util::{BodyExt, Limited};
use router_policy::Pick;
use router_state::Engine;
use router_upstream::H1Body;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::leg::{Target, send, with_fields};
use super::{Answering, Failed, Leg, Outgoing, Pair, engine_named, relay};
use crate::app::AppContext;
use crate::error::ApiError;
use crate::prepare::rewrite;

/// The largest prefill answer read: one generated token and its metadata.
const MAX_PREFILL_ANSWER_BYTES: usize = 4 << 20;

/// What the prefill leg is told: compute the prompt and hold its KV for a remote
/// decode.
const REMOTE_DECODE: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

/// Fields of the client's body the prefill leg does without: it is not streamed
/// (vLLM refuses `stream_options` then) and generates one token (a minimum above one
/// would contradict it).
const DROPPED: [&str; 7] = [
    "kv_transfer_params",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "min_completion_tokens",
];

/// Sends the prefill leg, then the decode leg with the prefill's `kv_transfer_params`;
/// a leg to an engine of several ranks names its rank in vLLM's header.
pub(super) async fn dispatch(
    ctx: &Arc<AppContext>,
    bucket: HeaderValue,
    prefill: Pick,
    decode: Pick,
    out: &Outgoing,
) -> Result<Response, Failed> {
    if out.batch.is_some_and(|n| n > 1) {
        return Err(ApiError::invalid(
            "invalid_prompt",
            "prompt",
            "vLLM prefill/decode engines take one prompt a request",
        )
        .into());
    }
    let Pair {
        prefill,
        decode,
        prefill_rank,
        decode_rank,
        guards,
        headers,
    } = Pair::new(ctx, bucket, prefill, decode);
    let to = Target {
        engine: &prefill,
        stage: "prefill",
        rank: prefill_rank,
        routing: &headers,
    };
    let answer = match prefill_leg(ctx, to, out).await? {
        Prefilled::Answer(answer) => answer,
        // The client's own error (say, a prompt past the model's context).
        Prefilled::Refused(refused) => {
            let nobody = Answering::default();
            return Ok(relay(ctx, *refused, None, headers, out, guards, nobody));
        }
    };
    let params = transfer_params(&answer).map_err(|e| prefill_failed(ctx, &prefill, &e))?;
    // No hand-over (the prefill did not finish length-capped): the decode engine
    // computes the prompt itself, as vLLM's proxy lets it; params the client sent
    // never reach it (they would point its transfer anywhere).
    let params = params.unwrap_or("null");
    let body = with_fields(&out.body, &format!(r#""kv_transfer_params":{params}"#));
    let to = Target {
        engine: &decode,
        stage: "decode",
        rank: decode_rank,
        routing: &headers,
    };
    // The prefill holds the request's KV blocks for this decode: a decode that fails
    // is not retried (a retry would prefill again, elsewhere, while they stay held).
    let response = send(ctx, to, out.leg, body, &out.request_id, &out.trace)
        .await
        .map_err(|failed| Failed {
            retry: None,
            ..failed
        })?;
    // vLLM's decode engine reports the KV it was sent as cached, not what the prefill
    // engine found: its answer is not compared with the prefill pick's prediction.
    let answering = Answering {
        generating: Some(&decode),
        predicted: None,
    };
    Ok(relay(ctx, response, None, headers, out, guards, answering))
}

/// What the prefill leg gave.
enum Prefilled {
    /// Its whole answer.
    Answer(Bytes),
    /// Its refusal, relayed to the client as it is.
    Refused(Box<Response<H1Body>>),
}

/// The prefill leg, whole and not streamed.
async fn prefill_leg(
    ctx: &AppContext,
    to: Target<'_>,
    out: &Outgoing,
) -> Result<Prefilled, Failed> {
    let whole = Leg {
        stream: false,
        ..out.leg
    };
    let body = prefill_body(&out.body)?;
    let answer = send(ctx, to, whole, body, &out.request_id, &out.trace).await?;
    if !answer.status().is_success() {
        return Ok(Prefilled::Refused(Box::new(answer)));
    }
    let read = Limited::new(answer.into_body(), MAX_PREFILL_ANSWER_BYTES).collect();
    match tokio::time::timeout(ctx.idle_timeout, read).await {
        Ok(Ok(body)) => Ok(Prefilled::Answer(body.to_bytes())),
        Ok(Err(e)) => Err(prefill_failed(
            ctx,
            to.engine,
            &format_args!("its answer could not be read: {e}"),
        )
        .into()),
        Err(_) => Err(prefill_failed(ctx, to.engine, &"its answer stopped arriving").into()),
    }
}

/// The client's error when the prefill engine's answer is of no use.
fn prefill_failed(ctx: &AppContext, engine: &Engine, what: &dyn fmt::Display) -> ApiError {
    ApiError::upstream(format!("{}: {what}", engine_named(ctx, "prefill", engine)))
}

/// The prefill leg's body: the client's, without [`DROPPED`], then asking for a
/// remote decode of one token, not streamed (`max_completion_tokens` only when the
/// client sent it, as vLLM's proxy does).
fn prefill_body(body: &Bytes) -> Result<Bytes, ApiError> {
    let mut completion_budget = false;
    let kept = rewrite(body, |key| {
        completion_budget |= key == "max_completion_tokens";
        !DROPPED.contains(&key)
    })?;
    let mut fields =
        format!(r#""kv_transfer_params":{REMOTE_DECODE},"stream":false,"max_tokens":1"#);
    if completion_budget {
        fields.push_str(r#","max_completion_tokens":1"#);
    }
    Ok(with_fields(&Bytes::from(kept), &fields))
}

/// The `kv_transfer_params` of a prefill's answer, as sent; `None` when absent or
/// null.
fn transfer_params(answer: &[u8]) -> Result<Option<&str>, String> {
    #[derive(Deserialize)]
    struct Answer<'a> {
        #[serde(default, borrow)]
        kv_transfer_params: Option<&'a RawValue>,
    }
    let answer: Answer<'_> = serde_json::from_slice(answer)
        .map_err(|e| format!("its answer is not a JSON object: {e}"))?;
    Ok(answer
        .kv_transfer_params
        .map(RawValue::get)
        .filter(|params| *params != "null"))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn the_prefill_leg_asks_for_a_remote_decode_of_one_token_not_streamed() {
        let body = Bytes::from(
            json!({
                "model": "m", "messages": [{"role": "user", "content": "hi \"there\""}],
                "stream": true, "stream_options": {"include_usage": true},
                "max_tokens": 50, "max_completion_tokens": 60, "min_tokens": 5,
                "kv_transfer_params": {"do_remote_prefill": true}, "temperature": 0.5,
                "esc\u{e9}ped": 1
            })
            .to_string(),
        );
        let sent: Value = serde_json::from_slice(&prefill_body(&body).unwrap()).unwrap();
        assert_eq!(
            sent,
            json!({
                "model": "m", "messages": [{"role": "user", "content": "hi \"there\""}],
                "temperature": 0.5, "esc\u{e9}ped": 1,
                "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
                    "remote_engine_id": null, "remote_block_ids": null,
                    "remote_host": null, "remote_port": null},
                "stream": false, "max_tokens": 1, "max_completion_tokens": 1,
            })
        );
        let plain = Bytes::from_static(br#"{"model":"m","prompt":"x"}"#);
        let sent: Value = serde_json::from_slice(&prefill_body(&plain).unwrap()).unwrap();
        assert_eq!(sent["max_tokens"], 1);
        assert!(
            sent.get("max_completion_tokens").is_none(),
            "only when the client sent it"
        );
    }

    #[test]
    fn the_prefills_transfer_params_are_taken_as_sent() {
        let answer = br#"{"id":"x","kv_transfer_params":{"remote_block_ids":[[1, 2]],"tp_size":1},"choices":[]}"#;
        assert_eq!(
            transfer_params(answer).unwrap(),
            Some(r#"{"remote_block_ids":[[1, 2]],"tp_size":1}"#)
        );
        assert_eq!(
            transfer_params(br#"{"kv_transfer_params":null}"#).unwrap(),
            None
        );
        assert_eq!(transfer_params(b"{}").unwrap(), None);
        assert!(transfer_params(b"not json").is_err());
    }
}
