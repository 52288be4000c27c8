//! The router's HTTP endpoints.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Json;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Collected, LengthLimitError, Limited};
use router_buckets::{BucketRequest, EnginePicks};
use router_policy::PrefixMemo;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use crate::app::AppContext;
use crate::config::{EngineConfig, EngineRole};
use crate::dispatch::{Outgoing, REQUEST_ID, dispatch};
use crate::error::ApiError;
use crate::metrics::{Gauge, ModelStageLabels, PickLabels, RequestLabels};
use crate::prepare::prepare;

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 << 20;

pub(crate) fn router(ctx: Arc<AppContext>) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/workers", get(list_workers).post(add_worker))
        .route("/workers/{id}", delete(remove_worker))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(ctx)
}

/// The chat endpoint. The body is read by a task of its own: reading it from the
/// connection's task makes hyper wake that task while it is being polled, which the
/// runtime treats as a yield and hands to another worker thread (two thread wake-ups
/// per request at low load); from a separate task each wake-up stays on one thread.
async fn chat_completions(State(ctx): State<Arc<AppContext>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let read = AbortOnDrop(tokio::spawn(Limited::new(body, MAX_BODY_BYTES).collect()));
    let body = match read.await {
        Ok(body) => body.map(Collected::to_bytes),
        Err(e) => Err(e.into()),
    };
    chat(ctx, parts.headers, body).await
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

async fn chat(
    ctx: Arc<AppContext>,
    headers: HeaderMap,
    body: Result<Bytes, axum::BoxError>,
) -> Response {
    let started = Instant::now();
    let request_id = headers.get(REQUEST_ID).cloned().unwrap_or_else(|| {
        HeaderValue::from_str(&ctx.next_request_id()).expect("hex is a valid header")
    });
    let (model, result) = route_chat(&ctx, &headers, body, started, request_id.clone()).await;
    match result {
        Ok(response) => response,
        Err(error) => {
            let outcome = if error.status().is_client_error() {
                "client_error"
            } else {
                "server_error"
            };
            let labels = RequestLabels {
                model,
                outcome,
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

/// The metric label of a request whose model is not (yet) known: never the
/// client's string, which would let clients create label values.
fn unknown_model() -> Arc<str> {
    Arc::from("")
}

/// The model (for metrics; empty until known) and the response.
async fn route_chat(
    ctx: &Arc<AppContext>,
    headers: &HeaderMap,
    body: Result<Bytes, axum::BoxError>,
    started: Instant,
    request_id: HeaderValue,
) -> (Arc<str>, Result<Response, ApiError>) {
    let body = match body {
        Ok(body) => body,
        Err(e) if e.is::<LengthLimitError>() => {
            return (unknown_model(), Err(ApiError::too_large(MAX_BODY_BYTES)));
        }
        Err(e) => {
            return (
                unknown_model(),
                Err(ApiError::bad_body(format!(
                    "the request body could not be read: {e}"
                ))),
            );
        }
    };
    let routes = ctx.routes.load();
    let mut route = None;
    let prepared = prepare(&body, |model| {
        let found = routes
            .get(model)
            .ok_or_else(|| ApiError::model_not_found(model))?;
        route = Some(Arc::clone(found));
        Ok(found.tokenizer.as_deref())
    });
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => return (unknown_model(), Err(e)),
    };
    let route = route.expect("prepare resolved the model");
    let model = Arc::clone(&route.id);
    let affinity = &ctx.config.affinity;
    let header = |name: &str| -> Result<Option<&str>, ApiError> {
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
    let keys = header(&affinity.session_header)
        .and_then(|s| Ok((s, header(&affinity.routing_key_header)?)));
    let (session_key, routing_key) = match keys {
        Ok(keys) => keys,
        Err(e) => return (model, Err(e)),
    };
    let request = BucketRequest::new(&prepared.model, prepared.input_tokens)
        .with_max_output_tokens(prepared.max_output_tokens)
        .map_err(|e| ApiError::invalid("invalid_parameter", "max_tokens", e.to_string()));
    let memo = PrefixMemo::new();
    let request = match request {
        Ok(r) => r
            .with_token_ids(prepared.token_ids.as_deref())
            .with_prefix_memo(Some(&memo))
            .with_session_key(session_key)
            .with_routing_key(routing_key),
        Err(e) => return (model, Err(e)),
    };
    let selection = match route
        .resolver
        .select(&ctx.registry.snapshot(), &request)
        .await
    {
        Ok(selection) => selection,
        Err(e) => return (model, Err(ApiError::from(e))),
    };
    for pick in selection.pick.engines.iter() {
        let labels = PickLabels {
            model: Arc::clone(&model),
            bucket: Arc::clone(&selection.pick.bucket),
            stage: pick.engine.role().as_str(),
            engine: Arc::clone(pick.engine.id().as_arc_str()),
            reason: pick.reason.as_str(),
        };
        ctx.metrics.picks.get_or_create(&labels).inc();
        if let Some(cached) = pick.predicted_cached_tokens {
            let labels = ModelStageLabels {
                model: Arc::clone(&model),
                stage: pick.engine.role().as_str(),
            };
            ctx.metrics
                .predicted_cached_tokens
                .get_or_create(&labels)
                .inc_by(cached);
            ctx.metrics
                .predicted_prompt_tokens
                .get_or_create(&labels)
                .inc_by(prepared.input_tokens);
        }
    }
    if let EnginePicks::Pd { prefill, decode } = &selection.pick.engines {
        tracing::debug!(bucket = %selection.pick.bucket, prefill = %prefill.engine.id(), decode = %decode.engine.id(), "selected");
    }
    let out = Outgoing {
        body,
        prompt_tokens: prepared.input_tokens,
        model: Arc::clone(&model),
        request_id,
        started,
    };
    (model, dispatch(ctx, selection, out).await)
}

async fn models(State(ctx): State<Arc<AppContext>>) -> Json<Value> {
    let mut ids: Vec<String> = ctx.routes.load().keys().cloned().collect();
    ids.sort();
    let data: Vec<Value> = ids
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "switchyard"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn ready(State(ctx): State<Arc<AppContext>>) -> Response {
    if ctx.registry.snapshot().any_healthy() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no engine is routable\n").into_response()
    }
}

async fn metrics(State(ctx): State<Arc<AppContext>>) -> Response {
    let snapshot = ctx.registry.snapshot();
    let load = ctx.load.snapshot();
    let mut in_flight = Vec::new();
    let mut healthy = Vec::new();
    let mut breaker = Vec::new();
    let mut report_age = Vec::new();
    for worker in snapshot.engines() {
        let engine = || vec![("engine", worker.id().to_string())];
        let seen = load.observe(worker.id());
        in_flight.push((engine(), seen.in_flight as f64));
        healthy.push((engine(), if worker.is_healthy() { 1.0 } else { 0.0 }));
        if let Some(state) = ctx.health.breaker(worker.id()) {
            breaker.push((engine(), state.gauge()));
        }
        if let Some(reported) = seen.reported {
            report_age.push((
                engine(),
                load.captured_at()
                    .saturating_duration_since(reported.received_at)
                    .as_secs_f64(),
            ));
        }
    }
    let feed = ctx
        .feed_stats
        .counts()
        .iter()
        .map(|(outcome, n)| (vec![("outcome", (*outcome).to_owned())], *n as f64))
        .collect();
    let mut gauges = vec![
        Gauge {
            name: "engine_in_flight",
            help: "Requests this router has in flight per engine",
            counter: false,
            samples: in_flight,
        },
        Gauge {
            name: "engine_healthy",
            help: "Whether an engine is routable (probes pass, breaker closed)",
            counter: false,
            samples: healthy,
        },
        Gauge {
            name: "engine_breaker_open",
            help: "Whether an engine's circuit breaker is open",
            counter: false,
            samples: breaker,
        },
        Gauge {
            name: "engine_load_report_age_seconds",
            help: "Age of an engine's freshest complete load report (absent when none is fresh)",
            counter: false,
            samples: report_age,
        },
        Gauge {
            name: "load_feed_messages",
            help: "Load-feed messages by outcome since start",
            counter: true,
            samples: feed,
        },
    ];
    gauges.extend(crate::scrape::prefix_cache_gauges(&ctx));
    let text = ctx.metrics.encode(&gauges);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

fn authorize(ctx: &AppContext, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &ctx.admin_token else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    // Compare in time independent of where the first difference is.
    let equal = given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if equal {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

async fn list_workers(
    State(ctx): State<Arc<AppContext>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&ctx, &headers)?;
    let snapshot = ctx.registry.snapshot();
    let load = ctx.load.snapshot();
    let workers: Vec<Value> = snapshot
        .engines()
        .map(|w| {
            json!({
                "id": w.id().as_str(), "url": w.url(), "model": w.model(), "role": w.role().as_str(),
                "healthy": w.is_healthy(), "in_flight": load.observe(w.id()).in_flight,
                "bootstrap_port": w.bootstrap_port(), "dp_size": w.dp_size().get(),
            })
        })
        .collect();
    Ok(Json(json!({"workers": workers})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddEngine {
    id: String,
    url: String,
    model: String,
    #[serde(default)]
    role: Option<EngineRole>,
    #[serde(default)]
    bootstrap_port: Option<u16>,
    #[serde(default)]
    dp_size: Option<u32>,
    #[serde(default)]
    load_port: Option<u16>,
    #[serde(default)]
    kv_port: Option<u16>,
    #[serde(default)]
    kv_replay_port: Option<u16>,
}

async fn add_worker(
    State(ctx): State<Arc<AppContext>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    authorize(&ctx, &headers)?;
    let add: AddEngine = serde_json::from_slice(&body)
        .map_err(|e| ApiError::admin(StatusCode::BAD_REQUEST, e.to_string()))?;
    let config = EngineConfig {
        id: add.id,
        url: add.url,
        role: add.role,
        bootstrap_port: add.bootstrap_port,
        dp_size: add.dp_size,
        load_port: add.load_port,
        kv_port: add.kv_port,
        kv_replay_port: add.kv_replay_port,
    };
    let worker = ctx
        .add_engine(config, add.model)
        .await
        .map_err(|e| ApiError::admin(StatusCode::BAD_REQUEST, e))?;
    let body = json!({"id": worker.id().as_str(), "model": worker.model(), "role": worker.role().as_str(), "healthy": worker.is_healthy()});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn remove_worker(
    State(ctx): State<Arc<AppContext>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    authorize(&ctx, &headers)?;
    ctx.remove_engine(&id)
        .map_err(|e| ApiError::admin(StatusCode::NOT_FOUND, e))?;
    Ok(StatusCode::NO_CONTENT)
}
