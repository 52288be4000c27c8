//! Service-level targets: a bucket may declare a time to first token and a time per
//! output token, and a request goes first to the fitting buckets predicted to meet
//! them. A bucket predicted to miss its targets is tried after the other fitting
//! buckets when one of them, with candidates, is predicted closer to those targets:
//! shorter on every target missed (or unknown there: it may meet them, and trying it
//! is how it becomes known) and within every target met (or unknown). Each part keeps
//! resolution order; a bucket alone, one whose own prediction is unknown, and one no
//! other bucket beats keep their places.
//!
//! A bucket's prediction is the worst of its candidates' (its policy may send the
//! request to any of them; the best alone was measured to let a bucket queue past its
//! target): time to first token is an engine's reported prefill queue (corrected by the dispatches its report
//! has not seen) plus the prompt's own prefill at the engine's measured prefill speed,
//! on the plain or prefill engines; time per output token is what the router measured
//! on the plain or decode engines' streamed answers
//! ([`LoadSnapshot::tpot`](router_state::LoadSnapshot::tpot)). The whole prompt counts
//! as uncached, so the time to first token is an upper bound where caches hold part of
//! it.

use std::sync::Arc;
use std::time::Duration;

use router_policy::{Observation, RequestFacts};
use router_state::{Engine, LoadSnapshot, RegistrySnapshot, Role};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::bucket::{Bucket, BucketGroups};

/// The longest target accepted, milliseconds (an hour).
pub const MAX_SLO_MS: u64 = 3_600_000;

/// A bucket's latency targets; at least one is set.
///
/// ```yaml
/// slo: {ttft_ms: 500, tpot_ms: 50}
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SloTargets {
    /// Time to first token, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<u64>,
    /// Time per output token, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<u64>,
}

impl SloTargets {
    /// Why the targets are invalid, if they are: none set, or one outside 1 ms to
    /// [`MAX_SLO_MS`].
    pub fn problem(&self) -> Option<String> {
        if self.ttft_ms.is_none() && self.tpot_ms.is_none() {
            return Some("set ttft_ms, tpot_ms or both".into());
        }
        [("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms)]
            .into_iter()
            .find_map(|(name, ms)| {
                ms.filter(|ms| !(1..=MAX_SLO_MS).contains(ms))
                    .map(|_| format!("{name} must be 1 to {MAX_SLO_MS}"))
            })
    }
}

/// What a bucket's engines are predicted to deliver a request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SloPrediction {
    /// The longest predicted time to first token of the candidates that report a
    /// prefill queue and speed; `None` when none does.
    pub ttft: Option<Duration>,
    /// The longest time per output token of the candidates with a fresh measurement;
    /// `None` when none has one.
    pub tpot: Option<Duration>,
}

impl SloPrediction {
    /// `Some(false)` when a known prediction exceeds its target, `Some(true)` when
    /// every target's prediction is known and within it, `None` otherwise.
    pub fn meets(&self, targets: &SloTargets) -> Option<bool> {
        let verdicts = [(targets.ttft_ms, self.ttft), (targets.tpot_ms, self.tpot)]
            .into_iter()
            .filter_map(|(target, predicted)| {
                let target = Duration::from_millis(target?);
                Some(predicted.map(|p| p <= target))
            });
        let mut all_known = true;
        for verdict in verdicts {
            match verdict {
                Some(false) => return Some(false),
                Some(true) => {}
                None => all_known = false,
            }
        }
        all_known.then_some(true)
    }

    /// Whether this prediction is closer to `targets` than `missing` (which misses
    /// them): on every target `missing` misses, unknown or shorter; on every other,
    /// unknown or within it.
    fn closer(&self, missing: &SloPrediction, targets: &SloTargets) -> bool {
        let closer = |target: Option<u64>, mine: Option<Duration>, theirs: Option<Duration>| {
            let Some(target) = target.map(Duration::from_millis) else {
                return true;
            };
            match (mine, theirs) {
                (None, _) => true,
                (Some(mine), Some(theirs)) if theirs > target => mine < theirs,
                (Some(mine), _) => mine <= target,
            }
        };
        closer(targets.ttft_ms, self.ttft, missing.ttft)
            && closer(targets.tpot_ms, self.tpot, missing.tpot)
    }
}

impl Bucket {
    /// What the bucket's candidates (as its groups would offer them `request`) are
    /// predicted to deliver it now; `None` for a bucket given no load table
    /// ([`Bucket::with_load`]) or without a candidate in a stage.
    pub fn predict(
        &self,
        engines: &RegistrySnapshot,
        request: &RequestFacts<'_>,
    ) -> Option<SloPrediction> {
        let load = self.load.as_ref()?.snapshot();
        let eligible = |group: &crate::EngineGroup, stage: Role| {
            let candidates = group.eligible(engines, &self.pick_request(request, stage));
            (!candidates.is_empty()).then_some(candidates)
        };
        // The plain group both prefills and decodes.
        let (first, decode) = match self.groups() {
            BucketGroups::Plain(group) => (eligible(group, Role::Plain)?, None),
            BucketGroups::Pd { prefill, decode } => (
                eligible(prefill, Role::Prefill)?,
                Some(eligible(decode, Role::Decode)?),
            ),
        };
        let generating = decode.as_ref().unwrap_or(&first);
        let input = request.input_tokens;
        Some(SloPrediction {
            ttft: first.iter().filter_map(|e| ttft(&load, e, input)).max(),
            tpot: generating.iter().filter_map(|e| load.tpot(e.id())).max(),
        })
    }
}

/// An engine's predicted time to first token for a prompt of `input` tokens: its
/// prefill queue, then the prompt on one of its ranks.
fn ttft(load: &LoadSnapshot, engine: &Engine, input: u64) -> Option<Duration> {
    let observation = load.observe(engine.id());
    let speed = observation.reported?.native?.prefill_tokens_per_sec?;
    let queue_ms = observation.corrected_prefill_queue_ms(input)?;
    let rank_speed = speed / f64::from(engine.dp_size().get());
    let own_ms = 1000.0 * input as f64 / rank_speed;
    Duration::try_from_secs_f64((queue_ms + own_ms) / 1000.0).ok()
}

/// `buckets` in the order to try them: each predicted to miss its targets (while
/// another fitting bucket with candidates is predicted closer to them) tried after
/// the rest, each part keeping its order. Each check is recorded on the request's
/// explanation; the ids of the buckets whose place changed are returned too.
pub(crate) fn order<'a>(
    buckets: Vec<&'a Bucket>,
    engines: &RegistrySnapshot,
    request: &RequestFacts<'_>,
) -> (Vec<&'a Bucket>, Vec<Arc<str>>) {
    // One fitting bucket keeps its place whatever it predicts.
    if buckets.len() < 2 || buckets.iter().all(|b| b.slo().is_none()) {
        return (buckets, Vec::new());
    }
    let predicted: Vec<Option<SloPrediction>> = buckets
        .iter()
        .map(|b| b.predict(engines, request))
        .collect();
    let demote: Vec<bool> = buckets
        .iter()
        .enumerate()
        .map(|(i, bucket)| {
            let Some(targets) = bucket.slo() else {
                return false;
            };
            let p = predicted[i].unwrap_or_default();
            let meets = p.meets(&targets);
            let closer_elsewhere = predicted
                .iter()
                .enumerate()
                .any(|(j, other)| j != i && other.is_some_and(|o| o.closer(&p, &targets)));
            let demoted = meets == Some(false) && closer_elsewhere;
            request.observe(|| Observation::Slo {
                bucket: bucket.id().to_owned(),
                ttft_ms: targets.ttft_ms,
                tpot_ms: targets.tpot_ms,
                predicted_ttft_us: p.ttft.map(micros),
                predicted_tpot_us: p.tpot.map(micros),
                meets,
                demoted,
            });
            demoted
        })
        .collect();
    // A demoted bucket changes place only when a bucket left before it comes after it.
    let moved_ids = buckets
        .iter()
        .enumerate()
        .filter(|(i, _)| demote[*i] && demote[i + 1..].iter().any(|d| !d))
        .map(|(_, b)| Arc::from(b.id()))
        .collect();
    let (mut kept, mut moved) = (Vec::with_capacity(buckets.len()), Vec::new());
    for (bucket, demoted) in buckets.into_iter().zip(demote) {
        if demoted {
            moved.push(bucket);
        } else {
            kept.push(bucket);
        }
    }
    kept.extend(moved);
    (kept, moved_ids)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
