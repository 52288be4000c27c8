//! What a selection saw and decided, recorded while it runs.
//!
//! A request that carries an [`Explanation`] ([`RequestFacts::explain`]) has the
//! group, the policies and admission add [`Observation`]s as they go. A dry-run
//! explanation's pick is made as it would be, with nothing changed: no affinity
//! binding is written, rotation cursors do not advance, and random draws come from a
//! copy of the policy's generator, so the next real request in the same state gets
//! the pick the explanation names. A [shadow](Explanation::shadow) pick changes
//! nothing shared either, but its own policy's rotation and generator move on.
//!
//! [`RequestFacts::explain`]: crate::RequestFacts::explain

use parking_lot::Mutex;
use router_state::{EngineId, EngineMetrics, PdMismatch, Role};

use crate::admission::AdmissionLimits;
use crate::error::{LimitExceeded, PickError};
use crate::pick::PickReason;

/// One thing a selection saw or decided, in one bucket and stage.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Observation {
    /// The candidates a group handed its policy (healthy members of the stage, less
    /// excluded engines, those without the request's adapter and, in a PD bucket,
    /// those that cannot pair with the other stage), sorted by id.
    Candidates {
        /// The bucket.
        bucket: String,
        /// The stage.
        stage: Role,
        /// The candidates.
        engines: Vec<EngineId>,
    },
    /// An engine of a PD bucket left out of its stage's candidates because it cannot
    /// pair with an engine of the other stage: a prefill engine no decode candidate
    /// can take the KV cache of, or a decode engine that cannot take the picked
    /// prefill engine's.
    Unpaired {
        /// The bucket.
        bucket: String,
        /// The stage of the engine left out.
        stage: Role,
        /// The engine left out.
        engine: EngineId,
        /// The engine of the other stage it was paired with in vain.
        with: EngineId,
        /// What they disagree on.
        mismatch: PdMismatch,
    },
    /// Prompt tokens the prefix source found an engine to hold.
    CachedTokens {
        /// The bucket.
        bucket: String,
        /// The stage.
        stage: Role,
        /// The engine.
        engine: EngineId,
        /// The matched prompt tokens.
        tokens: u64,
        /// Of those, the ones held only on a slower tier than the device.
        slower_tokens: u64,
        /// How far behind the engine's KV feed was, milliseconds.
        feed_age_ms: u64,
    },
    /// A bucket's latency targets checked against its candidates before the bucket
    /// loop (buckets predicted to miss are tried last).
    Slo {
        /// The bucket.
        bucket: String,
        /// Its time-to-first-token target, milliseconds.
        ttft_ms: Option<u64>,
        /// Its time-per-output-token target, milliseconds.
        tpot_ms: Option<u64>,
        /// The predicted time to first token (its candidates' longest), microseconds.
        predicted_ttft_us: Option<u64>,
        /// The measured time per output token (its candidates' longest), microseconds.
        predicted_tpot_us: Option<u64>,
        /// Whether the predictions meet the targets (`None`: some unknown, none missed).
        meets: Option<bool>,
        /// Whether the bucket was tried after the others (it misses, and another
        /// fitting bucket is predicted closer to its targets).
        demoted: bool,
    },
    /// The prefix source could not answer; the pick went without it.
    CacheUnavailable {
        /// The bucket.
        bucket: String,
        /// The stage.
        stage: Role,
    },
    /// An admission check: the load figures it read, the caps, and the verdict.
    Admission {
        /// The bucket.
        bucket: String,
        /// The stage.
        stage: Role,
        /// The engine checked.
        engine: EngineId,
        /// The figures the check read.
        metrics: EngineMetrics,
        /// The caps checked, when the admission is a set of caps.
        caps: Option<AdmissionLimits>,
        /// The cap the engine reached; `None` admitted it.
        rejected: Option<LimitExceeded>,
    },
    /// The group's pick.
    Picked {
        /// The bucket.
        bucket: String,
        /// The stage.
        stage: Role,
        /// The engine.
        engine: EngineId,
        /// Why.
        reason: PickReason,
        /// Prompt tokens the policy expects the engine to find cached.
        predicted_cached_tokens: Option<u64>,
    },
    /// The group picked nothing.
    Failed {
        /// The bucket.
        bucket: String,
        /// The stage.
        stage: Role,
        /// Why.
        error: PickError,
    },
    /// What the group's shadow policy picked beside the group's pick, as a dry run.
    Shadow {
        /// The bucket.
        bucket: String,
        /// The stage.
        stage: Role,
        /// The shadow policy's type.
        policy: &'static str,
        /// Its pick; `None` when it picked nothing.
        engine: Option<EngineId>,
        /// Whether it picked the group's engine.
        agreed: bool,
        /// Prompt tokens its engine holds, by the request's prefix lookup.
        cached_tokens: u64,
        /// Prompt tokens the group's own pick holds, by the same lookup.
        live_cached_tokens: u64,
    },
}

/// The observations of one request's selection, in the order they were made: for an
/// explanation ([`dry_run`](Self::dry_run): the selection changes nothing) or for a
/// decision record ([`recording`](Self::recording): the selection runs as usual).
///
/// Its size is bounded by the request's buckets times their candidates: a few
/// observations an engine and bucket.
#[derive(Debug)]
pub struct Explanation {
    observations: Mutex<Vec<Observation>>,
    dry_run: bool,
    /// Whether the policy's own rotation and generator move on (a real or a shadow
    /// pick) or stay (a dry run).
    moves_own_state: bool,
    /// Whether observations are kept (a shadow pick's are not built at all).
    keeps_observations: bool,
}

impl Explanation {
    /// For an explanation: the selection is made without effects.
    pub fn dry_run() -> Self {
        Self {
            observations: Mutex::default(),
            dry_run: true,
            moves_own_state: false,
            keeps_observations: true,
        }
    }

    /// For a decision record: the selection is made as usual, and recorded.
    pub fn recording() -> Self {
        Self {
            observations: Mutex::default(),
            dry_run: false,
            moves_own_state: true,
            keeps_observations: true,
        }
    }

    /// For a shadow policy's pick: nothing shared changes (no affinity binding, no
    /// prefix index touched, nothing reserved), as in a dry run, but the shadow
    /// policy's own rotation and random generator move on, as they would if it were
    /// the live policy, so its picks are not all the same. It keeps no observations.
    pub fn shadow() -> Self {
        Self {
            observations: Mutex::default(),
            dry_run: true,
            moves_own_state: true,
            keeps_observations: false,
        }
    }

    /// Whether the selection must change nothing shared.
    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    /// Whether the policy's own rotation and generator move on.
    pub fn moves_own_state(&self) -> bool {
        self.moves_own_state
    }

    /// Whether observations are kept, and so worth building.
    pub fn keeps_observations(&self) -> bool {
        self.keeps_observations
    }

    /// Adds an observation.
    pub fn record(&self, observation: Observation) {
        self.observations.lock().push(observation);
    }

    /// Forgets the observations so far: a selection made again (a request that
    /// waited for capacity) is recorded as it is made the last time.
    pub fn clear(&self) {
        self.observations.lock().clear();
    }

    /// The observations so far, in order.
    pub fn observations(&self) -> Vec<Observation> {
        self.observations.lock().clone()
    }
}

/// Explanations compare by identity, as the requests that carry them do.
impl PartialEq for Explanation {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Explanation {}
