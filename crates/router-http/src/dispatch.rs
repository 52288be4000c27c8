//! Dispatch of a complete selection, by protocol: one plain engine (`plain`), or a
//! prefill and a decode engine handing the request over as SGLang does (`sglang`:
//! both legs at once, one bootstrap room) or as vLLM does (`vllm`: the prefill leg
//! first, its transfer parameters with the decode leg). Each leg is sent and judged
//! by `leg`; the rank a leg names is `ranks`'; the answer is relayed here.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, header};
use parking_lot::Mutex;
use router_buckets::{BucketPick, EnginePicks};
use router_config::{PdProtocol, RoutingHeaders};
use router_flow::TenantGuard;
use router_policy::Pick;
use router_state::{Engine, EngineId, InflightGuard};
use router_upstream::H1Body;
use tokio::time::Instant;

use crate::app::AppContext;
use crate::decisions::PendingRecord;
use crate::error::ApiError;
use crate::relay::{Companion, Predicted, RelayBody, Tally};
use crate::retries::RetryReason;
use crate::trace::Tracing;

#[cfg(feature = "picker")]
pub(crate) mod gateway;
mod leg;
pub(crate) use leg::with_fields;
mod plain;
mod ranks;
mod sglang;
mod vllm;

const BUCKET: HeaderName = HeaderName::from_static("x-switchyard-bucket");
const ENGINE: HeaderName = HeaderName::from_static("x-switchyard-engine");
const PREFILL: HeaderName = HeaderName::from_static("x-switchyard-prefill");
const DECODE: HeaderName = HeaderName::from_static("x-switchyard-decode");
const REASON: HeaderName = HeaderName::from_static("x-switchyard-reason");
const PROMPT_TOKENS: HeaderName = HeaderName::from_static("x-switchyard-prompt-tokens");
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// What every leg of a request is: where it goes on the engine, and whether its
/// answer is streamed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Leg {
    /// The path on the engine (the endpoint's own).
    pub(crate) path: &'static str,
    /// A streamed answer's head comes before the generation; a whole answer's after.
    pub(crate) stream: bool,
    /// Whether the request names a LoRA adapter: an engine's 404 then has the
    /// engine's adapters read again (it may have unloaded the adapter).
    pub(crate) adapter: bool,
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
    /// The request's count against its tenant's cap: taken by the body that relays
    /// its answer, else released with the error it is answered with.
    pub(crate) tenant: Mutex<Option<TenantGuard>>,
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
                let nobody = Answering::default();
                Ok(relay(ctx, response, None, headers, out, Vec::new(), nobody))
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

/// The routing headers of a plain answer, as many as `shown` allows: the bucket,
/// the engine, and why it was picked (`x-switchyard-reason`).
fn plain_headers(shown: RoutingHeaders, bucket: HeaderValue, pick: &Pick) -> HeaderMap {
    let mut headers = answer_headers(shown, bucket);
    if shown.engine_ids() {
        headers.insert(ENGINE, id_header(&pick.engine));
    }
    if shown.any() {
        headers.insert(REASON, HeaderValue::from_static(pick.reason.as_str()));
    }
    headers
}

/// An engine as an error message names it to the client: `<stage> engine <id>`, or
/// `the <stage> engine` when `routing_headers` keeps engine ids from clients.
fn engine_named(ctx: &AppContext, stage: &str, engine: &Engine) -> String {
    if ctx.routing_headers.engine_ids() {
        format!("{stage} engine {}", engine.id())
    } else {
        format!("the {stage} engine")
    }
}

/// A prefill and a decode engine about to be sent a request: the rank each leg
/// names, one in-flight guard each, and the answer's routing headers, as many as
/// `routing_headers` allows (the bucket, both engines, and why each was picked:
/// `x-switchyard-reason: prefill=<reason>, decode=<reason>`).
struct Pair {
    prefill: Arc<Engine>,
    decode: Arc<Engine>,
    prefill_rank: Option<u32>,
    decode_rank: Option<u32>,
    guards: Vec<InflightGuard>,
    headers: HeaderMap,
}

impl Pair {
    fn new(ctx: &AppContext, bucket: HeaderValue, mut prefill: Pick, mut decode: Pick) -> Self {
        let (prefill_rank, decode_rank) = (ranks::rank(ctx, &prefill), ranks::rank(ctx, &decode));
        let guards = vec![
            ranks::guard(ctx, &mut prefill, prefill_rank),
            ranks::guard(ctx, &mut decode, decode_rank),
        ];
        let shown = ctx.routing_headers;
        let mut headers = answer_headers(shown, bucket);
        if shown.engine_ids() {
            headers.insert(PREFILL, id_header(&prefill.engine));
            headers.insert(DECODE, id_header(&decode.engine));
        }
        if shown.any() {
            let reasons = format!("prefill={}, decode={}", prefill.reason, decode.reason);
            let reasons = HeaderValue::from_str(&reasons).expect("reasons are header-safe");
            headers.insert(REASON, reasons);
        }
        Self {
            prefill: prefill.engine,
            decode: decode.engine,
            prefill_rank,
            decode_rank,
            guards,
            headers,
        }
    }
}

/// The answer's own header map, with its bucket unless `shown` is `none`: room for
/// the routing headers, the relayed ones and the request id without growing. Built
/// once the engines' in-flight guards are held, so that nothing but the rank lies
/// between admission and them.
fn answer_headers(shown: RoutingHeaders, bucket: HeaderValue) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(12);
    if shown.any() {
        headers.insert(BUCKET, bucket);
    }
    headers
}

/// Sends the request to the selected engines, by the model's protocol, and relays
/// the answer.
pub(crate) async fn dispatch(
    ctx: &Arc<AppContext>,
    pick: BucketPick,
    out: &Outgoing,
) -> Result<Response, Failed> {
    let bucket =
        HeaderValue::from_str(&pick.bucket).map_err(|_| ApiError::upstream("invalid bucket id"))?;
    match pick.engines {
        EnginePicks::Plain(pick) => plain::dispatch(ctx, bucket, pick, out).await,
        EnginePicks::Pd { prefill, decode } => match out.pd_protocol {
            PdProtocol::Sglang => sglang::dispatch(ctx, bucket, prefill, decode, out).await,
            PdProtocol::Vllm => vllm::dispatch(ctx, bucket, prefill, decode, out).await,
        },
    }
}

/// The engines behind an answer: the one generating its tokens (the plain or decode
/// engine), and the pick whose prediction of the cached prompt tokens the usage the
/// answer reports is compared with.
#[derive(Debug, Default)]
struct Answering<'a> {
    generating: Option<&'a Engine>,
    predicted: Option<Predicted>,
}

/// Relays an engine's answer; the generating engine's pace is measured on a
/// successful streamed answer of one prompt when the model's buckets have a
/// time-per-token target, and the usage of a successful answer of one prompt is
/// counted under its stage and beside the prediction.
fn relay(
    ctx: &Arc<AppContext>,
    response: Response<H1Body>,
    companion: Option<Companion>,
    mut headers: HeaderMap,
    out: &Outgoing,
    guards: Vec<router_state::InflightGuard>,
    answering: Answering<'_>,
) -> Response {
    let (parts, body) = response.into_parts();
    let status = parts.status;
    let record = out.record.lock().take();
    let one_answered = answering
        .generating
        .filter(|_| out.batch.is_none() && status.is_success());
    let measured = one_answered.filter(|_| out.measure_tpot && out.leg.stream);
    let tally = Tally::new(Arc::clone(ctx), Arc::clone(&out.model), out.started, guards)
        .with_record(record, status.as_u16())
        .with_span(out.trace.span.clone())
        .with_tenant(out.tenant.lock().take())
        .with_tpot(measured)
        .with_usage(
            one_answered.map(|engine| engine.role().as_str()),
            answering.predicted,
        );
    let body = RelayBody::new(body, companion, ctx.idle_timeout, tally);
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
    if ctx.routing_headers.any() {
        headers.insert(PROMPT_TOKENS, HeaderValue::from(out.prompt_tokens));
    }
    *response.headers_mut() = headers;
    response
}

fn id_header(engine: &Engine) -> HeaderValue {
    HeaderValue::from_str(engine.id().as_str())
        .unwrap_or_else(|_| HeaderValue::from_static("invalid-id"))
}
