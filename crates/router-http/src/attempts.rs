//! A request's attempts: its selection dispatched and, when the engine never started
//! the request, another engine of the same bucket (PD: both legs again, with a fresh
//! bootstrap room) within the attempt limit and the router-wide retry budget. The
//! bucket loop is not resumed: a retry is picked by the bucket first chosen, with the
//! engines that failed left out.

use std::sync::Arc;

use axum::response::Response;
use router_buckets::{BucketPick, EnginePicks};
use router_policy::RequestFacts;
use router_state::EngineId;

use crate::app::AppContext;
use crate::dispatch::{Failed, Outgoing, dispatch};
use crate::error::ApiError;
use crate::explanation;
use crate::metrics::{ModelStageLabels, PickLabels, ReasonLabels};
use crate::routing::ModelRoute;

/// Dispatches `pick`, and picks and dispatches again while a failure may be retried.
pub(crate) async fn run(
    ctx: &Arc<AppContext>,
    route: &ModelRoute,
    request: &RequestFacts<'_>,
    mut pick: BucketPick,
    out: &Outgoing,
) -> Result<Response, ApiError> {
    ctx.retries.record_request();
    let mut failed_engines: Vec<EngineId> = Vec::new();
    let mut attempt = 1;
    loop {
        count_picks(ctx, out, &pick, request.input_tokens);
        let bucket = Arc::clone(&pick.bucket);
        let Failed { answer, retry } = match dispatch(ctx, pick, out).await {
            Ok(response) => return Ok(response),
            Err(failed) => failed,
        };
        let Some(retry) = retry.filter(|_| attempt < ctx.retries.max_attempts()) else {
            return answer.into_response(ctx, out);
        };
        failed_engines.push(retry.engine);
        let again = match route.resolver.get(&bucket) {
            Some(bucket) => bucket
                .pick_engines(
                    &ctx.fleet.snapshot(),
                    // A decision record explains the first selection only.
                    &request
                        .with_excluded(&failed_engines)
                        .with_explanation(None),
                )
                .await
                .ok(),
            None => None,
        };
        let Some(again) = again else {
            tracing::debug!(%bucket, reason = retry.reason.as_str(), "no other engine to retry on");
            return answer.into_response(ctx, out);
        };
        if !ctx.retries.try_retry() {
            ctx.metrics.retries_refused.inc();
            tracing::warn!(%bucket, reason = retry.reason.as_str(), "retry budget spent: not retried");
            return answer.into_response(ctx, out);
        }
        // The failed attempt's answer (an engine's connection) goes before the next.
        drop(answer);
        let labels = ReasonLabels {
            reason: retry.reason.as_str(),
        };
        ctx.metrics.retries.get_or_create(&labels).inc();
        let failed = failed_engines.last().map_or("", |e| e.as_str());
        tracing::info!(%bucket, engine = %failed, reason = retry.reason.as_str(), attempt, "sent to another engine");
        if let Some(record) = out.record.lock().as_mut() {
            record.retried(
                failed,
                retry.reason.as_str(),
                explanation::engines(&again.engines),
            );
        }
        pick = again;
        attempt += 1;
    }
}

/// Counts the attempt's picks, and the cached tokens cache-aware picks predicted.
pub(crate) fn count_picks(ctx: &AppContext, out: &Outgoing, pick: &BucketPick, input_tokens: u64) {
    for engine in pick.engines.iter() {
        let labels = PickLabels {
            model: Arc::clone(&out.model),
            bucket: Arc::clone(&pick.bucket),
            stage: engine.engine.role().as_str(),
            engine: Arc::clone(engine.engine.id().as_arc_str()),
            reason: engine.reason.as_str(),
        };
        let id = engine.engine.id().as_str();
        ctx.metrics
            .picks
            .count(&labels, || ctx.fleet.snapshot().get(id).is_some());
        if let Some(cached) = engine.predicted_cached_tokens {
            let labels = ModelStageLabels {
                model: Arc::clone(&out.model),
                stage: engine.engine.role().as_str(),
            };
            ctx.metrics
                .predicted_cached_tokens
                .get_or_create(&labels)
                .inc_by(cached);
            ctx.metrics
                .predicted_prompt_tokens
                .get_or_create(&labels)
                .inc_by(input_tokens);
        }
    }
    if let EnginePicks::Pd { prefill, decode } = &pick.engines {
        tracing::debug!(bucket = %pick.bucket, prefill = %prefill.engine.id(), decode = %decode.engine.id(), "selected");
    }
}
