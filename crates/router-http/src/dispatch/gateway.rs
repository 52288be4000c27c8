//! A plain engine named to a gateway that sends the request itself (the endpoint
//! picker): the rank the request names, the engine's in-flight guard, the body and
//! the answer's routing headers, as the plain dispatch makes them; the answer is
//! counted by a [`Tally`] the gateway's stream feeds.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use router_buckets::{BucketPick, EnginePicks};

use super::{Outgoing, PROMPT_TOKENS, REQUEST_ID, plain_headers, ranks};
use crate::app::AppContext;
use crate::decisions::PendingRecord;
use crate::error::ApiError;
use crate::relay::{Predicted, Tally};

/// A request's engine, as a gateway is told it.
#[derive(Debug)]
pub(crate) struct Named {
    /// The engine's address, which the gateway connects to.
    pub(crate) address: SocketAddr,
    /// Headers the gateway adds to the request: the rank's, and the request id.
    pub(crate) request_headers: Vec<(HeaderName, HeaderValue)>,
    /// The body the engine is sent.
    pub(crate) body: Bytes,
    /// The routing headers the answer carries to the client, and its request id.
    pub(crate) answer_headers: HeaderMap,
    /// The request's decision record, completed with the answer's status.
    pub(crate) record: Option<PendingRecord>,
    /// Counts the answer as the gateway streams it, holding the engine's guard.
    pub(crate) tally: Tally,
}

/// The address a gateway reaches `engine` at: its URL's, which must be plain
/// `http://` with an IP address and a port (a gateway's original-destination cluster
/// connects to it as it is); `None` otherwise.
pub(crate) fn address(ctx: &AppContext, engine: &router_state::Engine) -> Option<SocketAddr> {
    let origin = ctx.fleet.origin(engine)?;
    if origin.is_tls() {
        return None;
    }
    origin.authority().parse().ok()
}

/// Names `pick`'s engine to the gateway, holding its slot.
///
/// # Errors
/// A prefill/decode pick (two legs: the proxy's only), or an engine without an IP
/// address.
pub(crate) fn name(
    ctx: &Arc<AppContext>,
    pick: BucketPick,
    out: &Outgoing,
) -> Result<Named, ApiError> {
    let bucket =
        HeaderValue::from_str(&pick.bucket).map_err(|_| ApiError::upstream("invalid bucket id"))?;
    let EnginePicks::Plain(mut pick) = pick.engines else {
        return Err(ApiError::unservable(
            "the model is served by prefill/decode pairs, which need two legs; the endpoint picker names one endpoint, so serve it on the proxy path",
        ));
    };
    let Some(address) = address(ctx, &pick.engine) else {
        return Err(ApiError::unservable(
            "the engine picked has no IP address and port a gateway can connect to",
        ));
    };
    let rank = ranks::rank(ctx, &pick);
    let guards = vec![ranks::guard(ctx, &mut pick, rank)];
    let mut answer_headers = plain_headers(ctx.routing_headers, bucket, &pick);
    answer_headers.insert(REQUEST_ID, out.request_id.clone());
    if ctx.routing_headers.any() {
        answer_headers.insert(PROMPT_TOKENS, HeaderValue::from(out.prompt_tokens));
    }
    let mut request_headers = vec![(REQUEST_ID, out.request_id.clone())];
    request_headers.extend(ranks::rank_header(rank));
    let one = out.batch.is_none();
    let measured = (one && out.measure_tpot && out.leg.stream).then_some(&*pick.engine);
    let tally = Tally::new(Arc::clone(ctx), Arc::clone(&out.model), out.started, guards)
        .with_span(out.trace.span.clone())
        .with_tenant(out.tenant.lock().take())
        .with_tpot(measured)
        .with_usage(
            one.then(|| pick.engine.role().as_str()),
            Predicted::of(&pick),
        );
    Ok(Named {
        address,
        request_headers,
        body: ranks::with_rank(&out.body, rank),
        answer_headers,
        record: out.record.lock().take(),
        tally,
    })
}
