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
use crate::relay::{Ending, Tally};

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
async fn next_message(
    inbound: &mut Streaming<ProcessingRequest>,
    limit: Duration,
) -> Result<ProcessingRequest, Outcome> {
    match tokio::time::timeout(limit, inbound.message()).await {
        Err(_) => Err(Outcome::Timeout),
        Ok(Ok(Some(message))) => Ok(message),
        Ok(Ok(None)) => Err(Outcome::Cancelled),
        Ok(Err(status)) => Err(broken(&status)),
    }
}

/// What the gateway's next message within `limit` carries.
async fn next(
    inbound: &mut Streaming<ProcessingRequest>,
    limit: Duration,
) -> Result<Request, Outcome> {
    next_message(inbound, limit)
        .await?
        .request
        .ok_or(Outcome::Invalid)
}

/// How a stream the gateway's side broke ends: a message the picker refused to
/// decode (too large, malformed) is the gateway's fault; anything else (a reset) is
/// the request gone.
fn broken(status: &Status) -> Outcome {
    match status.code() {
        tonic::Code::OutOfRange
        | tonic::Code::ResourceExhausted
        | tonic::Code::InvalidArgument
        | tonic::Code::Internal => Outcome::Invalid,
        _ => Outcome::Cancelled,
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

impl Outcome {
    /// Whether the stream ended as the protocol has it end: every message answered.
    /// Any other end must reach the gateway as an error status, never as a stream
    /// closed with OK, which Envoy takes as "processing complete" and sends the
    /// request on unprocessed.
    pub(super) fn is_complete(self) -> bool {
        matches!(self, Outcome::Routed | Outcome::Answered)
    }

    /// The status the stream ends with, for an end that is not complete.
    pub(super) fn status(self) -> Status {
        match self {
            Outcome::Invalid => Status::invalid_argument(
                "the endpoint picker expects the request's headers, then its body (FULL_DUPLEX_STREAMED), then the answer's",
            ),
            Outcome::Timeout => {
                Status::deadline_exceeded("the gateway sent nothing within the router's timeouts")
            }
            Outcome::Routed | Outcome::Answered | Outcome::Cancelled => {
                Status::aborted("the endpoint picker ended the request's processing")
            }
        }
    }
}

/// Runs one stream to its end; see the module documentation.
pub(super) async fn exchange(
    ctx: Arc<AppContext>,
    mut inbound: Streaming<ProcessingRequest>,
    sender: Sender,
) -> Outcome {
    match run(&ctx, &mut inbound, &sender).await {
        Ok(outcome) | Err(outcome) => outcome,
    }
}

async fn run(
    ctx: &Arc<AppContext>,
    inbound: &mut Streaming<ProcessingRequest>,
    sender: &Sender,
) -> Result<Outcome, Outcome> {
    let started = Instant::now();
    let limit = ctx.client_body_timeout;
    let first = next_message(inbound, limit).await?;
    let Some(Request::RequestHeaders(headers)) = &first.request else {
        return Err(Outcome::Invalid);
    };
    let head = wire::head(headers.headers.as_ref());
    // Answered before the body is read: nothing of it would be used.
    let Some(endpoint) = endpoint(&head.method, &head.path) else {
        let error = ApiError::unknown_endpoint(&head.method, &head.path);
        return answer(sender, error.into_response()).await;
    };
    let gateway = match wire::subset(first.metadata_context.as_ref()) {
        Ok(subset) => Gateway { subset },
        Err(problem) => {
            tracing::warn!(%problem, "a gateway's subset hint refused");
            let error = ApiError::internal(format!("the gateway's subset hint: {problem}"));
            return answer(sender, error.into_response()).await;
        }
    };
    let mut read = Read {
        body: Err(ApiError::bad_body("the request has no body")),
        trailers: false,
    };
    // The body's charge is held until the engine is named.
    let mut charge = Charge::default();
    if !headers.end_of_stream {
        let remaining = limit.saturating_sub(started.elapsed());
        read = read_body(ctx, inbound, remaining, &mut charge).await?;
    }
    let routed = respond(endpoint, Arc::clone(ctx), head.headers, read.body, &gateway);
    let named = tokio::select! {
        // A request answered at once (a refused body) is answered, whatever came.
        biased;
        named = routed => named,
        // Nothing but the stream's end comes between the body's end and the
        // picker's answer (the client went away while the request was routed);
        // what is left of a body refused before its end is read and dropped.
        outcome = gone(inbound) => return Err(outcome),
    };
    drop(charge);
    let named = match named {
        Ok(named) => named,
        Err(error) => return answer(sender, error).await,
    };
    follow(ctx, inbound, sender, named, read.trailers).await
}

/// Waits for the stream to end while the request is routed: how it ended. What is
/// left of a body refused before its end is read and dropped; any other message is
/// the gateway breaking the protocol (nothing else may come before the picker's
/// answer).
async fn gone(inbound: &mut Streaming<ProcessingRequest>) -> Outcome {
    loop {
        match inbound.message().await {
            Ok(Some(ProcessingRequest {
                request: Some(Request::RequestBody(_) | Request::RequestTrailers(_)),
                ..
            })) => {}
            Ok(Some(_)) => return Outcome::Invalid,
            Ok(None) => return Outcome::Cancelled,
            Err(status) => return broken(&status),
        }
    }
}

/// A request's body as read, and whether trailers ended it.
struct Read {
    body: Result<Bytes, ApiError>,
    trailers: bool,
}

/// Reads the request's body to its end within `limit`, [`MAX_BODY_BYTES`] and the
/// body budget; the router's errors of it are the request's answer.
async fn read_body(
    ctx: &AppContext,
    inbound: &mut Streaming<ProcessingRequest>,
    limit: Duration,
    charge: &mut Charge,
) -> Result<Read, Outcome> {
    let deadline = Instant::now() + limit;
    let mut read = BytesMut::new();
    let refused = |error| {
        Ok(Read {
            body: Err(error),
            trailers: false,
        })
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = match next(inbound, left).await {
            Ok(message) => message,
            Err(Outcome::Timeout) => {
                return refused(ApiError::body_timeout(ctx.client_body_timeout));
            }
            Err(outcome) => return Err(outcome),
        };
        // Trailers end the body; they are answered after it is sent on.
        let (chunk, end, trailers) = match message {
            Request::RequestBody(body) => (body.body, body.end_of_stream, false),
            Request::RequestTrailers(_) => (Vec::new(), true, true),
            _ => return Err(Outcome::Invalid),
        };
        if read.len() + chunk.len() > MAX_BODY_BYTES {
            return refused(ApiError::too_large(MAX_BODY_BYTES));
        }
        if !ctx.body_budget.charge(charge, chunk.len()) {
            tracing::warn!(
                bytes = chunk.len(),
                "request body refused: the memory for request bodies (limits.body_memory_bytes) is spent"
            );
            return refused(ApiError::overloaded(
                "the router's memory for request bodies is spent; retry shortly",
            ));
        }
        read.extend_from_slice(&chunk);
        if end {
            return Ok(Read {
                body: Ok(read.freeze()),
                trailers,
            });
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
    trailers: bool,
) -> Result<Outcome, Outcome> {
    let Named {
        address,
        request_headers,
        body,
        answer_headers,
        mut record,
        mut tally,
    } = named;
    send(sender, wire::destination(address, &request_headers)).await?;
    // A body that trailers ended is ended by their answer.
    for chunk in wire::body_chunks(&body, true, !trailers) {
        send(sender, chunk).await?;
    }
    if trailers {
        send(sender, wire::trailers(true)).await?;
    }
    drop(body);
    let mut status = 0;
    let mut limit = ctx.upstream.first_byte_timeout();
    loop {
        let message = match next(inbound, limit).await {
            Ok(message) => message,
            Err(Outcome::Timeout) => {
                if let Some(record) = record.take() {
                    let usage = crate::decisions::Usage::default();
                    record.finish(504, "server_error", "upstream_timeout", usage);
                }
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
                    finish(&mut tally, status);
                    return Ok(Outcome::Routed);
                }
            }
            Request::ResponseBody(chunk) => {
                let end = chunk.end_of_stream;
                let data = Bytes::from(chunk.body);
                // An answer that is not a success (the gateway's own 503) has no
                // first token, usage or pace to count.
                if !data.is_empty() && (200..300).contains(&status) {
                    tally.data(&data);
                }
                send(sender, wire::body_response(Vec::from(data), false, end)).await?;
                if end {
                    finish(&mut tally, status);
                    return Ok(Outcome::Routed);
                }
            }
            Request::ResponseTrailers(_) => {
                send(sender, wire::trailers(false)).await?;
                finish(&mut tally, status);
                return Ok(Outcome::Routed);
            }
            _ => return Err(Outcome::Invalid),
        }
    }
}

/// Ends `tally` as an answer of `status` ends: an engine's (or the gateway's)
/// server error fails the request.
fn finish(tally: &mut Tally, status: u16) {
    if status >= 500 {
        tally.finish(Ending::Failed, "upstream_error");
    } else {
        tally.finish(Ending::Done, "ok");
    }
}
