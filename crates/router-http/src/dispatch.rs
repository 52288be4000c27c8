//! Dispatch of a complete selection: one plain engine, or a prefill and a decode
//! engine sent the same body with one bootstrap room, concurrently.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use router_buckets::{BucketPick, EnginePicks};
use router_policy::Pick;
use router_state::{Engine, EngineId};
use router_upstream::{H1Body, UpstreamError};
use tokio::time::Instant;

use crate::app::AppContext;
use crate::config::PdProtocol;
use crate::decisions::PendingRecord;
use crate::error::ApiError;
use crate::metrics::StageLabels;
use crate::relay::{Companion, RelayBody};
use crate::retries::RetryReason;
use crate::trace::Tracing;

mod ranks;
mod vllm;

const BUCKET: HeaderName = HeaderName::from_static("x-switchyard-bucket");
const ENGINE: HeaderName = HeaderName::from_static("x-switchyard-engine");
const PREFILL: HeaderName = HeaderName::from_static("x-switchyard-prefill");
const DECODE: HeaderName = HeaderName::from_static("x-switchyard-decode");
const REASON: HeaderName = HeaderName::from_static("x-switchyard-reason");
const PROMPT_TOKENS: HeaderName = HeaderName::from_static("x-switchyard-prompt-tokens");
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A leg in flight, owned so it can outlive the handler as the relay's companion.
type LegFuture = Pin<Box<dyn Future<Output = Result<Response<H1Body>, Failed>> + Send>>;

/// What every leg of a request is: where it goes on the engine, and whether its
/// answer is streamed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Leg {
    /// The path on the engine (the endpoint's own).
    pub(crate) path: &'static str,
    /// A streamed answer's head comes before the generation; a whole answer's after.
    pub(crate) stream: bool,
}

/// What dispatch needs besides the selection; the same for every attempt.
pub(crate) struct Outgoing {
    pub(crate) leg: Leg,
    pub(crate) body: Bytes,
    /// The number of prompts of a batch, which gets one bootstrap room a prompt.
    pub(crate) batch: Option<usize>,
    /// How the model's prefill and decode engines hand the request over.
    pub(crate) pd_protocol: PdProtocol,
    pub(crate) prompt_tokens: u64,
    pub(crate) model: Arc<str>,
    pub(crate) request_id: HeaderValue,
    pub(crate) started: Instant,
    /// The request's trace, passed on to every engine.
    pub(crate) trace: Tracing,
    /// The request's decision record, when it is sampled: taken by the body that
    /// relays its answer, else completed with the error it is answered with.
    pub(crate) record: Mutex<Option<PendingRecord>>,
    /// Whether a streamed answer's time per output token is measured: some bucket of
    /// the model has a time-per-token target.
    pub(crate) measure_tpot: bool,
}

/// A dispatch that ended before any byte reached the client.
pub(crate) struct Failed {
    /// What the client gets if the request is not sent again.
    pub(crate) answer: Answer,
    /// Set when the engine never started the request: another engine may be sent it.
    pub(crate) retry: Option<Retry>,
}

/// What the client gets for a failed dispatch that is not sent again.
pub(crate) enum Answer {
    /// The router's error.
    Error(ApiError),
    /// An engine's own answer (a 429), relayed only once it is the request's last: a
    /// retried one is never counted, and holds no in-flight guard meanwhile.
    Engine(Box<Refused>),
}

/// An engine's refusal, waiting to be relayed with the routing headers.
pub(crate) struct Refused {
    response: Response<H1Body>,
    headers: HeaderMap,
}

impl Answer {
    /// The client's answer: relayed as the engine sent it, or the router's error.
    pub(crate) fn into_response(
        self,
        ctx: &Arc<AppContext>,
        out: &Outgoing,
    ) -> Result<Response, ApiError> {
        match self {
            Answer::Error(error) => Err(error),
            Answer::Engine(refused) => {
                let Refused { response, headers } = *refused;
                Ok(relay(ctx, response, None, headers, out, Vec::new(), None))
            }
        }
    }
}

/// Why a failed dispatch may be sent to another engine, and which engine failed.
pub(crate) struct Retry {
    pub(crate) reason: RetryReason,
    pub(crate) engine: EngineId,
}

impl From<ApiError> for Failed {
    fn from(error: ApiError) -> Self {
        Self {
            answer: Answer::Error(error),
            retry: None,
        }
    }
}

impl Failed {
    /// The failure in words, for a leg that fails after the answer began.
    fn message(&self) -> String {
        match &self.answer {
            Answer::Error(e) => e.message().to_owned(),
            Answer::Engine(refused) => format!("status {}", refused.response.status()),
        }
    }
}

/// The routing headers of a plain answer: the bucket, the engine, and why it was
/// picked (`x-switchyard-reason`).
fn plain_headers(bucket: HeaderValue, pick: &Pick) -> HeaderMap {
    let mut headers = answer_headers(bucket);
    headers.insert(ENGINE, id_header(&pick.engine));
    headers.insert(REASON, HeaderValue::from_static(pick.reason.as_str()));
    headers
}

/// The routing headers of a PD answer: the bucket, both engines, and why each was
/// picked (`x-switchyard-reason: prefill=<reason>, decode=<reason>`).
pub(super) fn pd_headers(bucket: HeaderValue, prefill: &Pick, decode: &Pick) -> HeaderMap {
    let mut headers = answer_headers(bucket);
    headers.insert(PREFILL, id_header(&prefill.engine));
    headers.insert(DECODE, id_header(&decode.engine));
    let reasons = format!("prefill={}, decode={}", prefill.reason, decode.reason);
    let reasons = HeaderValue::from_str(&reasons).expect("reasons are header-safe");
    headers.insert(REASON, reasons);
    headers
}

/// The answer's own header map, with its bucket: room for the routing headers, the
/// relayed ones and the request id without growing. Built once the engines' in-flight
/// guards are held, so that nothing but the rank lies between admission and them.
fn answer_headers(bucket: HeaderValue) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(12);
    headers.insert(BUCKET, bucket);
    headers
}

/// Sends the request to the selected engines and relays the answer.
pub(crate) async fn dispatch(
    ctx: &Arc<AppContext>,
    pick: BucketPick,
    out: &Outgoing,
) -> Result<Response, Failed> {
    let bucket =
        HeaderValue::from_str(&pick.bucket).map_err(|_| ApiError::upstream("invalid bucket id"))?;
    match pick.engines {
        EnginePicks::Plain(pick) => {
            let rank = ranks::rank(ctx, &pick);
            let guards = vec![ranks::guard(ctx, &pick.engine, rank)];
            let headers = plain_headers(bucket, &pick);
            let engine = pick.engine;
            let to = Target {
                engine: &engine,
                stage: "plain",
                rank,
                routing: &headers,
            };
            let body = ranks::with_rank(&out.body, rank);
            let response = send(ctx, to, out.leg, body, &out.request_id, &out.trace).await?;
            Ok(relay(
                ctx,
                response,
                None,
                headers,
                out,
                guards,
                Some(&engine),
            ))
        }
        EnginePicks::Pd { prefill, decode } if out.pd_protocol == PdProtocol::Vllm => {
            vllm::dispatch(ctx, bucket, prefill, decode, out).await
        }
        EnginePicks::Pd { prefill, decode } => {
            let (prefill_rank, decode_rank) =
                (ranks::rank(ctx, &prefill), ranks::rank(ctx, &decode));
            let guards = vec![
                ranks::guard(ctx, &prefill.engine, prefill_rank),
                ranks::guard(ctx, &decode.engine, decode_rank),
            ];
            let headers = pd_headers(bucket, &prefill, &decode);
            let (prefill, decode) = (prefill.engine, decode.engine);
            let prefill_ranks = prefill.dp_size().get();
            let rooms: Vec<u64> = (0..out.batch.unwrap_or(1))
                .map(|_| ranks::room(ctx.next_room(), prefill_rank, prefill_ranks))
                .collect();
            let body = with_bootstrap(&out.body, &prefill, out.batch, &rooms);
            // The legs' copy: the relayed answer takes `headers` while they live.
            let routing = headers.clone();
            let mut prefill_leg: LegFuture = {
                let ctx = Arc::clone(ctx);
                let (prefill, body, request_id, trace, leg, routing) = (
                    Arc::clone(&prefill),
                    ranks::with_rank(&body, prefill_rank),
                    out.request_id.clone(),
                    out.trace.clone(),
                    out.leg,
                    routing.clone(),
                );
                Box::pin(async move {
                    let to = Target {
                        engine: &prefill,
                        stage: "prefill",
                        rank: prefill_rank,
                        routing: &routing,
                    };
                    send(&ctx, to, leg, body, &request_id, &trace).await
                })
            };
            let request_id = out.request_id.clone();
            let to = Target {
                engine: &decode,
                stage: "decode",
                rank: decode_rank,
                routing: &routing,
            };
            let body = ranks::with_rank(&body, decode_rank);
            let decode_leg = send(ctx, to, out.leg, body, &request_id, &out.trace);
            tokio::pin!(decode_leg);
            let mut prefill_response: Option<Response<H1Body>> = None;
            let decode_response = loop {
                tokio::select! {
                    result = &mut prefill_leg, if prefill_response.is_none() => {
                        // A failed prefill returns here, dropping (cancelling) the decode leg.
                        prefill_response = Some(result?);
                    }
                    result = &mut decode_leg => break result?,
                }
            };
            let companion: Companion = match prefill_response {
                Some(response) => Box::pin(drain(response)),
                None => {
                    Box::pin(
                        async move { drain(prefill_leg.await.map_err(|e| e.message())?).await },
                    )
                }
            };
            Ok(relay(
                ctx,
                decode_response,
                Some(companion),
                headers,
                out,
                guards,
                Some(&decode),
            ))
        }
    }
}

/// Where a leg goes: the engine, its stage (for metrics and errors), the rank named,
/// if any, and the routing headers the client gets with an engine's own refusal.
#[derive(Clone, Copy)]
struct Target<'a> {
    engine: &'a Engine,
    stage: &'static str,
    rank: Option<u32>,
    routing: &'a HeaderMap,
}

/// Sends one leg and waits for a response head. Engine 5xx answers, transport
/// failures and timeouts count against the engine's breaker and become 502 (504 for
/// timeouts), except the first-byte timeout of an answer that is not streamed (its
/// head waits for the whole generation); 4xx answers are the client's and are
/// returned as they are. A 503, and a request the engine never received, may be
/// sent to another engine.
async fn send(
    ctx: &AppContext,
    to: Target<'_>,
    leg: Leg,
    body: Bytes,
    request_id: &HeaderValue,
    trace: &Tracing,
) -> Result<Response<H1Body>, Failed> {
    let Target {
        engine,
        stage,
        rank,
        routing,
    } = to;
    let invalid =
        || ApiError::upstream(format!("{stage} engine {} has an invalid URL", engine.id()));
    let authority = ctx.fleet.authority(engine).ok_or_else(invalid)?;
    let json = HeaderValue::from_static("application/json");
    let rank = ranks::rank_header(rank);
    let mut headers = vec![(header::CONTENT_TYPE, &json), (REQUEST_ID, request_id)];
    if let Some((name, value)) = &rank {
        headers.push((name.clone(), value));
    }
    let leg_trace = trace.leg(stage, engine.id().as_str());
    headers.extend(leg_trace.headers());
    let sent = Instant::now();
    let result = ctx
        .upstream
        .post(&authority, leg.path, &headers, &body)
        .await;
    ctx.metrics
        .upstream_latency
        .get_or_create(&StageLabels { stage })
        .observe(sent.elapsed().as_secs_f64());
    let retry = |reason| {
        Some(Retry {
            reason,
            engine: engine.id().clone(),
        })
    };
    let answered = match result {
        Ok(response) if response.status().is_server_error() => {
            ctx.fleet.record_dispatch(engine.id(), false);
            let status = response.status();
            Err(Failed {
                answer: Answer::Error(ApiError::upstream(format!(
                    "{stage} engine {} failed with status {status}",
                    engine.id(),
                ))),
                retry: if status == StatusCode::SERVICE_UNAVAILABLE {
                    retry(RetryReason::Status503)
                } else {
                    None
                },
            })
        }
        // Overloaded, not faulty: another engine may take the request, else the
        // engine's answer is relayed as it is.
        Ok(response) if response.status() == StatusCode::TOO_MANY_REQUESTS => {
            ctx.fleet.record_dispatch(engine.id(), true);
            Err(Failed {
                answer: Answer::Engine(Box::new(Refused {
                    response,
                    headers: routing.clone(),
                })),
                retry: retry(RetryReason::Status429),
            })
        }
        Ok(response) => {
            ctx.fleet.record_dispatch(engine.id(), true);
            Ok(response)
        }
        Err(e) => {
            // A whole answer's head comes only after the generation: its first-byte
            // timeout is a long generation, not an engine fault.
            let long_generation = matches!(e, UpstreamError::NoHead) && !leg.stream;
            if !long_generation {
                ctx.fleet.record_dispatch(engine.id(), false);
            }
            let message = format!("{stage} engine {}: {}", engine.id(), e.describe());
            let reason = match &e {
                UpstreamError::NotWritten(_) => Some(RetryReason::NotWritten),
                e if e.never_sent() => Some(RetryReason::ConnectFailed),
                _ => None,
            };
            Err(Failed {
                answer: Answer::Error(match e {
                    UpstreamError::Timeout(_)
                    | UpstreamError::ConnectTimeout
                    | UpstreamError::NoHead => ApiError::timeout(message),
                    _ => ApiError::upstream(message),
                }),
                retry: reason.and_then(retry),
            })
        }
    };
    if let (Some(span), Err(failed)) = (&leg_trace.span, &answered) {
        span.fail(failed.message());
    }
    answered
}

/// Reads a leg's body to its end, keeping none of it; the PD prefill leg must run to
/// completion for the KV hand-over, so it is driven alongside the decode stream.
async fn drain(response: Response<H1Body>) -> Result<(), String> {
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        frame.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Relays an engine's answer; `generating` is the engine that generates its tokens
/// (the plain or decode engine), whose pace a successful streamed answer of one
/// prompt measures when the model's buckets have a time-per-token target.
fn relay(
    ctx: &Arc<AppContext>,
    response: Response<H1Body>,
    companion: Option<Companion>,
    mut headers: HeaderMap,
    out: &Outgoing,
    guards: Vec<router_state::InflightGuard>,
    generating: Option<&Engine>,
) -> Response {
    let (parts, body) = response.into_parts();
    let status = parts.status;
    let record = out.record.lock().take();
    let measured = generating.filter(|_| {
        out.measure_tpot && out.leg.stream && out.batch.is_none() && status.is_success()
    });
    let body = RelayBody::new(
        body,
        companion,
        Arc::clone(ctx),
        Arc::clone(&out.model),
        out.started,
        guards,
    )
    .with_record(record, status.as_u16())
    .with_span(out.trace.span.clone())
    .with_tpot(measured);
    let mut response = Response::new(Body::new(body));
    *response.status_mut() = status;
    for name in [
        header::CONTENT_TYPE,
        header::CACHE_CONTROL,
        header::RETRY_AFTER,
    ] {
        if let Some(value) = parts.headers.get(&name) {
            headers.insert(name, value.clone());
        }
    }
    headers.insert(REQUEST_ID, out.request_id.clone());
    headers.insert(PROMPT_TOKENS, HeaderValue::from(out.prompt_tokens));
    *response.headers_mut() = headers;
    response
}

fn id_header(engine: &Engine) -> HeaderValue {
    HeaderValue::from_str(engine.id().as_str())
        .unwrap_or_else(|_| HeaderValue::from_static("invalid-id"))
}

/// The body with the bootstrap fields appended to its top-level object (the body
/// was validated as a JSON object; later keys win over any the client sent). A batch
/// of `n` prompts gets a list of `n` of each field, with a fresh room for every prompt,
/// as SGLang reads a batch's bootstrap fields item by item.
fn with_bootstrap(body: &Bytes, prefill: &Engine, batch: Option<usize>, rooms: &[u64]) -> Bytes {
    use std::fmt::Write;
    let host = prefill
        .url()
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_owned()))
        .unwrap_or_default();
    let host = serde_json::Value::String(host).to_string();
    let port = prefill
        .bootstrap_port()
        .map_or_else(|| "null".to_owned(), |p| p.to_string());
    let mut fields = String::new();
    match batch {
        None => {
            let _ = write!(
                fields,
                r#""bootstrap_host":{host},"bootstrap_port":{port},"bootstrap_room":{}"#,
                rooms.first().copied().unwrap_or_default()
            );
        }
        Some(n) => {
            let list = |item: &str| vec![item; n].join(",");
            let rooms: Vec<String> = rooms.iter().map(u64::to_string).collect();
            let _ = write!(
                fields,
                r#""bootstrap_host":[{}],"bootstrap_port":[{}],"bootstrap_room":[{}]"#,
                list(&host),
                list(&port),
                rooms.join(",")
            );
        }
    }
    with_fields(body, &fields)
}

/// The body (a JSON object, as validated) with `fields` (`"key":value` pairs) appended
/// to its top level: later keys win over any the client sent.
fn with_fields(body: &Bytes, fields: &str) -> Bytes {
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

#[cfg(test)]
mod tests {
    use router_state::Role;
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn bootstrap_fields_are_appended_to_the_object() {
        let prefill = Engine::new("P1", "http://10.0.0.5:30000", "m", Role::Prefill)
            .with_bootstrap_port(8998);
        let body = Bytes::from_static(br#"{"model":"m","messages":[],"bootstrap_room":1} "#);
        let spliced: Value =
            serde_json::from_slice(&with_bootstrap(&body, &prefill, None, &[42])).unwrap();
        assert_eq!(spliced["bootstrap_host"], "10.0.0.5");
        assert_eq!(spliced["bootstrap_port"], 8998);
        assert_eq!(
            spliced["bootstrap_room"], 42,
            "the router's room wins over the client's"
        );
        assert_eq!(spliced["model"], "m");
        let no_port = Engine::new("P2", "http://[::1]:1", "m", Role::Prefill);
        let spliced: Value = serde_json::from_slice(&with_bootstrap(
            &Bytes::from_static(b"{}"),
            &no_port,
            None,
            &[7],
        ))
        .unwrap();
        assert_eq!(
            spliced,
            json!({"bootstrap_host": "::1", "bootstrap_port": null, "bootstrap_room": 7})
        );
        let batch = Bytes::from_static(br#"{"text":["a","b","c"]}"#);
        let spliced: Value =
            serde_json::from_slice(&with_bootstrap(&batch, &prefill, Some(3), &[10, 11, 12]))
                .unwrap();
        assert_eq!(
            spliced,
            json!({
                "text": ["a", "b", "c"],
                "bootstrap_host": ["10.0.0.5", "10.0.0.5", "10.0.0.5"],
                "bootstrap_port": [8998, 8998, 8998],
                "bootstrap_room": [10, 11, 12],
            }),
            "a batch gets a list of each field and a room for every prompt"
        );
    }
}
