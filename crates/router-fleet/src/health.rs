//! Engine health: periodic probes with consecutive thresholds, and a circuit breaker
//! fed by dispatch failures. An engine is routable when its probes pass and its
//! breaker is closed; every change of that is written to the registry, which is what
//! candidate sets are built from.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use router_state::EngineId;
use tokio::time::Instant;

/// When probes and dispatch failures change an engine's routability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Time between probes of an engine.
    pub interval: Duration,
    /// A probe's timeout.
    pub probe_timeout: Duration,
    /// Consecutive failed probes that make an engine unhealthy.
    pub failure_threshold: u32,
    /// Consecutive passed probes that make an unhealthy engine healthy again.
    pub success_threshold: u32,
    /// Consecutive failed dispatches that open an engine's breaker.
    pub breaker_failures: u32,
    /// How long an open breaker waits before one half-open probe.
    pub breaker_cooldown: Duration,
}

impl Default for HealthPolicy {
    /// Probes every 2 s (2 s timeout), unhealthy after 3 failures, healthy after 2
    /// passes, the breaker open after 5 failed dispatches for 10 s.
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(2),
            probe_timeout: Duration::from_secs(2),
            failure_threshold: 3,
            success_threshold: 2,
            breaker_failures: 5,
            breaker_cooldown: Duration::from_secs(10),
        }
    }
}

/// The breaker of one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breaker {
    /// Dispatches flow; counts consecutive dispatch failures.
    Closed {
        /// Consecutive failed dispatches so far.
        failures: u32,
    },
    /// No dispatches until the cool-down ends.
    Open {
        /// The end of the cool-down.
        until: Instant,
    },
}

impl Breaker {
    /// Whether dispatches are held back.
    pub fn is_open(self) -> bool {
        matches!(self, Breaker::Open { .. })
    }
}

#[derive(Debug, Clone, Copy)]
struct EngineHealth {
    probes_pass: bool,
    failures: u32,
    successes: u32,
    breaker: Breaker,
}

impl EngineHealth {
    fn routable(&self) -> bool {
        self.probes_pass && matches!(self.breaker, Breaker::Closed { .. })
    }
}

/// Health of every engine.
#[derive(Debug)]
pub(crate) struct HealthBook {
    config: HealthPolicy,
    engines: Mutex<HashMap<EngineId, EngineHealth>>,
}

impl HealthBook {
    pub(crate) fn new(config: HealthPolicy) -> Self {
        Self {
            config,
            engines: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn policy(&self) -> &HealthPolicy {
        &self.config
    }

    /// Starts tracking an engine, healthy or not.
    pub(crate) fn insert(&self, id: EngineId, healthy: bool) {
        self.engines.lock().insert(
            id,
            EngineHealth {
                probes_pass: healthy,
                failures: 0,
                successes: 0,
                breaker: Breaker::Closed { failures: 0 },
            },
        );
    }

    pub(crate) fn remove(&self, id: &EngineId) {
        self.engines.lock().remove(id);
    }

    /// The breaker of an engine, for metrics.
    pub(crate) fn breaker(&self, id: &EngineId) -> Option<Breaker> {
        self.engines.lock().get(id).map(|h| h.breaker)
    }

    /// Records one probe at `now`. A probe after an open breaker's cool-down is its
    /// half-open probe: it closes the breaker or opens it for another cool-down.
    /// Returns the new routability when it changed.
    pub(crate) fn record_probe(&self, id: &EngineId, passed: bool, now: Instant) -> Option<bool> {
        let config = self.config;
        self.update(id, |h| {
            if passed {
                h.failures = 0;
                h.successes = h.successes.saturating_add(1);
                if !h.probes_pass && h.successes >= config.success_threshold {
                    h.probes_pass = true;
                }
            } else {
                h.successes = 0;
                h.failures = h.failures.saturating_add(1);
                if h.probes_pass && h.failures >= config.failure_threshold {
                    h.probes_pass = false;
                }
            }
            if let Breaker::Open { until } = h.breaker
                && now >= until
            {
                h.breaker = if passed {
                    Breaker::Closed { failures: 0 }
                } else {
                    Breaker::Open {
                        until: now + config.breaker_cooldown,
                    }
                };
            }
        })
    }

    /// Records one dispatch outcome at `now`; consecutive failures open the breaker.
    /// Returns the new routability when it changed.
    pub(crate) fn record_dispatch(
        &self,
        id: &EngineId,
        succeeded: bool,
        now: Instant,
    ) -> Option<bool> {
        let config = self.config;
        self.update(id, |h| {
            if let Breaker::Closed { failures } = &mut h.breaker {
                if succeeded {
                    *failures = 0;
                } else {
                    *failures += 1;
                    if *failures >= config.breaker_failures {
                        h.breaker = Breaker::Open {
                            until: now + config.breaker_cooldown,
                        };
                    }
                }
            }
        })
    }

    fn update(&self, id: &EngineId, f: impl FnOnce(&mut EngineHealth)) -> Option<bool> {
        let mut engines = self.engines.lock();
        let health = engines.get_mut(id)?;
        let before = health.routable();
        f(health);
        let after = health.routable();
        (before != after).then_some(after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book() -> HealthBook {
        HealthBook::new(HealthPolicy {
            failure_threshold: 2,
            success_threshold: 2,
            breaker_failures: 3,
            breaker_cooldown: Duration::from_millis(1000),
            ..HealthPolicy::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn probes_need_consecutive_failures_and_successes() {
        let book = book();
        let id = EngineId::from("e");
        book.insert(id.clone(), true);
        let now = Instant::now();
        assert_eq!(
            book.record_probe(&id, false, now),
            None,
            "one failure is tolerated"
        );
        assert_eq!(
            book.record_probe(&id, true, now),
            None,
            "a pass resets the failure count"
        );
        assert_eq!(book.record_probe(&id, false, now), None);
        assert_eq!(
            book.record_probe(&id, false, now),
            Some(false),
            "two in a row make it unhealthy"
        );
        assert_eq!(
            book.record_probe(&id, true, now),
            None,
            "one pass is not enough to return"
        );
        assert_eq!(book.record_probe(&id, true, now), Some(true));
        assert_eq!(
            book.record_probe(&EngineId::from("unknown"), true, now),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_breaker_opens_cools_down_and_takes_one_half_open_probe() {
        let book = book();
        let id = EngineId::from("e");
        book.insert(id.clone(), true);
        let t0 = Instant::now();
        assert_eq!(book.record_dispatch(&id, false, t0), None);
        assert_eq!(
            book.record_dispatch(&id, true, t0),
            None,
            "a success resets the count"
        );
        for _ in 0..2 {
            assert_eq!(book.record_dispatch(&id, false, t0), None);
        }
        assert_eq!(
            book.record_dispatch(&id, false, t0),
            Some(false),
            "three consecutive failures open it"
        );
        assert!(matches!(book.breaker(&id), Some(Breaker::Open { .. })));
        assert_eq!(
            book.record_probe(&id, true, t0 + Duration::from_millis(999)),
            None,
            "still cooling down"
        );
        let after = t0 + Duration::from_millis(1000);
        assert_eq!(
            book.record_probe(&id, false, after),
            None,
            "a failed half-open probe reopens it"
        );
        assert_eq!(
            book.breaker(&id),
            Some(Breaker::Open {
                until: after + Duration::from_millis(1000)
            }),
            "for a whole new cool-down"
        );
        assert_eq!(
            book.record_probe(&id, true, after + Duration::from_millis(999)),
            None,
            "a pass during the new cool-down changes nothing"
        );
        assert!(matches!(book.breaker(&id), Some(Breaker::Open { .. })));
        let later = after + Duration::from_millis(1000);
        assert_eq!(
            book.record_probe(&id, true, later),
            Some(true),
            "a passed half-open probe closes it"
        );
        assert_eq!(book.breaker(&id), Some(Breaker::Closed { failures: 0 }));
    }
}
