//! How long a client refused for capacity should wait: the soonest the refusing
//! engines' queues are estimated to drain.
//!
//! An engine's drain estimate is its prefill queue time (the uncached tokens waiting,
//! at the prefill speed its counters show, from its fresh native report). The answer
//! is the smallest estimate among the engines that refused, in whole seconds rounded
//! up, between [`MIN_SECONDS`] and [`MAX_SECONDS`]; [`MIN_SECONDS`] when no refusing
//! engine has an estimate.

use router_buckets::SelectError;
use router_state::LoadSnapshot;

/// The shortest wait a refusal asks for.
pub(crate) const MIN_SECONDS: u64 = 1;
/// The longest wait a refusal asks for, whatever the estimates say.
pub(crate) const MAX_SECONDS: u64 = 30;

/// The `Retry-After` seconds for `error` under `load`.
pub(crate) fn seconds(error: &SelectError, load: &LoadSnapshot) -> u64 {
    let soonest_ms = error
        .attempts()
        .iter()
        .flat_map(|attempt| attempt.error.rejections())
        .filter_map(|rejection| {
            load.observe(&rejection.engine)
                .reported?
                .native?
                .prefill_queue_ms
        })
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .reduce(f64::min);
    soonest_ms.map_or(MIN_SECONDS, |ms| {
        ((ms / 1000.0).ceil() as u64).clamp(MIN_SECONDS, MAX_SECONDS)
    })
}

#[cfg(test)]
mod tests;
