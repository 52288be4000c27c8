//! The routed endpoints: read the body, prepare the request as its endpoint reads
//! it, run the model's bucket loop, count the picks and dispatch.

mod flowed;
mod ready;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use http_body_util::BodyExt;
use opentelemetry::KeyValue;
use parking_lot::Mutex;
use router_buckets::{BucketPick, SelectError, Selection};
use router_flow::TenantGuard;
use router_policy::{Explanation, PrefixMemo, RequestFacts};
use router_state::EngineId;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use super::MAX_BODY_BYTES;
use crate::app::AppContext;
use crate::attempts;
use crate::budget::Charge;
use crate::decisions::{PendingRecord, Usage};
use crate::dispatch::{Leg, Outgoing, REQUEST_ID};
use crate::error::ApiError;
use crate::explanation;
use crate::metrics::{BucketLabels, ModelLabels, RequestLabels};
use crate::prepare::Endpoint;
use crate::routing::ModelRoute;
use crate::trace::{TraceContext, Tracing};
pub(super) use ready::{Ready, ready};

/// The longest client `x-request-id` kept, in bytes.
const MAX_REQUEST_ID_BYTES: usize = 128;

/// The `POST` route of `endpoint`.
pub(super) fn routed(endpoint: &'static Endpoint) -> MethodRouter<Arc<AppContext>> {
    post(move |State(ctx): State<Arc<AppContext>>, request: Request| handle(endpoint, ctx, request))
}

/// A routed request. The body is read by a task of its own: reading it from the
/// connection's task makes hyper wake that task while it is being polled, which the
/// runtime treats as a yield and hands to another worker thread (two thread wake-ups
/// per request at low load); from a separate task each wake-up stays on one thread.
async fn handle(endpoint: &'static Endpoint, ctx: Arc<AppContext>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    // The body's charge is held until the answer's head is sent.
    let (body, _charge) = match read_body(&ctx, body).await {
        Ok((body, charge)) => (Ok(body), charge),
        Err(e) => (Err(e), Charge::default()),
    };
    match respond(endpoint, ctx, parts.headers, body, &Proxy).await {
        Ok(response) | Err(response) => response,
    }
}

/// What a routed request's selection becomes once it is made: the proxy sends it to
/// the engines picked and relays their answer (`attempts::run`); the endpoint picker
/// names the engine to the gateway that sends it.
pub(in crate::api) trait Deliver: Sync {
    /// What a delivered request gives its caller.
    type Answer: Send;

    /// The engines no pick may return, of the request's model on `route`.
    fn excluded(&self, _ctx: &AppContext, _route: &ModelRoute) -> Vec<EngineId> {
        Vec::new()
    }

    /// Delivers `pick`, the request's selection.
    fn deliver(
        &self,
        ctx: &Arc<AppContext>,
        route: &ModelRoute,
        request: &RequestFacts<'_>,
        pick: BucketPick,
        out: &Outgoing,
    ) -> impl Future<Output = Result<Self::Answer, ApiError>> + Send;

    /// The status the answer is counted under in the request's span.
    fn status(answer: &Self::Answer) -> u16;
}

/// The proxy's delivery: dispatched, retried, relayed.
struct Proxy;

impl Deliver for Proxy {
    type Answer = Response;

    async fn deliver(
        &self,
        ctx: &Arc<AppContext>,
        route: &ModelRoute,
        request: &RequestFacts<'_>,
        pick: BucketPick,
        out: &Outgoing,
    ) -> Result<Response, ApiError> {
        attempts::run(ctx, route, request, pick, out).await
    }

    fn status(answer: &Response) -> u16 {
        answer.status().as_u16()
    }
}

/// Reads a routed request's body within the client body timeout, [`MAX_BODY_BYTES`]
/// and the body budget, in a task of its own (see [`handle`]); returns it with what
/// it holds of the budget.
pub(super) async fn read_body(
    ctx: &Arc<AppContext>,
    body: Body,
) -> Result<(Bytes, Charge), ApiError> {
    let limit = ctx.client_body_timeout;
    let read = AbortOnDrop(tokio::spawn(tokio::time::timeout(
        limit,
        collect(Arc::clone(ctx), body),
    )));
    match read.await {
        Ok(Ok(read)) => read,
        Ok(Err(_)) => Err(ApiError::body_timeout(limit)),
        Err(e) => Err(ApiError::bad_body(format!(
            "the request body could not be read: {e}"
        ))),
    }
}

/// Reads `body` whole, charging each chunk to the body budget as it arrives (not
/// what a length header announces: a client that announces much and sends little
/// holds nothing).
async fn collect(ctx: Arc<AppContext>, body: Body) -> Result<(Bytes, Charge), ApiError> {
    let mut charge = Charge::default();
    let over_budget = |charge: &mut Charge, bytes: usize| {
        if ctx.body_budget.charge(charge, bytes) {
            return Ok(());
        }
        tracing::warn!(
            bytes,
            "request body refused: the memory for request bodies (limits.body_memory_bytes) is spent"
        );
        Err(ApiError::overloaded(
            "the router's memory for request bodies is spent; retry shortly",
        ))
    };
    // A body announced past the bound is read up to it all the same: most clients
    // write a whole body before reading an answer, and one closed under them sees a
    // broken pipe, not the 413.
    let mut body = body;
    let mut read = Read::default();
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| ApiError::bad_body(format!("the request body could not be read: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if read.len() + data.len() > MAX_BODY_BYTES {
            return Err(ApiError::too_large(MAX_BODY_BYTES));
        }
        over_budget(&mut charge, data.len())?;
        read.push(data);
    }
    Ok((read.into_bytes(), charge))
}

/// A body's chunks so far: one kept as it came (most bodies are one), more copied
/// together.
#[derive(Default)]
enum Read {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Read {
    fn len(&self) -> usize {
        match self {
            Read::Empty => 0,
            Read::One(bytes) => bytes.len(),
            Read::Many(bytes) => bytes.len(),
        }
    }

    fn push(&mut self, data: Bytes) {
        *self = match std::mem::take(self) {
            Read::Empty => Read::One(data),
            Read::One(first) => {
                let mut many = BytesMut::with_capacity(first.len() + data.len());
                many.extend_from_slice(&first);
                many.extend_from_slice(&data);
                Read::Many(many)
            }
            Read::Many(mut many) => {
                many.extend_from_slice(&data);
                Read::Many(many)
            }
        };
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Read::Empty => Bytes::new(),
            Read::One(bytes) => bytes,
            Read::Many(bytes) => bytes.freeze(),
        }
    }
}

/// A spawned task that is cancelled when its handle is dropped (the client went away).
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Routes a request whose body has been read, answering its errors; `Err` is the
/// error's response, with the request's id.
pub(in crate::api) async fn respond<D: Deliver>(
    endpoint: &'static Endpoint,
    ctx: Arc<AppContext>,
    headers: HeaderMap,
    body: Result<Bytes, ApiError>,
    delivery: &D,
) -> Result<D::Answer, Response> {
    let started = Instant::now();
    // A client's id is echoed and sent to the engines only when it is short and
    // visible ASCII; any other is replaced.
    let request_id = headers
        .get(REQUEST_ID)
        .filter(|id| {
            id.len() <= MAX_REQUEST_ID_BYTES && id.as_bytes().iter().all(u8::is_ascii_graphic)
        })
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&ctx.next_request_id()).expect("hex is a valid header")
        });
    let mut unanswered = Unanswered {
        ctx: &ctx,
        model: unknown_model(),
        armed: true,
    };
    let client = TraceContext::of(&headers);
    let span = ctx
        .spans
        .as_ref()
        .map(|spans| spans.request(endpoint.path, client.as_ref()));
    let tracing = Tracing { client, span };
    let arrival = Arrival {
        headers: &headers,
        started,
        request_id: request_id.clone(),
        tracing: &tracing,
    };
    let (model, result) = route(endpoint, &ctx, arrival, body, &mut unanswered, delivery).await;
    unanswered.armed = false;
    if let Some(span) = &tracing.span {
        span.set(KeyValue::new("switchyard.model", model.to_string()));
        let status = match &result {
            Ok(answer) => D::status(answer),
            Err(error) => {
                span.fail(format!("{}: {}", error.code(), error.message()));
                error.status().as_u16()
            }
        };
        span.set(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
    }
    match result {
        Ok(answer) => Ok(answer),
        Err(error) => {
            let labels = RequestLabels {
                model,
                outcome: outcome_of(&error),
                code: error.code(),
            };
            ctx.metrics.requests.get_or_create(&labels).inc();
            tracing::debug!(code = error.code(), status = %error.status(), message = error.message(), "request failed");
            let mut response = error.into_response();
            response.headers_mut().insert(REQUEST_ID, request_id);
            Err(response)
        }
    }
}

/// The request counter's outcome of a request answered with `error`.
fn outcome_of(error: &ApiError) -> &'static str {
    if error.status().is_client_error() {
        "client_error"
    } else {
        "server_error"
    }
}

/// Counts a request that is dropped before it has an answer (its client went away,
/// or shutdown closed its connection), under its model once that is known; from the
/// answer's head on, the relayed body counts how the request ends.
struct Unanswered<'a> {
    ctx: &'a AppContext,
    model: Arc<str>,
    armed: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            let labels = RequestLabels {
                model: Arc::clone(&self.model),
                outcome: "cancelled",
                code: "client_disconnected",
            };
            self.ctx.metrics.requests.get_or_create(&labels).inc();
        }
    }
}

/// The metric label of a request whose model is not (yet) known: never the
/// client's string, which would let clients create label values.
fn unknown_model() -> Arc<str> {
    Arc::from("")
}

/// The metric label of a request routed (or about to be) on `route`: its model once
/// known.
fn model_of(route: Option<&Arc<ModelRoute>>) -> Arc<str> {
    route.map_or_else(unknown_model, |route| Arc::clone(&route.id))
}

/// What is known of a request before its body is read.
struct Arrival<'a> {
    headers: &'a HeaderMap,
    started: Instant,
    request_id: HeaderValue,
    tracing: &'a Tracing,
}

/// The model (for metrics; empty until known) and the delivered answer.
async fn route<D: Deliver>(
    endpoint: &'static Endpoint,
    ctx: &Arc<AppContext>,
    arrival: Arrival<'_>,
    body: Result<Bytes, ApiError>,
    unanswered: &mut Unanswered<'_>,
    delivery: &D,
) -> (Arc<str>, Result<D::Answer, ApiError>) {
    let body = match body {
        Ok(body) => body,
        Err(e) => return (unknown_model(), Err(e)),
    };
    let preparing = arrival
        .tracing
        .span
        .as_ref()
        .map(|s| s.child("prepare", Vec::new()));
    let ready = match ready(endpoint, ctx, arrival.headers, &body).await {
        Ok(ready) => ready,
        Err((model, e)) => return (model, Err(e)),
    };
    drop(preparing);
    let model = Arc::clone(&ready.route.id);
    unanswered.model = Arc::clone(&model);
    let memo = PrefixMemo::new();
    let excluded = delivery.excluded(ctx, &ready.route);
    let request = match ready.bucket_request(&memo) {
        Ok(request) => request.with_excluded(&excluded),
        Err(e) => return (model, Err(e)),
    };
    // A sampled request's selection is recorded as it is made.
    let recording = ctx
        .decisions
        .as_ref()
        .filter(|log| log.sample())
        .map(|log| (log, Explanation::recording()));
    let request = request
        .with_explanation(recording.as_ref().map(|(_, e)| e))
        .with_timing(arrival.tracing.span.is_some());
    // Fields the router owns never reach an engine as the client sent them.
    let sent = match ready.prepared.forwarded(body.clone()) {
        Ok(sent) => sent,
        Err(e) => return (model, Err(e)),
    };
    let flowed = flowed::flowed(
        ctx,
        &ready,
        &request,
        arrival.headers,
        arrival.tracing,
        recording.as_ref().map(|(_, e)| e),
    )
    .await;
    let flowed = match flowed {
        Ok(flowed) => flowed,
        Err(e) => return (model, Err(e)),
    };
    let sent = match flowed.class.as_ref().and_then(|c| c.forward_priority) {
        Some(priority) => crate::dispatch::with_fields(&sent, &format!(r#""priority":{priority}"#)),
        None => sent,
    };
    let selected = &flowed.selected;
    let mut record = recording.as_ref().map(|(log, explanation)| {
        let report = explanation::Report {
            endpoint: endpoint.path,
            model: &ready.route.id,
            resolver: &ready.route.resolver,
            prepared: &ready.prepared,
            request: &request,
            selected,
            seen: &explanation.observations(),
            load: &ctx.fleet.load().snapshot(),
        };
        let id = arrival.request_id.to_str().unwrap_or_default();
        let mut json = report.to_json();
        if let Some(queue) = flowed.record() {
            json["flow"] = queue;
        }
        PendingRecord::new(Arc::clone(log), json, id, arrival.started)
    });
    if let (Some(record), Some((log, _))) = (record.as_mut(), &recording)
        && let Some(key) = log.page_hashing()
    {
        let arrived = SystemTime::now()
            .checked_sub(arrival.started.elapsed())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        record.with_replay(ready.replay(endpoint, ctx, &body, arrived, key, || {
            selected.is_ok().then(|| log.tokenizing()).flatten()
        }));
    }
    let flowed::Flowed {
        selected,
        refused,
        tenant,
        ..
    } = flowed;
    let selection = match selected {
        Ok(selection) => selection,
        Err(e) => {
            let error = flowed::Flowed::error(refused, e, &ctx.fleet.load().snapshot());
            if let Some(record) = record {
                record.finish(
                    error.status().as_u16(),
                    outcome_of(&error),
                    error.code(),
                    Usage::default(),
                );
            }
            return (model, Err(error));
        }
    };
    count_demotions(ctx, &model, &selection.demoted);
    let out = outgoing(endpoint, &ready, sent, arrival, record, tenant);
    let answer = delivery
        .deliver(ctx, &ready.route, &request, selection.pick, &out)
        .await;
    // An answer (its relayed body, or the gateway's stream the picker follows) takes
    // the record; an error completes it here.
    if let (Some(record), Err(e)) = (out.record.into_inner(), &answer) {
        record.finish(
            e.status().as_u16(),
            outcome_of(e),
            e.code(),
            Usage::default(),
        );
    }
    (model, answer)
}

/// The bucket loop on `route`, timed in `switchyard_selection_seconds` and as the
/// request's `select` span when traced.
async fn select(
    ctx: &AppContext,
    route: &ModelRoute,
    request: &RequestFacts<'_>,
    tracing: &Tracing,
) -> Result<Selection, SelectError> {
    let selecting = tracing.span.as_ref().map(|s| s.child("select", Vec::new()));
    let started = Instant::now();
    let selected = route.resolver.select(&ctx.fleet.snapshot(), request).await;
    ctx.metrics
        .selection
        .get_or_create(&ModelLabels {
            model: Arc::clone(&route.id),
        })
        .observe(started.elapsed().as_secs_f64());
    if let Some(span) = &selecting {
        crate::spans::record_attempts(span, &selected);
    }
    selected
}

/// Counts the buckets a selection tried after others because they were predicted
/// to miss their latency targets.
fn count_demotions(ctx: &AppContext, model: &Arc<str>, demoted: &[Arc<str>]) {
    for bucket in demoted {
        let labels = BucketLabels {
            model: Arc::clone(model),
            bucket: Arc::clone(bucket),
        };
        ctx.metrics.slo_demotions.get_or_create(&labels).inc();
    }
}

/// What dispatch sends, the same for every attempt.
fn outgoing(
    endpoint: &Endpoint,
    ready: &Ready<'_>,
    body: Bytes,
    arrival: Arrival<'_>,
    record: Option<PendingRecord>,
    tenant: Option<TenantGuard>,
) -> Outgoing {
    Outgoing {
        leg: Leg {
            path: endpoint.path,
            stream: ready.prepared.stream,
            adapter: ready.adapter().is_some(),
        },
        body,
        batch: ready.prepared.batch,
        pd_protocol: ready.route.pd_protocol,
        prompt_tokens: ready.prepared.input_tokens,
        model: Arc::clone(&ready.route.id),
        request_id: arrival.request_id,
        started: arrival.started,
        trace: arrival.tracing.clone(),
        record: Mutex::new(record),
        measure_tpot: ready.route.measures_tpot,
        tenant: Mutex::new(tenant),
    }
}
