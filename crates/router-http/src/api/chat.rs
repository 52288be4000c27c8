//! The routed endpoints: read the body, prepare the request as its endpoint reads
//! it, run the model's bucket loop, count the picks and dispatch.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use parking_lot::Mutex;
use router_buckets::BucketRequest;
use router_policy::{Explanation, PrefixMemo};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use super::MAX_BODY_BYTES;
use crate::app::AppContext;
use crate::attempts;
use crate::config::PdProtocol;
use crate::decisions::PendingRecord;
use crate::dispatch::{Leg, Outgoing, REQUEST_ID};
use crate::error::ApiError;
use crate::explanation;
use crate::metrics::{BucketLabels, RequestLabels};
use crate::prepare::{Endpoint, Prepared, prepare};
use crate::routing::ModelRoute;
use crate::trace::{TraceContext, Tracing};
use opentelemetry::KeyValue;

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
    let body = read_body(&ctx, body).await;
    respond(endpoint, ctx, parts.headers, body).await
}

/// Reads a routed request's body within the client body timeout and
/// [`MAX_BODY_BYTES`], in a task of its own (see [`handle`]).
pub(super) async fn read_body(ctx: &AppContext, body: Body) -> Result<Bytes, ApiError> {
    let limit = ctx.client_body_timeout;
    let read = AbortOnDrop(tokio::spawn(tokio::time::timeout(
        limit,
        Limited::new(body, MAX_BODY_BYTES).collect(),
    )));
    let unreadable = |e: &dyn std::fmt::Display| {
        ApiError::bad_body(format!("the request body could not be read: {e}"))
    };
    match read.await {
        Ok(Ok(Ok(body))) => Ok(body.to_bytes()),
        Ok(Ok(Err(e))) if e.is::<LengthLimitError>() => Err(ApiError::too_large(MAX_BODY_BYTES)),
        Ok(Ok(Err(e))) => Err(unreadable(&e)),
        Ok(Err(_)) => Err(ApiError::body_timeout(limit)),
        Err(e) => Err(unreadable(&e)),
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

async fn respond(
    endpoint: &'static Endpoint,
    ctx: Arc<AppContext>,
    headers: HeaderMap,
    body: Result<Bytes, ApiError>,
) -> Response {
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
    let (model, result) = route(endpoint, &ctx, arrival, body, &mut unanswered).await;
    unanswered.armed = false;
    if let Some(span) = &tracing.span {
        span.set(KeyValue::new("switchyard.model", model.to_string()));
        let status = match &result {
            Ok(response) => response.status().as_u16(),
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
        Ok(response) => response,
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
            response
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

/// The most served models a missing-model error names.
const NAMED_MODELS: usize = 8;

/// The served models `ids`, quoted, for an error: the first [`NAMED_MODELS`], then how
/// many more.
fn served_models(ids: &[String]) -> String {
    let named: Vec<String> = ids
        .iter()
        .take(NAMED_MODELS)
        .map(|id| format!("{id:?}"))
        .collect();
    match ids.len() {
        0 => "no model yet".to_owned(),
        n if n > NAMED_MODELS => format!("{} and {} more", named.join(", "), n - NAMED_MODELS),
        _ => named.join(", "),
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

/// A request prepared for selection: its model's route, the facts its endpoint
/// reads, and its affinity keys.
pub(super) struct Ready<'h> {
    pub(super) route: Arc<ModelRoute>,
    pub(super) prepared: Prepared,
    /// The adapter `model` names (`base:adapter`), if any.
    named_adapter: Option<Arc<str>>,
    pub(super) session_key: Option<&'h str>,
    pub(super) routing_key: Option<&'h str>,
}

impl Ready<'_> {
    /// The LoRA adapter the request is for: the one `model` names wins over
    /// `/generate`'s `lora_path`, as on SGLang.
    pub(super) fn adapter(&self) -> Option<&str> {
        self.named_adapter
            .as_deref()
            .or(self.prepared.adapter.as_deref())
    }

    /// The facts the bucket loop selects on, with prefix lookups shared through
    /// `memo`.
    pub(super) fn bucket_request<'a>(
        &'a self,
        memo: &'a PrefixMemo,
    ) -> Result<BucketRequest<'a>, ApiError> {
        let request = BucketRequest::new(&self.route.id, self.prepared.input_tokens)
            .with_max_output_tokens(self.prepared.max_output_tokens)
            .map_err(|e| ApiError::invalid("invalid_parameter", "max_tokens", e.to_string()))?;
        Ok(request
            .with_adapter(self.adapter())
            .with_token_ids(self.prepared.token_ids.as_deref())
            .with_prefix_memo(Some(memo))
            .with_session_key(self.session_key)
            .with_routing_key(self.routing_key))
    }
}

/// Reads `body` as `endpoint` does, resolves its model and tokenizes its prompt
/// where routing needs it, and reads the affinity headers.
///
/// # Errors
/// The client's mistake or a tokenization failure, with the model for metrics (empty
/// until known).
pub(super) async fn ready<'h>(
    endpoint: &'static Endpoint,
    ctx: &Arc<AppContext>,
    headers: &'h HeaderMap,
    body: &Bytes,
) -> Result<Ready<'h>, (Arc<str>, ApiError)> {
    let mut route = None;
    let mut named_adapter = None;
    let prepared = prepare(endpoint, body, |model| {
        let found = route.insert(match model {
            Some(model) => {
                let (found, named) = ctx
                    .routing
                    .resolve(model, || ctx.fleet.snapshot())
                    .ok_or_else(|| ApiError::model_not_found(model))?;
                named_adapter = named;
                found
            }
            None => ctx.routing.only().ok_or_else(|| {
                ApiError::invalid(
                    "missing_model",
                    "model",
                    format!(
                        "model is required: this router serves {}",
                        served_models(&ctx.routing.model_ids())
                    ),
                )
            })?,
        });
        // Refused before its prompt is tokenized.
        let pd_only = !found.resolver.has_plain_bucket();
        if pd_only && endpoint.plain_only {
            let message = format!(
                "model {:?} is served by prefill/decode engines, which do not serve {}",
                found.id, endpoint.path
            );
            return Err(ApiError::invalid("invalid_model", "model", message));
        }
        if pd_only && found.pd_protocol == PdProtocol::Vllm && !endpoint.vllm_pd {
            let message = format!(
                "model {:?} is served by vLLM prefill/decode engines, whose hand-over serves /v1/chat/completions and /v1/completions, not {}",
                found.id, endpoint.path
            );
            return Err(ApiError::invalid("invalid_model", "model", message));
        }
        Ok(found.tokenizer.clone())
    });
    let prepared = match prepared {
        Ok((prepared, None)) => prepared,
        Ok((prepared, Some(tokenize))) => match tokenize.off_thread(&ctx.tokenizing).await {
            Ok(tokens) => prepared.with_tokens(tokens),
            Err(e) => return Err((model_of(route.as_ref()), e)),
        },
        Err(e) => return Err((model_of(route.as_ref()), e)),
    };
    let route = route.expect("prepare resolved the model");
    let affinity = &ctx.affinity_headers;
    let header = |name: &str| -> Result<Option<&'h str>, ApiError> {
        let value = headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty());
        match value {
            Some(v) if v.len() > affinity.max_key_bytes => Err(ApiError::invalid(
                "invalid_header",
                name,
                format!(
                    "the {name} header is {} bytes; at most {} are accepted",
                    v.len(),
                    affinity.max_key_bytes
                ),
            )),
            v => Ok(v),
        }
    };
    let keys = header(&affinity.session).and_then(|s| Ok((s, header(&affinity.routing_key)?)));
    match keys {
        Ok((session_key, routing_key)) => Ok(Ready {
            route,
            prepared,
            named_adapter,
            session_key,
            routing_key,
        }),
        Err(e) => Err((Arc::clone(&route.id), e)),
    }
}

/// What is known of a request before its body is read.
struct Arrival<'a> {
    headers: &'a HeaderMap,
    started: Instant,
    request_id: HeaderValue,
    tracing: &'a Tracing,
}

/// The model (for metrics; empty until known) and the response.
async fn route(
    endpoint: &'static Endpoint,
    ctx: &Arc<AppContext>,
    arrival: Arrival<'_>,
    body: Result<Bytes, ApiError>,
    unanswered: &mut Unanswered<'_>,
) -> (Arc<str>, Result<Response, ApiError>) {
    let Arrival {
        headers,
        started,
        request_id,
        tracing,
    } = arrival;
    let body = match body {
        Ok(body) => body,
        Err(e) => return (unknown_model(), Err(e)),
    };
    let preparing = tracing
        .span
        .as_ref()
        .map(|s| s.child("prepare", Vec::new()));
    let ready = match ready(endpoint, ctx, headers, &body).await {
        Ok(ready) => ready,
        Err((model, e)) => return (model, Err(e)),
    };
    drop(preparing);
    let route = &ready.route;
    let model = Arc::clone(&route.id);
    unanswered.model = Arc::clone(&model);
    let memo = PrefixMemo::new();
    let request = match ready.bucket_request(&memo) {
        Ok(request) => request,
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
        .with_timing(tracing.span.is_some());
    let selecting = tracing.span.as_ref().map(|s| s.child("select", Vec::new()));
    let selected = route.resolver.select(&ctx.fleet.snapshot(), &request).await;
    if let Some(span) = &selecting {
        crate::spans::record_attempts(span, &selected);
    }
    drop(selecting);
    let record = recording.as_ref().map(|(log, explanation)| {
        let report = explanation::Report {
            endpoint: endpoint.path,
            model: &route.id,
            resolver: &route.resolver,
            prepared: &ready.prepared,
            request: &request,
            selected: &selected,
            seen: &explanation.observations(),
            load: &ctx.fleet.load().snapshot(),
        };
        let id = request_id.to_str().unwrap_or_default();
        PendingRecord::new(Arc::clone(log), report.to_json(), id, started)
    });
    let selection = match selected {
        Ok(selection) => selection,
        Err(e) => {
            let error = ApiError::of_selection(e, &ctx.fleet.load().snapshot());
            if let Some(record) = record {
                record.finish(error.status().as_u16(), outcome_of(&error), error.code());
            }
            return (model, Err(error));
        }
    };
    let out = Outgoing {
        leg: Leg {
            path: endpoint.path,
            stream: ready.prepared.stream,
        },
        body,
        batch: ready.prepared.batch,
        pd_protocol: route.pd_protocol,
        prompt_tokens: ready.prepared.input_tokens,
        model: Arc::clone(&model),
        request_id,
        started,
        trace: tracing.clone(),
        record: Mutex::new(record),
        measure_tpot: route.measures_tpot,
    };
    for bucket in &selection.demoted {
        let labels = BucketLabels {
            model: Arc::clone(&model),
            bucket: Arc::clone(bucket),
        };
        ctx.metrics.slo_demotions.get_or_create(&labels).inc();
    }
    let answer = attempts::run(ctx, route, &request, selection.pick, &out).await;
    // An answer's relayed body takes the record; an error completes it here.
    if let (Some(record), Err(e)) = (out.record.into_inner(), &answer) {
        record.finish(e.status().as_u16(), outcome_of(e), e.code());
    }
    (model, answer)
}
