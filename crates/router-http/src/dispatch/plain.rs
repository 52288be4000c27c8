//! A plain engine's dispatch: one leg, its answer relayed.

use std::sync::Arc;

use axum::response::Response;
use http::HeaderValue;
use router_policy::Pick;

use super::leg::{Target, send};
use super::{Answering, Failed, Outgoing, plain_headers, ranks, relay};
use crate::app::AppContext;
use crate::relay::Predicted;

/// Sends the request to `pick`'s engine (its rank named when it has several) and
/// relays the answer.
pub(super) async fn dispatch(
    ctx: &Arc<AppContext>,
    bucket: HeaderValue,
    mut pick: Pick,
    out: &Outgoing,
) -> Result<Response, Failed> {
    let rank = ranks::rank(ctx, &pick);
    let guards = vec![ranks::guard(ctx, &mut pick, rank)];
    let headers = plain_headers(ctx.routing_headers, bucket, &pick);
    let predicted = Predicted::of(&pick);
    let engine = pick.engine;
    let to = Target {
        engine: &engine,
        stage: "plain",
        rank,
        routing: &headers,
    };
    let body = ranks::with_rank(&out.body, rank);
    let response = send(ctx, to, out.leg, body, &out.request_id, &out.trace).await?;
    let answering = Answering {
        generating: Some(&engine),
        predicted,
    };
    Ok(relay(ctx, response, None, headers, out, guards, answering))
}
