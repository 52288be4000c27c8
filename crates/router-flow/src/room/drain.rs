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
    /// A room that has granted nothing for longer than its average interval drains no
    /// faster than one entry per that time: the hint grows while the room is stuck.
    pub(super) fn retry_after(&self, len: usize, max_wait: Duration, now: Instant) -> Duration {
        let stalled = self.mark.map_or(0.0, |mark| {
            now.saturating_duration_since(mark).as_secs_f64()
        });
        let secs = match self.interval {
            // len / rate, with rate = 1 / interval.
            Some(interval) => len as f64 * interval.max(stalled),
            None => max_wait.as_secs_f64(),
        };
        let secs = if secs.is_nan() { RETRY_BOUNDS.1 } else { secs };
        let secs = secs.ceil().clamp(RETRY_BOUNDS.0, RETRY_BOUNDS.1);
        Duration::from_secs(secs as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    #[test]
    fn the_hint_follows_the_drain_rate_and_grows_while_nothing_drains() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut drain = Drain::default();
        assert_eq!(
            drain.retry_after(3, WAIT, start),
            WAIT,
            "no grant yet: max_wait"
        );
        drain.backlogged(start);
        for i in 1..=10 {
            drain.granted(at(i * 250));
        }
        assert_eq!(
            drain.retry_after(10, WAIT, at(2_500)),
            Duration::from_secs(3),
            "ten entries at 250 ms each, rounded up"
        );
        assert_eq!(
            drain.retry_after(10, WAIT, at(2_500 + 3_000)),
            Duration::from_secs(30),
            "three seconds without a grant: ten entries at three seconds each"
        );
        assert_eq!(
            drain.retry_after(0, WAIT, at(2_500)),
            Duration::from_secs(1),
            "never below one second"
        );
        assert_eq!(
            drain.retry_after(1_000, WAIT, at(2_500)),
            Duration::from_secs(60),
            "never above a minute"
        );
    }
}
