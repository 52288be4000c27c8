//! What a successful pick returns: the engine ([`Pick`]) and what it was decided on
//! ([`PickReason`]).

use std::fmt;
use std::sync::Arc;

use router_state::{Engine, EngineReportedLoadTable, InflightGuard, Reservation};

/// A successful pick: an engine from the candidate set that passed admission.
#[derive(Debug)]
pub struct Pick {
    /// The chosen engine (the candidate's own `Arc`).
    pub engine: Arc<Engine>,
    /// Why it was chosen, for metrics and traces.
    pub reason: PickReason,
    /// Prompt tokens the policy expects the engine to find cached, when the policy
    /// predicts it (cache-aware policies).
    pub predicted_cached_tokens: Option<u64>,
    /// The data-parallel rank the request should go to, when the policy knows one
    /// (a cache-aware pick: the rank holding the prefix); otherwise the dispatcher
    /// chooses the engine's least-loaded rank.
    pub rank: Option<u32>,
    /// The request's slot on the engine, when admission reserved one
    /// ([`EngineAdmission::reserve`](crate::EngineAdmission::reserve)): the dispatch
    /// holds it in place of counting the request itself. `None` for a dry run.
    pub reservation: Option<Reservation>,
}

impl Pick {
    /// A pick with no cache prediction.
    pub fn new(engine: Arc<Engine>, reason: PickReason) -> Self {
        Self {
            engine,
            reason,
            predicted_cached_tokens: None,
            rank: None,
            reservation: None,
        }
    }

    /// Sets the data-parallel rank the request should go to.
    pub fn with_rank(mut self, rank: Option<u32>) -> Self {
        self.rank = rank;
        self
    }

    /// The guard that counts the request on the engine (and on `rank` of it) while it
    /// is dispatched: the reservation admission took, dispatched, or else a new count
    /// in `load`.
    pub fn guard(&mut self, load: &EngineReportedLoadTable, rank: Option<u32>) -> InflightGuard {
        let guard = match self.reservation.take() {
            Some(reservation) => reservation.dispatch(),
            None => load.acquire(self.engine.id()),
        };
        match rank {
            Some(rank) => guard.with_rank(rank),
            None => guard,
        }
    }

    /// Sets the predicted cached prompt tokens.
    pub fn with_predicted_cached_tokens(mut self, tokens: u64) -> Self {
        self.predicted_cached_tokens = Some(tokens);
        self
    }
}

/// What a pick was decided on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PickReason {
    /// The only candidate.
    SingleCandidate,
    /// The next engine in rotation.
    RoundRobin,
    /// A uniformly random engine.
    Random,
    /// The lower-pressure engine of two samples, by reported load.
    PowerOfTwoReported,
    /// The lower-pressure engine of two samples, by router-local in-flight requests
    /// (a sampled engine lacked a fresh native report).
    PowerOfTwoLocal,
    /// The least loaded engine by reported load plus dispatches since the report.
    LeastLoadReported,
    /// The least loaded engine by router-local in-flight requests (a candidate lacked
    /// a fresh report).
    LeastLoadLocal,
    /// The policy's first choice was rejected by admission and the next admissible
    /// engine in its own order was taken.
    NextAdmitted,
    /// The admitted prefix holder with the least uncached work.
    CacheHit,
    /// A prefix holder within the switch margin of the best one, because the
    /// pressure guard found the best one's queue clearly worse.
    CacheGuardSwitch,
    /// A prefix holder kept although its queue is over the soft limit, because every
    /// holder (and, with a saturation floor, the whole group) is queued.
    CacheSaturationPin,
    /// An engine holding less of the prefix than a holder (or none of it), because
    /// its predicted time to first token was the shortest (`score: ttft`) or every
    /// holder was over the load bound (`load_bound`).
    CacheSpill,
    /// No engine held enough of the prefix: the least pressured of k samples.
    CacheMiss,
    /// No prefix lookup was possible (the source was unavailable, or the request was
    /// not tokenized): the least pressured of k samples.
    CacheUnavailable,
    /// The engine the session or routing key was bound to.
    AffinityBound,
    /// The fallback's engine, now bound to the session or routing key.
    AffinityAssigned,
    /// The first engine of the key's rendezvous order that admission admitted.
    AffinityRendezvous,
}

impl PickReason {
    /// Stable label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            PickReason::SingleCandidate => "single_candidate",
            PickReason::RoundRobin => "round_robin",
            PickReason::Random => "random",
            PickReason::PowerOfTwoReported => "power_of_two_reported",
            PickReason::PowerOfTwoLocal => "power_of_two_local",
            PickReason::LeastLoadReported => "least_load_reported",
            PickReason::LeastLoadLocal => "least_load_local",
            PickReason::NextAdmitted => "next_admitted",
            PickReason::CacheHit => "cache_hit",
            PickReason::CacheGuardSwitch => "cache_guard_switch",
            PickReason::CacheSaturationPin => "cache_saturation_pin",
            PickReason::CacheSpill => "cache_spill",
            PickReason::CacheMiss => "cache_miss",
            PickReason::CacheUnavailable => "cache_unavailable",
            PickReason::AffinityBound => "affinity_bound",
            PickReason::AffinityAssigned => "affinity_assigned",
            PickReason::AffinityRendezvous => "affinity_rendezvous",
        }
    }
}

impl fmt::Display for PickReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
