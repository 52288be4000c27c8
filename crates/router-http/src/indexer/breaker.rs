//! The breaker of a router's lookups to its prefix indexer: after a failed lookup, no
//! lookup is sent for a cooldown, then one trial lookup; the cooldown doubles while
//! trials fail. A silent indexer thus costs one timeout per cooldown, not one per
//! request.

use std::time::Duration;

use tokio::time::Instant;

/// The cooldown after the first failure.
pub(super) const FIRST_COOLDOWN: Duration = Duration::from_secs(1);

/// The longest cooldown, reached by doubling while trials fail.
pub(super) const LONGEST_COOLDOWN: Duration = Duration::from_secs(16);

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct Breaker {
    state: State,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Lookups go out.
    #[default]
    Closed,
    /// No lookup goes out until `until`.
    Open { until: Instant, cooldown: Duration },
    /// One trial lookup is out.
    Trying { cooldown: Duration },
}

/// What a lookup let out is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    /// An ordinary lookup, the breaker being closed.
    Normal,
    /// The one trial after a cooldown.
    Trial,
}

impl Breaker {
    /// Whether a lookup may go out at `now`, and as what; `None` while open or while
    /// a trial is out.
    pub(super) fn admit(&mut self, now: Instant) -> Option<Pass> {
        match self.state {
            State::Closed => Some(Pass::Normal),
            State::Open { until, cooldown } if now >= until => {
                self.state = State::Trying { cooldown };
                Some(Pass::Trial)
            }
            State::Open { .. } | State::Trying { .. } => None,
        }
    }

    /// Whether lookups go out (neither open nor trying).
    pub(super) fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// A lookup was answered: the breaker closes. True when it was not closed.
    pub(super) fn answered(&mut self) -> bool {
        let was_closed = self.state == State::Closed;
        self.state = State::Closed;
        !was_closed
    }

    /// Lookup `pass` failed at `now`: a closed breaker opens for the first cooldown, a
    /// failed trial opens it for twice the last one (at most the longest). A normal
    /// lookup failing after the breaker opened changes nothing. The new cooldown when
    /// it opened.
    pub(super) fn failed(&mut self, pass: Pass, now: Instant) -> Option<Duration> {
        let cooldown = match (pass, self.state) {
            (Pass::Normal, State::Closed) => FIRST_COOLDOWN,
            (Pass::Trial, State::Trying { cooldown }) => (cooldown * 2).min(LONGEST_COOLDOWN),
            _ => return None,
        };
        self.state = State::Open {
            until: now + cooldown,
            cooldown,
        };
        Some(cooldown)
    }

    /// Lookup `pass` ended without an outcome (its request went away): a trial's
    /// place goes to the next lookup.
    pub(super) fn abandoned(&mut self, pass: Pass, now: Instant) {
        if let (Pass::Trial, State::Trying { cooldown }) = (pass, self.state) {
            self.state = State::Open {
                until: now,
                cooldown,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_opens_it_and_trials_double_the_cooldown_until_one_is_answered() {
        let start = Instant::now();
        let mut breaker = Breaker::default();
        assert_eq!(breaker.admit(start), Some(Pass::Normal));
        assert_eq!(
            breaker.admit(start),
            Some(Pass::Normal),
            "closed: every lookup"
        );
        assert_eq!(breaker.failed(Pass::Normal, start), Some(FIRST_COOLDOWN));
        assert_eq!(
            breaker.failed(Pass::Normal, start),
            None,
            "a lookup sent before it opened changes nothing"
        );
        assert_eq!(breaker.admit(start + FIRST_COOLDOWN / 2), None, "open");
        let trial_at = start + FIRST_COOLDOWN;
        assert_eq!(breaker.admit(trial_at), Some(Pass::Trial));
        assert_eq!(breaker.admit(trial_at), None, "one trial at a time");
        assert_eq!(
            breaker.failed(Pass::Trial, trial_at),
            Some(FIRST_COOLDOWN * 2)
        );
        let mut at = trial_at;
        let mut cooldown = FIRST_COOLDOWN * 2;
        for _ in 0..8 {
            at += cooldown;
            assert_eq!(breaker.admit(at - Duration::from_millis(1)), None);
            assert_eq!(breaker.admit(at), Some(Pass::Trial));
            cooldown = breaker.failed(Pass::Trial, at).unwrap();
        }
        assert_eq!(cooldown, LONGEST_COOLDOWN, "doubling stops at the longest");
        at += cooldown;
        assert_eq!(breaker.admit(at), Some(Pass::Trial));
        assert!(breaker.answered(), "an answered trial closes it");
        assert_eq!(breaker.admit(at), Some(Pass::Normal));
        assert!(!breaker.answered(), "already closed");
    }

    #[test]
    fn an_abandoned_trial_lets_the_next_lookup_try() {
        let start = Instant::now();
        let mut breaker = Breaker::default();
        breaker.failed(Pass::Normal, start);
        let at = start + FIRST_COOLDOWN;
        assert_eq!(breaker.admit(at), Some(Pass::Trial));
        breaker.abandoned(Pass::Trial, at);
        assert_eq!(breaker.admit(at), Some(Pass::Trial));
        breaker.abandoned(Pass::Normal, at);
        assert_eq!(
            breaker.admit(at),
            None,
            "a normal lookup's end frees no trial"
        );
    }
}
