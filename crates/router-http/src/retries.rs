//! The router-wide retry budget: retries allowed in a sliding window, a floor plus a
//! fraction of the requests dispatched in it, so engines that all refuse cannot turn
//! every request into several.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use router_config::RetryConfig;

/// The window is counted in this many slots: a request leaves the count between
/// `window` and `window + window / SLOTS` after it was recorded.
const SLOTS: usize = 10;

/// Why a request was sent again, the label of `switchyard_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryReason {
    /// No connection: refused, unreachable or timed out.
    ConnectFailed,
    /// The connection broke before the request was written.
    NotWritten,
    /// The engine answered 429 before any byte reached the client.
    Status429,
    /// The engine answered 503 before any byte reached the client.
    Status503,
}

impl RetryReason {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::ConnectFailed => "connect_failed",
            Self::NotWritten => "not_written",
            Self::Status429 => "status_429",
            Self::Status503 => "status_503",
        }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct RetryBudget {
    max_attempts: u32,
    ratio: f64,
    floor: u32,
    slot_length: Duration,
    start: Instant,
    slots: Mutex<[Slot; SLOTS]>,
}

/// The requests and retries of one slot of the window.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// Which slot of time since the start this is.
    tick: u64,
    requests: u64,
    retries: u64,
}

impl RetryBudget {
    /// The budget `config` sets, its window starting now.
    pub(crate) fn new(config: &RetryConfig) -> Self {
        let window = Duration::from_millis(config.budget_window_ms.max(1));
        Self {
            max_attempts: config.max_attempts.max(1),
            ratio: config.budget_ratio,
            floor: config.budget_floor,
            slot_length: (window / SLOTS as u32).max(Duration::from_micros(1)),
            start: Instant::now(),
            slots: Mutex::new([Slot::default(); SLOTS]),
        }
    }

    /// Most attempts a request gets, the first included.
    pub(crate) fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Counts a request dispatched for the first time.
    pub(crate) fn record_request(&self) {
        if self.max_attempts == 1 {
            return;
        }
        let tick = self.tick();
        let mut slots = self.slots.lock();
        current(&mut slots, tick).requests += 1;
    }

    /// Takes one retry from the budget; `false` when the window has none left.
    pub(crate) fn try_retry(&self) -> bool {
        let tick = self.tick();
        let mut slots = self.slots.lock();
        let (requests, retries) = slots
            .iter()
            .filter(|s| s.tick + SLOTS as u64 > tick)
            .fold((0, 0), |(q, r), s| (q + s.requests, r + s.retries));
        let allowed = f64::from(self.floor) + self.ratio * requests as f64;
        if (retries + 1) as f64 > allowed {
            return false;
        }
        current(&mut slots, tick).retries += 1;
        true
    }

    fn tick(&self) -> u64 {
        let elapsed = self.start.elapsed().as_nanos() / self.slot_length.as_nanos();
        u64::try_from(elapsed).unwrap_or(u64::MAX)
    }
}

/// The slot of `tick`, emptied first when it last held an older tick.
fn current(slots: &mut [Slot; SLOTS], tick: u64) -> &mut Slot {
    let slot = &mut slots[(tick % SLOTS as u64) as usize];
    if slot.tick != tick {
        *slot = Slot {
            tick,
            ..Slot::default()
        };
    }
    slot
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(ratio: f64, floor: u32) -> RetryBudget {
        RetryBudget::new(&RetryConfig {
            max_attempts: 3,
            budget_ratio: ratio,
            budget_floor: floor,
            budget_window_ms: 10_000,
        })
    }

    fn retries_granted(budget: &RetryBudget, asked: usize) -> usize {
        (0..asked).filter(|_| budget.try_retry()).count()
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_allows_its_floor_plus_a_fraction_of_its_requests() {
        let budget = budget(0.2, 3);
        assert_eq!(retries_granted(&budget, 10), 3, "the floor alone");
        for _ in 0..50 {
            budget.record_request();
        }
        assert_eq!(
            retries_granted(&budget, 100),
            10,
            "3 + 0.2 x 50 in all, 3 of them already taken"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_slides() {
        let budget = budget(0.5, 0);
        for _ in 0..10 {
            budget.record_request();
        }
        assert_eq!(retries_granted(&budget, 10), 5);
        tokio::time::advance(Duration::from_millis(9_000)).await;
        assert_eq!(retries_granted(&budget, 10), 0, "still inside the window");
        for _ in 0..4 {
            budget.record_request();
        }
        assert_eq!(retries_granted(&budget, 10), 2, "7 allowed, 5 taken");
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert_eq!(
            retries_granted(&budget, 10),
            0,
            "the first 10 requests and their 5 retries have left: 2 allowed, 2 taken"
        );
        tokio::time::advance(Duration::from_millis(10_000)).await;
        assert_eq!(retries_granted(&budget, 10), 0, "an empty window, no floor");
        budget.record_request();
        budget.record_request();
        assert_eq!(retries_granted(&budget, 10), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn one_attempt_turns_retries_off_and_records_nothing() {
        let budget = RetryBudget::new(&RetryConfig {
            max_attempts: 1,
            ..RetryConfig::default()
        });
        budget.record_request();
        assert!(budget.slots.lock().iter().all(|s| s.requests == 0));
        assert_eq!(budget.max_attempts(), 1);
    }
}
