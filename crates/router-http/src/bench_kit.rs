//! A kit for the benches (feature `bench-kit`): for `GET /metrics`, the series a
//! router's answered requests leave in its metrics, counted without sending any, and
//! the exposition as the endpoint renders it; for decision records, what a
//! replayable record adds ([`replay_fields`]).
//!
//! A router whose engines do not answer (they join unhealthy) serves no request, so
//! its exposition lacks the families its traffic would fill; [`count_answers`] fills
//! them as answered requests do, on the same families and with the same labels.

use std::hash::RandomState;
use std::sync::Arc;
use std::time::SystemTime;

use crate::app::AppContext;
use crate::decisions::replay::{self, Prompt};
use crate::metrics::{
    Compared, Format, ModelLabels, ModelStageLabels, PickLabels, RequestLabels, StageLabels,
};

/// Prompt tokens of each counted answer.
const PROMPT_TOKENS: u64 = 300;

/// The reasons of the counted picks, in turn: those of cache-aware picks under
/// shared-prefix traffic.
const REASONS: [&str; 3] = ["cache_hit", "cache_miss", "cache_spill"];

/// Counts on `ctx`'s metrics what `answers` answered chats through each registered
/// engine leave, each picked by a cache-aware pick in its model's first bucket (the
/// reasons [`REASONS`] in turn, a hit predicting half the prompt cached): the
/// request, the pick, the predicted and reported cached tokens, the engine's regret,
/// the upstream latency, the time to the first token and the selection time.
pub fn count_answers(ctx: &AppContext, answers: u64) {
    let snapshot = ctx.fleet.snapshot();
    for engine in snapshot.engines() {
        let Some(route) = ctx.routing.get(engine.model()) else {
            continue;
        };
        let Some(bucket) = route.resolver.buckets().first() else {
            continue;
        };
        let stage = engine.role().as_str();
        let model = Arc::clone(&route.id);
        let metrics = &ctx.metrics;
        for answer in 0..answers {
            let reason = REASONS[(answer % 3) as usize];
            let pick = PickLabels {
                model: Arc::clone(&model),
                bucket: Arc::from(bucket.id()),
                stage,
                engine: Arc::clone(engine.id().as_arc_str()),
                reason,
            };
            metrics.picks.count(&pick, || true);
            let cached = if reason == "cache_hit" {
                PROMPT_TOKENS / 2
            } else {
                0
            };
            let labels = ModelStageLabels {
                model: Arc::clone(&model),
                stage,
            };
            for (family, n) in [
                (&metrics.predicted_cached_tokens, cached),
                (&metrics.predicted_prompt_tokens, PROMPT_TOKENS),
                (&metrics.reported_cached_tokens, cached),
                (&metrics.reported_prompt_tokens, PROMPT_TOKENS),
            ] {
                family.get_or_create(&labels).inc_by(n);
            }
            let compared = Compared {
                prompt_tokens: PROMPT_TOKENS,
                predicted_cached_tokens: cached,
                reported_cached_tokens: cached,
            };
            metrics
                .regret
                .count(engine.id().as_arc_str(), compared, || true);
            metrics
                .upstream_latency
                .get_or_create(&StageLabels { stage })
                .observe(0.002);
            let model_labels = ModelLabels {
                model: Arc::clone(&model),
            };
            metrics
                .time_to_first_token
                .get_or_create(&model_labels)
                .observe(0.003);
            metrics
                .selection
                .get_or_create(&model_labels)
                .observe(0.000_05);
            let request = RequestLabels {
                model: Arc::clone(&model),
                outcome: "ok",
                code: "ok",
            };
            metrics.requests.get_or_create(&request).inc();
        }
    }
}

/// The body `GET /metrics` answers a scraper of `ctx`: OpenMetrics text when
/// `openmetrics` is set, else Prometheus text.
pub fn exposition(ctx: &AppContext, openmetrics: bool) -> String {
    let format = if openmetrics {
        Format::OpenMetrics
    } else {
        Format::Prometheus
    };
    ctx.metrics.encode(format)
}

/// What `decisions.replayable` adds to the record of a request whose prompt is
/// `token_ids`, in pages of `block_size` under `key`, as the record's text holds it:
/// the page hashes, keyed, in hex, and the object serialized.
pub fn replay_fields(token_ids: &[u32], block_size: u32, key: &RandomState) -> String {
    let prompt = Prompt {
        token_ids: Some(token_ids),
        tokens: token_ids.len() as u64,
        block_size,
        namespace: None,
    };
    replay::fields(prompt, SystemTime::now(), key).to_string()
}
