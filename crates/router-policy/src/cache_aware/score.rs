//! `score: ttft`: every engine of the group weighed by its predicted time to first
//! token for this prompt, so a holder's cached tokens are worth what they save and
//! no more than the queue in front of them costs.

use std::cmp::Ordering;
use std::sync::Arc;

use router_state::{Engine, LoadSnapshot};

use super::order::Holder;
use super::window::{self, CACHE_AWARE_WINDOW};
use super::{CacheAwarePolicy, no_admissible};
use crate::error::PickError;
use crate::pick::{Pick, PickReason};
use crate::policy::PickRequest;
use crate::rng::Draws;
use crate::walk::admit;

/// One engine's prediction.
struct Scored {
    index: usize,
    /// Prompt tokens it holds, on any tier.
    matched: u64,
    /// Prompt tokens it would prefill.
    uncached: u64,
    /// Its queue plus this prompt's prefill, milliseconds.
    ttft_ms: f64,
    queued: bool,
}

impl CacheAwarePolicy {
    /// The engine with the shortest predicted time to first token that admission
    /// admits, those the soft queue gate sets aside last; `None` when an engine lacks
    /// a fresh native report with a measured prefill speed (the caller then picks as
    /// `score: cached`). The engines weighed are `holders` (the holders' window) and,
    /// of a group larger than the window, a spread sample of the others
    /// ([`window::spread`]); of a smaller group, every engine.
    pub(super) fn scored(
        &self,
        engines: &[Arc<Engine>],
        request: &PickRequest<'_>,
        holders: &[Holder],
        snapshot: &LoadSnapshot,
        draws: &mut Draws<'_>,
    ) -> Option<Result<Pick, PickError>> {
        let input = request.facts.input_tokens;
        let mut held: Vec<usize> = holders.iter().map(|h| h.index).collect();
        held.sort_unstable();
        let others = window::spread(draws, engines.len(), CACHE_AWARE_WINDOW)
            .into_iter()
            .filter(|i| held.binary_search(i).is_err())
            .map(|i| (i, 0, input, snapshot.observe(engines[i].id())));
        let weighed = holders
            .iter()
            .map(|h| (h.index, h.matched, h.uncached, h.observation))
            .chain(others);
        let mut scored = Vec::with_capacity(holders.len() + CACHE_AWARE_WINDOW);
        for (index, matched, uncached, observation) in weighed {
            let report = observation.reported.as_ref()?;
            let speed = report
                .native_with_capacity()?
                .prefill_tokens_per_sec
                .filter(|s| *s > 0.0)?;
            let queue_ms = observation.corrected_prefill_queue_ms(uncached)?;
            scored.push(Scored {
                index,
                matched,
                uncached,
                ttft_ms: queue_ms + uncached as f64 * 1000.0 / speed,
                queued: self.queued(&observation),
            });
        }
        scored.sort_by(|a, b| {
            a.queued
                .cmp(&b.queued)
                .then(a.ttft_ms.total_cmp(&b.ttft_ms))
                .then(a.uncached.cmp(&b.uncached))
                .then_with(|| engines[a.index].id().cmp(engines[b.index].id()))
        });
        let most_held = scored.iter().map(|s| s.matched).max().unwrap_or(0);
        let mut rejections = Vec::new();
        for candidate in scored {
            let engine = &engines[candidate.index];
            let metrics = snapshot.observe(engine.id()).metrics();
            match admit(self.admission.as_ref(), engine, &metrics, request) {
                Err(e) => return Some(Err(e)),
                Ok(Some(rejection)) => rejections.push(rejection),
                Ok(None) => {
                    let reason = match candidate.matched.cmp(&most_held) {
                        Ordering::Less => PickReason::CacheSpill,
                        _ if most_held == 0 => PickReason::CacheMiss,
                        _ => PickReason::CacheHit,
                    };
                    return Some(Ok(Pick::new(Arc::clone(engine), reason)
                        .with_predicted_cached_tokens(candidate.matched)));
                }
            }
        }
        Some(Err(no_admissible(request.stage, rejections)))
    }
}
