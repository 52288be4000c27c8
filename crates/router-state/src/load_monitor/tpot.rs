//! Time per output token, as this router measures it on the streamed answers it
//! relays: engines' load reports carry prefill figures but nothing of decoding.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// How long an engine's estimate stays usable after its latest measurement; past it
/// the engine's decoding pace is unknown (it may have emptied, or restarted), and a
/// bucket demoted for it gets requests, so measurements, again.
pub const TPOT_FRESHNESS: Duration = Duration::from_secs(10);
/// The longest time per token a measurement may report; longer ones count as this.
const MAX_TPOT: Duration = Duration::from_secs(60);
/// Each measurement's share of the running estimate.
const WEIGHT: f64 = 0.25;

/// One engine's running estimate: seconds per token, and when it was last measured.
#[derive(Debug, Default)]
pub(super) struct TpotEstimate(Mutex<Option<(f64, Instant)>>);

impl TpotEstimate {
    /// Folds in one answer's time per token, measured at `now`; an estimate gone
    /// stale is replaced.
    pub(super) fn observe(&self, per_token: Duration, now: Instant) {
        let sample = per_token.min(MAX_TPOT).as_secs_f64();
        let mut estimate = self.0.lock();
        let next = match *estimate {
            Some((seconds, at)) if now.saturating_duration_since(at) < TPOT_FRESHNESS => {
                seconds + WEIGHT * (sample - seconds)
            }
            _ => sample,
        };
        *estimate = Some((next, now));
    }

    /// The estimate at `now`, while fresh.
    pub(super) fn at(&self, now: Instant) -> Option<Duration> {
        let estimate = *self.0.lock();
        estimate
            .filter(|(_, at)| now.saturating_duration_since(*at) < TPOT_FRESHNESS)
            .map(|(seconds, _)| Duration::from_secs_f64(seconds))
    }
}
