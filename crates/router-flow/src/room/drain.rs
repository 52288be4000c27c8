//! The room's drain rate, from which a refused or expired request learns when to
//! come back.

use std::time::Duration;

use tokio::time::Instant;

/// Weight of the newest interval in the moving average.
const ALPHA: f64 = 0.2;

/// Shortest and longest retry hint, in seconds.
const RETRY_BOUNDS: (f64, f64) = (1.0, 60.0);

/// An exponentially weighted moving average of the time between grants, measured
/// only while the room is non-empty.
#[derive(Debug, Default)]
pub(super) struct Drain {
    /// The last grant, or when the room last became non-empty if later.
    mark: Option<Instant>,
    /// Average seconds between grants; None until a grant was observed.
    interval: Option<f64>,
}

impl Drain {
    /// The room became non-empty at `now`: idle time does not count as slow drain.
    pub(super) fn backlogged(&mut self, now: Instant) {
        self.mark = Some(now);
    }

    /// An entry was granted at `now`.
    pub(super) fn granted(&mut self, now: Instant) {
        if let Some(mark) = self.mark {
            let dt = now.saturating_duration_since(mark).as_secs_f64();
            self.interval = Some(match self.interval {
                None => dt,
                Some(avg) => ALPHA * dt + (1.0 - ALPHA) * avg,
            });
        }
        self.mark = Some(now);
    }

    /// How long `len` waiting entries take to drain at the observed rate, in whole
    /// seconds within [1 s, 60 s]; `max_wait` rounded up before any grant was observed.
    pub(super) fn retry_after(&self, len: usize, max_wait: Duration) -> Duration {
        let secs = match self.interval {
            // len / rate, with rate = 1 / interval.
            Some(interval) => len as f64 * interval,
            None => max_wait.as_secs_f64(),
        };
        let secs = if secs.is_nan() { RETRY_BOUNDS.1 } else { secs };
        let secs = secs.ceil().clamp(RETRY_BOUNDS.0, RETRY_BOUNDS.1);
        Duration::from_secs(secs as u64)
    }
}
