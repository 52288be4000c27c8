//! One leg of a dispatch: the request sent to one engine, its response head awaited
//! and judged (what counts for and against the engine's breaker, what the client gets, what
//! may be sent to another engine), and what every protocol does to a leg's body.

use std::sync::Arc;

use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::BodyExt;
use router_fleet::Dispatched;
use router_state::Engine;
use router_upstream::{H1Body, UpstreamError};
use tokio::time::Instant;

use super::{Answer, Failed, Leg, REQUEST_ID, Refused, Retry, engine_named, ranks};
use crate::app::AppContext;
use crate::error::ApiError;
use crate::metrics::StageLabels;
use crate::retries::RetryReason;
use crate::trace::Tracing;

/// Where a leg goes: the engine, its stage (for metrics and errors), the rank named,
/// if any, and the routing headers the client gets with an engine's own refusal.
#[derive(Clone, Copy)]
pub(super) struct Target<'a> {
    pub(super) engine: &'a Engine,
    pub(super) stage: &'static str,
    pub(super) rank: Option<u32>,
    pub(super) routing: &'a HeaderMap,
}

/// Sends one leg and waits for a response head. Engine 5xx answers become 502;
/// transport failures and timeouts become 502 (504 for timeouts) and count against
/// the engine's breaker, except the first-byte timeout of an answer that is not
/// streamed (its head waits for the whole generation); an answer of any status
/// counts for it (the engine is alive: a 500 is the request's failure, which a
/// client can provoke at will); 4xx answers are the client's and are returned as
/// they are (a 404 to a request for a LoRA adapter has the engine's adapters read
/// again, in the background). A 503, and a request the engine never received, may
/// be sent to another engine.
pub(super) async fn send(
    ctx: &AppContext,
    to: Target<'_>,
    leg: Leg,
    body: Bytes,
    request_id: &HeaderValue,
    trace: &Tracing,
) -> Result<Response<H1Body>, Failed> {
    let (engine, stage) = (to.engine, to.stage);
    let origin = ctx.fleet.origin(engine).ok_or_else(|| {
        ApiError::upstream(format!(
            "{} has an invalid URL",
            engine_named(ctx, stage, engine)
        ))
    })?;
    let json = HeaderValue::from_static("application/json");
    let rank = ranks::rank_header(to.rank);
    let mut headers = vec![(header::CONTENT_TYPE, &json), (REQUEST_ID, request_id)];
    if let Some((name, value)) = &rank {
        headers.push((name.clone(), value));
    }
    let leg_trace = trace.leg(stage, engine.id().as_str());
    headers.extend(leg_trace.headers());
    ctx.fleet.begin_dispatch(engine.id());
    let sent = Instant::now();
    let result = ctx.upstream.post(&origin, leg.path, &headers, &body).await;
    ctx.metrics
        .upstream_latency
        .get_or_create(&StageLabels { stage })
        .observe(sent.elapsed().as_secs_f64());
    let answered = judge(ctx, to, leg, result);
    if let (Some(span), Err(failed)) = (&leg_trace.span, &answered) {
        span.fail(failed.message());
    }
    answered
}

/// What a leg's outcome is for the client, the breaker and a retry.
fn judge(
    ctx: &AppContext,
    to: Target<'_>,
    leg: Leg,
    result: Result<Response<H1Body>, UpstreamError>,
) -> Result<Response<H1Body>, Failed> {
    let Target { engine, stage, .. } = to;
    let retry = |reason| {
        Some(Retry {
            reason,
            engine: engine.id().clone(),
        })
    };
    let response = match result {
        Ok(response) => response,
        Err(e) => return Err(transport_failure(ctx, to, leg, e)),
    };
    ctx.fleet.record_dispatch(engine.id(), Dispatched::Answered);
    let status = response.status();
    if status.is_server_error() {
        return Err(Failed {
            answer: Answer::Error(ApiError::upstream(format!(
                "{} failed with status {status}",
                engine_named(ctx, stage, engine),
            ))),
            retry: if status == StatusCode::SERVICE_UNAVAILABLE {
                retry(RetryReason::Status503)
            } else {
                None
            },
        });
    }
    if status == StatusCode::NOT_FOUND && leg.adapter {
        // The engine may have unloaded the adapter since its list was read.
        let (fleet, engine) = (Arc::clone(&ctx.fleet), engine.clone());
        tokio::spawn(async move { fleet.refresh_adapters(&engine).await });
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        // Overloaded, not faulty: another engine may take the request, else the
        // engine's answer is relayed as it is.
        return Err(Failed {
            answer: Answer::Engine(Box::new(Refused {
                response,
                headers: to.routing.clone(),
            })),
            retry: retry(RetryReason::Status429),
        });
    }
    Ok(response)
}

/// A leg that got no response head: a timeout is a 504, anything else a 502; one
/// the engine never received may be sent to another engine.
fn transport_failure(ctx: &AppContext, to: Target<'_>, leg: Leg, e: UpstreamError) -> Failed {
    let Target { engine, stage, .. } = to;
    // A whole answer's head comes only after the generation: its first-byte timeout
    // is a long generation, not an engine fault.
    let long_generation = matches!(e, UpstreamError::NoHead) && !leg.stream;
    if !long_generation {
        ctx.fleet
            .record_dispatch(engine.id(), Dispatched::Unanswered);
    }
    let message = format!("{}: {}", engine_named(ctx, stage, engine), e.describe());
    let reason = match &e {
        UpstreamError::NotWritten(_) => Some(RetryReason::NotWritten),
        e if e.never_sent() => Some(RetryReason::ConnectFailed),
        _ => None,
    };
    Failed {
        answer: Answer::Error(match e {
            UpstreamError::Timeout(_) | UpstreamError::ConnectTimeout | UpstreamError::NoHead => {
                ApiError::timeout(message)
            }
            _ => ApiError::upstream(message),
        }),
        retry: reason.map(|reason| Retry {
            reason,
            engine: engine.id().clone(),
        }),
    }
}

/// Reads a leg's body to its end, keeping none of it; the PD prefill leg must run to
/// completion for the KV hand-over, so it is driven alongside the decode stream.
pub(super) async fn drain(response: Response<H1Body>) -> Result<(), String> {
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        frame.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The body (a JSON object, as validated) with `fields` (`"key":value` pairs) appended
/// to its top level: later keys win over any the client sent.
pub(crate) fn with_fields(body: &Bytes, fields: &str) -> Bytes {
    let trimmed = body.trim_ascii_end();
    let object = trimmed.strip_suffix(b"}").unwrap_or(trimmed);
    let empty = object.trim_ascii_end().ends_with(b"{");
    let mut out = BytesMut::with_capacity(object.len() + fields.len() + 2);
    out.extend_from_slice(object);
    if !empty {
        out.extend_from_slice(b",");
    }
    out.extend_from_slice(fields.as_bytes());
    out.extend_from_slice(b"}");
    out.freeze()
}
