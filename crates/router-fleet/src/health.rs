//! Engine health: periodic probes with consecutive thresholds, and a circuit breaker
//! fed by dispatches that got no answer (an engine that answers, whatever the status,
//! is alive), with a dispatch-time half-open trial and a bound on the share of a pool
//! that breakers may hold out. An engine is routable when its probes pass and its
//! breaker lets dispatches through; every change of that is written to the registry,
//! which is what candidate sets are built from.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use router_state::{EngineId, Role};
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
    /// Consecutive dispatches without an answer that open an engine's breaker.
    pub breaker_failures: u32,
    /// How long an open breaker waits before its half-open trial.
    pub breaker_cooldown: Duration,
    /// The largest share (percent) of a pool's engines that open breakers may hold
    /// out at once; a breaker that would pass it stays closed. A pool is a model's
    /// engines of one role, and each group of engines the buckets list by id.
    pub max_ejected_percent: u8,
}

impl Default for HealthPolicy {
    /// Probes every 2 s (2 s timeout), unhealthy after 3 failures, healthy after 2
    /// passes, the breaker open after 5 dispatches without an answer for 10 s, at
    /// most half of a pool held out by breakers.
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(2),
            probe_timeout: Duration::from_secs(2),
            failure_threshold: 3,
            success_threshold: 2,
            breaker_failures: 5,
            breaker_cooldown: Duration::from_secs(10),
            max_ejected_percent: 50,
        }
    }
}

/// The breaker of one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breaker {
    /// Dispatches flow; counts consecutive dispatches without an answer.
    Closed {
        /// Consecutive dispatches without an answer so far.
        failures: u32,
    },
    /// No dispatches until the cool-down ends.
    Open {
        /// The end of the cool-down.
        until: Instant,
    },
    /// The cool-down ended: the next dispatch is a trial, and its outcome closes the
    /// breaker or opens it again. The engine takes no other dispatch while the
    /// trial runs.
    HalfOpen {
        /// When the trial began; `None` until a dispatch takes it.
        trial: Option<Instant>,
    },
}

impl Breaker {
    /// Whether dispatches are held back (open, or half-open with its trial running).
    pub fn is_open(self) -> bool {
        matches!(
            self,
            Breaker::Open { .. } | Breaker::HalfOpen { trial: Some(_) }
        )
    }

    /// Whether the breaker holds the engine out of its pools' share: open or
    /// half-open.
    fn ejects(self) -> bool {
        !matches!(self, Breaker::Closed { .. })
    }
}

/// What became of a dispatch, for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatched {
    /// The engine sent a well-formed HTTP answer, whatever its status: it is alive
    /// (a 500 is the request's failure, not the engine's; its health probes say
    /// whether it is well).
    Answered,
    /// No answer: the connection failed, broke or timed out.
    Unanswered,
}

#[derive(Debug)]
struct EngineHealth {
    /// The model and role whose engines form the engine's pool.
    pool: (Arc<str>, Role),
    state: HealthState,
}

#[derive(Debug, Clone, Copy)]
struct HealthState {
    probes_pass: bool,
    failures: u32,
    successes: u32,
    breaker: Breaker,
}

impl HealthState {
    fn routable(&self) -> bool {
        self.probes_pass
            && matches!(
                self.breaker,
                Breaker::Closed { .. } | Breaker::HalfOpen { trial: None }
            )
    }
}

#[derive(Debug, Default)]
struct Book {
    engines: HashMap<EngineId, EngineHealth>,
    /// The groups the buckets list by id: pools of their own.
    groups: Vec<Box<[EngineId]>>,
}

impl Book {
    /// Whether opening `id`'s breaker keeps every pool it is in within `percent`
    /// held out.
    fn may_eject(&self, id: &EngineId, percent: u8) -> bool {
        let Some(pool) = self.engines.get(id).map(|h| &h.pool) else {
            return false;
        };
        let ejected = |ids: &mut dyn Iterator<Item = &EngineId>| {
            let (mut size, mut out) = (0_usize, 0_usize);
            for other in ids {
                if let Some(h) = self.engines.get(other) {
                    size += 1;
                    out += usize::from(h.state.breaker.ejects() || other == id);
                }
            }
            out * 100 <= size * usize::from(percent)
        };
        let mut same_pool = self
            .engines
            .iter()
            .filter(|(_, h)| &h.pool == pool)
            .map(|(other, _)| other);
        ejected(&mut same_pool)
            && self
                .groups
                .iter()
                .filter(|group| group.contains(id))
                .all(|group| ejected(&mut group.iter()))
    }
}

/// Health of every engine.
#[derive(Debug)]
pub(crate) struct HealthBook {
    config: HealthPolicy,
    book: Mutex<Book>,
    /// Engines whose breaker is half-open with no trial yet: dispatches skip the
    /// lock while there are none.
    awaiting_trial: AtomicUsize,
    /// Breakers kept closed because opening them would have passed
    /// `max_ejected_percent`.
    held_closed: AtomicU64,
}

impl HealthBook {
    pub(crate) fn new(config: HealthPolicy) -> Self {
        Self {
            config,
            book: Mutex::default(),
            awaiting_trial: AtomicUsize::new(0),
            held_closed: AtomicU64::new(0),
        }
    }

    pub(crate) fn policy(&self) -> &HealthPolicy {
        &self.config
    }

    /// Starts tracking an engine of `model` in `role`, healthy or not.
    pub(crate) fn insert(&self, id: EngineId, model: &str, role: Role, healthy: bool) {
        let health = EngineHealth {
            pool: (Arc::from(model), role),
            state: HealthState {
                probes_pass: healthy,
                failures: 0,
                successes: 0,
                breaker: Breaker::Closed { failures: 0 },
            },
        };
        if let Some(old) = self.book.lock().engines.insert(id, health) {
            self.forgot(&old);
        }
    }

    pub(crate) fn remove(&self, id: &EngineId) {
        if let Some(old) = self.book.lock().engines.remove(id) {
            self.forgot(&old);
        }
    }

    fn forgot(&self, health: &EngineHealth) {
        if health.state.breaker == (Breaker::HalfOpen { trial: None }) {
            self.awaiting_trial.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Makes each of `groups` (engine ids the buckets list) a pool of its own for
    /// `max_ejected_percent`, in place of the groups set before.
    pub(crate) fn set_groups(&self, groups: Vec<Box<[EngineId]>>) {
        self.book.lock().groups = groups;
    }

    /// The breaker of an engine, for metrics.
    pub(crate) fn breaker(&self, id: &EngineId) -> Option<Breaker> {
        self.book.lock().engines.get(id).map(|h| h.state.breaker)
    }

    /// Breakers kept closed so far because opening them would have held out more
    /// than `max_ejected_percent` of a pool.
    pub(crate) fn held_closed(&self) -> u64 {
        self.held_closed.load(Ordering::Relaxed)
    }

    /// Records one probe at `now`. The first passed probe after an open breaker's
    /// cool-down half-opens it (the next dispatch is its trial), and the one after a trial
    /// that never ended (its client left before an answer) lets another dispatch
    /// try. Returns the new routability when it changed.
    pub(crate) fn record_probe(&self, id: &EngineId, passed: bool, now: Instant) -> Option<bool> {
        let config = self.config;
        self.update(id, |_, h| {
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
            match h.breaker {
                // A failing probe keeps it open: a client's request is no test of an
                // engine whose health check just failed.
                Breaker::Open { until } if now >= until && passed => {
                    h.breaker = Breaker::HalfOpen { trial: None };
                }
                Breaker::HalfOpen { trial: Some(began) }
                    if now >= began + config.breaker_cooldown =>
                {
                    h.breaker = Breaker::HalfOpen { trial: None };
                }
                _ => {}
            }
        })
    }

    /// A dispatch to the engine begins at `now`: when its breaker awaits a trial,
    /// this is it, and the engine takes no other dispatch until it ends. Returns the
    /// new routability when it changed.
    pub(crate) fn begin_dispatch(&self, id: &EngineId, now: Instant) -> Option<bool> {
        if self.awaiting_trial.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.update(id, |_, h| {
            if h.breaker == (Breaker::HalfOpen { trial: None }) {
                h.breaker = Breaker::HalfOpen { trial: Some(now) };
            }
        })
    }

    /// Records one dispatch outcome at `now`. An answer closes the breaker (a
    /// half-open one too); `breaker_failures` dispatches in a row without one open
    /// it, unless that would hold out more than `max_ejected_percent` of a pool;
    /// a half-open trial without one opens it again. Returns the new routability
    /// when it changed.
    pub(crate) fn record_dispatch(
        &self,
        id: &EngineId,
        outcome: Dispatched,
        now: Instant,
    ) -> Option<bool> {
        let config = self.config;
        let open = Breaker::Open {
            until: now + config.breaker_cooldown,
        };
        self.update(id, |book, h| match (h.breaker, outcome) {
            (Breaker::Open { .. }, _) => {}
            (_, Dispatched::Answered) => h.breaker = Breaker::Closed { failures: 0 },
            (Breaker::HalfOpen { .. }, Dispatched::Unanswered) => h.breaker = open,
            (Breaker::Closed { failures }, Dispatched::Unanswered) => {
                let failures = failures.saturating_add(1);
                h.breaker = if failures < config.breaker_failures {
                    Breaker::Closed { failures }
                } else if book.may_eject(id, config.max_ejected_percent) {
                    open
                } else {
                    self.held_closed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        engine = %id,
                        max_ejected_percent = config.max_ejected_percent,
                        "breaker kept closed: opening it would hold out too many of its pool"
                    );
                    Breaker::Closed { failures: 0 }
                };
            }
        })
    }

    /// Applies `f` to the engine's health (with the book, read-only, beside it) and
    /// returns the new routability when it changed.
    fn update(&self, id: &EngineId, f: impl FnOnce(&Book, &mut HealthState)) -> Option<bool> {
        let mut book = self.book.lock();
        let mut health = book.engines.get(id)?.state;
        let before = (health.routable(), health.breaker);
        f(&book, &mut health);
        let after = (health.routable(), health.breaker);
        let awaiting = Breaker::HalfOpen { trial: None };
        match (before.1 == awaiting, after.1 == awaiting) {
            (false, true) => drop(self.awaiting_trial.fetch_add(1, Ordering::Relaxed)),
            (true, false) => drop(self.awaiting_trial.fetch_sub(1, Ordering::Relaxed)),
            _ => {}
        }
        if let Some(engine) = book.engines.get_mut(id) {
            engine.state = health;
        }
        (before.0 != after.0).then_some(after.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Dispatched::{Answered, Unanswered};

    fn book() -> HealthBook {
        HealthBook::new(HealthPolicy {
            failure_threshold: 2,
            success_threshold: 2,
            breaker_failures: 3,
            breaker_cooldown: Duration::from_millis(1000),
            max_ejected_percent: 100,
            ..HealthPolicy::default()
        })
    }

    /// `n` engines of model `m`, all plain and healthy.
    fn pool(book: &HealthBook, n: usize) -> Vec<EngineId> {
        (0..n)
            .map(|i| {
                let id = EngineId::from(format!("e{i}").as_str());
                book.insert(id.clone(), "m", Role::Plain, true);
                id
            })
            .collect()
    }

    fn fail(book: &HealthBook, id: &EngineId, times: usize, now: Instant) -> Option<bool> {
        (0..times)
            .map(|_| book.record_dispatch(id, Unanswered, now))
            .last()
            .flatten()
    }

    #[tokio::test(start_paused = true)]
    async fn probes_need_consecutive_failures_and_successes() {
        let book = book();
        let id = pool(&book, 1).remove(0);
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
    async fn answers_of_any_status_keep_the_breaker_closed() {
        let book = book();
        let id = pool(&book, 1).remove(0);
        let t0 = Instant::now();
        for _ in 0..10 {
            assert_eq!(book.record_dispatch(&id, Answered, t0), None);
        }
        assert_eq!(book.breaker(&id), Some(Breaker::Closed { failures: 0 }));
        assert_eq!(fail(&book, &id, 2, t0), None);
        assert_eq!(
            book.record_dispatch(&id, Answered, t0),
            None,
            "an answer resets the count"
        );
        assert_eq!(fail(&book, &id, 2, t0), None);
        assert_eq!(
            book.breaker(&id),
            Some(Breaker::Closed { failures: 2 }),
            "two unanswered in a row, not three"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_breaker_opens_cools_down_and_takes_one_dispatch_as_its_trial() {
        let book = book();
        let id = pool(&book, 1).remove(0);
        let t0 = Instant::now();
        assert_eq!(
            fail(&book, &id, 3, t0),
            Some(false),
            "three consecutive dispatches without an answer open it"
        );
        assert_eq!(
            book.record_probe(&id, true, t0 + Duration::from_millis(999)),
            None,
            "still cooling down"
        );
        let after = t0 + Duration::from_millis(1000);
        assert_eq!(
            book.record_probe(&id, true, after),
            Some(true),
            "the first probe after the cool-down half-opens it"
        );
        assert_eq!(book.breaker(&id), Some(Breaker::HalfOpen { trial: None }));
        assert_eq!(
            book.begin_dispatch(&id, after),
            Some(false),
            "the trial takes the engine out of the candidates"
        );
        assert_eq!(book.begin_dispatch(&id, after), None, "one trial at a time");
        assert_eq!(
            book.record_dispatch(&id, Unanswered, after),
            None,
            "a trial without an answer opens it again"
        );
        assert_eq!(
            book.breaker(&id),
            Some(Breaker::Open {
                until: after + Duration::from_millis(1000)
            }),
            "for a whole new cool-down"
        );
        assert_eq!(
            book.record_dispatch(&id, Answered, after),
            None,
            "nothing counts while open"
        );
        let later = after + Duration::from_millis(1000);
        assert_eq!(
            book.record_probe(&id, false, later),
            None,
            "a failed probe keeps it open past the cool-down"
        );
        assert!(matches!(book.breaker(&id), Some(Breaker::Open { .. })));
        assert_eq!(book.record_probe(&id, true, later), Some(true));
        book.begin_dispatch(&id, later);
        assert_eq!(
            book.record_dispatch(&id, Answered, later),
            Some(true),
            "an answered trial closes it"
        );
        assert_eq!(book.breaker(&id), Some(Breaker::Closed { failures: 0 }));
        assert_eq!(book.awaiting_trial.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trial_that_never_ends_gives_way_to_another_after_a_cool_down() {
        let book = book();
        let id = pool(&book, 1).remove(0);
        let t0 = Instant::now();
        fail(&book, &id, 3, t0);
        let half = t0 + Duration::from_millis(1000);
        book.record_probe(&id, true, half);
        assert_eq!(book.begin_dispatch(&id, half), Some(false));
        assert_eq!(
            book.record_probe(&id, true, half + Duration::from_millis(999)),
            None
        );
        assert_eq!(
            book.record_probe(&id, true, half + Duration::from_millis(1000)),
            Some(true),
            "the client left: another dispatch may be the trial"
        );
        assert_eq!(book.breaker(&id), Some(Breaker::HalfOpen { trial: None }));
    }

    #[tokio::test(start_paused = true)]
    async fn breakers_hold_out_at_most_the_configured_share_of_a_pool() {
        let book = HealthBook::new(HealthPolicy {
            breaker_failures: 1,
            max_ejected_percent: 50,
            ..HealthPolicy::default()
        });
        let ids = pool(&book, 4);
        let other = EngineId::from("decode");
        book.insert(other.clone(), "m", Role::Decode, true);
        let now = Instant::now();
        assert_eq!(fail(&book, &ids[0], 1, now), Some(false));
        assert_eq!(fail(&book, &ids[1], 1, now), Some(false), "two of four");
        assert_eq!(fail(&book, &ids[2], 1, now), None, "a third is held");
        assert_eq!(book.breaker(&ids[2]), Some(Breaker::Closed { failures: 0 }));
        assert_eq!(book.held_closed(), 1);
        assert_eq!(
            fail(&book, &other, 1, now),
            None,
            "a pool of one keeps its engine"
        );
        // A group the buckets list is a pool of its own.
        let book = HealthBook::new(book.config);
        let ids = pool(&book, 6);
        book.set_groups(vec![Box::new([ids[4].clone(), ids[5].clone()])]);
        assert_eq!(fail(&book, &ids[4], 1, now), Some(false), "one of two");
        assert_eq!(
            fail(&book, &ids[5], 1, now),
            None,
            "two of six in the model, but both of the group"
        );
        assert_eq!(
            fail(&book, &ids[0], 1, now),
            Some(false),
            "outside the group"
        );
        assert_eq!(book.held_closed(), 1);
    }
}
