//! One request through the gateway, one gRPC stream: its headers and body read
//! (bounded, within the client body timeout), routed as the proxy routes a request,
//! the engine named (or the router's error answered in the gateway's stead), and
//! the answer followed as the gateway streams it: its head, each chunk sent back
//! as it came, its end. The engine's slot is held from the pick until the answer
//! ends, the stream breaks (the client went away, or the gateway gave up) or the
//! gateway falls silent past the timeouts.

use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse;
use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Status, Streaming};

use super::super::MAX_BODY_BYTES;
use super::super::chat::respond;
use super::{Gateway, wire};
use crate::app::AppContext;
use crate::budget::Charge;
use crate::dispatch::gateway::Named;
use crate::error::ApiError;
use crate::prepare::{CHAT, COMPLETIONS, EMBEDDINGS, Endpoint, GENERATE};
use crate::relay::Ending;

/// Where a stream's responses go.
pub(super) type Sender = mpsc::Sender<Result<ProcessingResponse, Status>>;

/// How a stream ended, for `switchyard_picker_streams_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The engine was named and its answer followed to its end.
    Routed,
    /// The router answered in the gateway's stead (an error).
    Answered,
    /// The gateway closed the stream first (the client went away, or it gave up).
    Cancelled,
    /// The gateway sent nothing within the timeouts.
    Timeout,
    /// The gateway broke the protocol.
    Invalid,
}

impl Outcome {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Outcome::Routed => "routed",
            Outcome::Answered => "answered",
            Outcome::Cancelled => "cancelled",
            Outcome::Timeout => "timeout",
            Outcome::Invalid => "invalid",
        }
    }
}

/// The gateway's next message within `limit`; `Err` ends the stream with that outcome.
async fn next(
    inbound: &mut Streaming<ProcessingRequest>,
    limit: Duration,
) -> Result<Request, Outcome> {
    match tokio::time::timeout(limit, inbound.message()).await {
        Err(_) => Err(Outcome::Timeout),
        Ok(Ok(Some(message))) => message.request.ok_or(Outcome::Invalid),
        Ok(Ok(None) | Err(_)) => Err(Outcome::Cancelled),
    }
}

/// Sends `message`; `Err` when the gateway has closed the stream.
async fn send(sender: &Sender, message: ProcessingResponse) -> Result<(), Outcome> {
    sender
        .send(Ok(message))
        .await
        .map_err(|_| Outcome::Cancelled)
}

/// The routed endpoint a request's method and path name.
fn endpoint(method: &str, path: &str) -> Option<&'static Endpoint> {
    let path = path.split_once('?').map_or(path, |(path, _)| path);
    if method != "POST" {
        return None;
    }
    [&CHAT, &COMPLETIONS, &EMBEDDINGS, &GENERATE]
        .into_iter()
        .find(|endpoint| endpoint.path == path)
}

/// Runs one stream to its end; see the module documentation.
pub(super) async fn exchange(
    ctx: Arc<AppContext>,
    mut inbound: Streaming<ProcessingRequest>,
    sender: Sender,
) -> Outcome {
    match run(&ctx, &mut inbound, &sender).await {
        Ok(outcome) | Err(outcome) => {
            let status = match outcome {
                Outcome::Invalid => Some(Status::invalid_argument(
                    "the endpoint picker expects the request's headers, then its body (FULL_DUPLEX_STREAMED), then the answer's",
                )),
                Outcome::Timeout => Some(Status::deadline_exceeded(
                    "the gateway sent nothing within the router's timeouts",
                )),
                _ => None,
            };
            if let Some(status) = status {
                drop(sender.try_send(Err(status)));
            }
            outcome
        }
    }
}

async fn run(
    ctx: &Arc<AppContext>,
    inbound: &mut Streaming<ProcessingRequest>,
    sender: &Sender,
) -> Result<Outcome, Outcome> {
    let started = Instant::now();
    let limit = ctx.client_body_timeout;
    let first = tokio::time::timeout(limit, inbound.message()).await;
    let first = match first {
        Err(_) => return Err(Outcome::Timeout),
        Ok(Ok(Some(first))) => first,
        Ok(Ok(None) | Err(_)) => return Err(Outcome::Cancelled),
    };
    let Some(Request::RequestHeaders(headers)) = &first.request else {
        return Err(Outcome::Invalid);
    };
    let head = wire::head(headers.headers.as_ref());
    let subset = wire::subset(first.metadata_context.as_ref());
    let mut body = Err(ApiError::bad_body("the request has no body"));
    // The body's charge is held until the engine is named.
    let mut charge = Charge::default();
    if !headers.end_of_stream {
        let remaining = limit.saturating_sub(started.elapsed());
        body = read_body(ctx, inbound, sender, remaining, &mut charge).await?;
    }
    let Some(endpoint) = endpoint(&head.method, &head.path) else {
        let error = ApiError::unknown_endpoint(&head.method, &head.path);
        return answer(sender, error.into_response()).await;
    };
    let gateway = match subset {
        Ok(subset) => Gateway { subset },
        Err(problem) => {
            tracing::warn!(%problem, "a gateway's subset hint refused");
            let error = ApiError::bad_body(problem);
            return answer(sender, error.into_response()).await;
        }
    };
    let routed = respond(endpoint, Arc::clone(ctx), head.headers, body, &gateway);
    let named = tokio::select! {
        named = routed => named,
        // Nothing comes between the body's end and the picker's answer but the
        // stream's end: the client went away while the request was routed.
        _ = inbound.message() => return Err(Outcome::Cancelled),
    };
    drop(charge);
    let named = match named {
        Ok(named) => named,
        Err(error) => return answer(sender, error).await,
    };
    follow(ctx, inbound, sender, named).await
}

/// Reads the request's body to its end within `limit`, [`MAX_BODY_BYTES`] and the
/// body budget; the router's errors of it are the request's answer.
async fn read_body(
    ctx: &AppContext,
    inbound: &mut Streaming<ProcessingRequest>,
    sender: &Sender,
    limit: Duration,
    charge: &mut Charge,
) -> Result<Result<Bytes, ApiError>, Outcome> {
    let deadline = Instant::now() + limit;
    let mut read = BytesMut::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = match next(inbound, left).await {
            Ok(message) => message,
            Err(Outcome::Timeout) => return Ok(Err(ApiError::body_timeout(limit))),
            Err(outcome) => return Err(outcome),
        };
        let (chunk, end) = match message {
            Request::RequestBody(body) => (body.body, body.end_of_stream),
            Request::RequestTrailers(_) => {
                send(sender, wire::trailers(true)).await?;
                (Vec::new(), true)
            }
            _ => return Err(Outcome::Invalid),
        };
        if read.len() + chunk.len() > MAX_BODY_BYTES {
            return Ok(Err(ApiError::too_large(MAX_BODY_BYTES)));
        }
        if !ctx.body_budget.charge(charge, chunk.len()) {
            tracing::warn!(
                bytes = chunk.len(),
                "request body refused: the memory for request bodies (limits.body_memory_bytes) is spent"
            );
            return Ok(Err(ApiError::overloaded(
                "the router's memory for request bodies is spent; retry shortly",
            )));
        }
        read.extend_from_slice(&chunk);
        if end {
            return Ok(Ok(read.freeze()));
        }
    }
}

/// Answers the request in the gateway's stead with `response`, a router's error.
async fn answer(sender: &Sender, response: axum::response::Response) -> Result<Outcome, Outcome> {
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    send(sender, wire::immediate(parts, body)).await?;
    Ok(Outcome::Answered)
}

/// Names the engine, sends the body, and follows the answer to its end.
async fn follow(
    ctx: &AppContext,
    inbound: &mut Streaming<ProcessingRequest>,
    sender: &Sender,
    named: Named,
) -> Result<Outcome, Outcome> {
    let Named {
        address,
        request_headers,
        body,
        answer_headers,
        record,
        mut tally,
    } = named;
    send(
        sender,
        wire::destination(address, &request_headers, body.len()),
    )
    .await?;
    for chunk in wire::body_chunks(&body, true, true) {
        send(sender, chunk).await?;
    }
    drop(body);
    let mut record = record;
    let mut status = 0;
    let mut limit = ctx.upstream.first_byte_timeout();
    loop {
        let message = match next(inbound, limit).await {
            Ok(message) => message,
            Err(Outcome::Timeout) => {
                tally.finish(Ending::Failed, "upstream_timeout");
                return Err(Outcome::Timeout);
            }
            // Dropped unfinished, the tally counts the client gone.
            Err(outcome) => return Err(outcome),
        };
        limit = ctx.idle_timeout;
        match message {
            Request::ResponseHeaders(headers) => {
                status = wire::head(headers.headers.as_ref()).status.unwrap_or(0);
                tally.answered(record.take(), status);
                send(sender, wire::answer_headers(&answer_headers)).await?;
                if headers.end_of_stream {
                    tally.finish(ended(status), code(status));
                    return Ok(Outcome::Routed);
                }
            }
            Request::ResponseBody(chunk) => {
                let end = chunk.end_of_stream;
                let data = Bytes::from(chunk.body);
                if !data.is_empty() {
                    tally.data(&data);
                }
                send(sender, wire::body_response(Vec::from(data), false, end)).await?;
                if end {
                    tally.finish(ended(status), code(status));
                    return Ok(Outcome::Routed);
                }
            }
            Request::ResponseTrailers(_) => {
                send(sender, wire::trailers(false)).await?;
                tally.finish(ended(status), code(status));
                return Ok(Outcome::Routed);
            }
            _ => return Err(Outcome::Invalid),
        }
    }
}

/// How an answer of `status` ends: an engine's (or the gateway's) server error
/// fails the request.
fn ended(status: u16) -> Ending {
    if status >= 500 {
        Ending::Failed
    } else {
        Ending::Done
    }
}

fn code(status: u16) -> &'static str {
    if status >= 500 {
        "upstream_error"
    } else {
        "ok"
    }
}
