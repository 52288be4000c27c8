//! Every outcome of a pick other than success.

use std::fmt;

use router_state::{EngineId, PdMismatch, Role};

/// One engine turned away by admission, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The engine.
    pub engine: EngineId,
    /// The cap it reached.
    pub exceeded: LimitExceeded,
}

/// A cap an engine's metric reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitExceeded {
    /// Configuration name of the cap, e.g. `max_running_requests`.
    pub limit: &'static str,
    /// The engine's current value of the capped metric.
    pub observed: u64,
    /// The cap.
    pub cap: u64,
}

impl fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} >= {})", self.limit, self.observed, self.cap)
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.engine, self.exceeded)
    }
}

/// A prefill engine and a decode engine that cannot hand a request's KV cache over,
/// and the first thing they disagree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpaired {
    /// The prefill engine.
    pub prefill: EngineId,
    /// The decode engine.
    pub decode: EngineId,
    /// What they disagree on.
    pub mismatch: PdMismatch,
}

impl fmt::Display for Unpaired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "prefill {} and decode {}: {}",
            self.prefill, self.decode, self.mismatch
        )
    }
}

/// The most unpaired engine pairs a [`PickError::NoCompatiblePair`] names.
pub const MAX_UNPAIRED_NAMED: usize = 8;

/// Why no engine was picked.
///
/// [`advances_to_next_bucket`](Self::advances_to_next_bucket) tells the bucket loop
/// whether to try the next bucket; every other outcome stops routing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PickError {
    /// No bucket supports the request's length.
    #[error("no bucket accepts a request of {input_tokens} input tokens{}", peak_suffix(*.expected_peak_tokens))]
    NoMatchingBucket {
        /// Prompt length.
        input_tokens: u64,
        /// Prompt plus maximum output, when known.
        expected_peak_tokens: Option<u64>,
    },
    /// No eligible engine (none healthy in the group), or the policy had no selection.
    #[error("no {stage} engine is available")]
    NoCandidates {
        /// The stage being picked.
        stage: Role,
    },
    /// The policy tried every candidate it may and admission rejected each.
    #[error("every {stage} engine is at capacity: {}", join(rejections))]
    NoAdmissibleEngine {
        /// The stage being picked.
        stage: Role,
        /// One entry per rejected engine.
        rejections: Vec<Rejection>,
    },
    /// The engine the policy chose failed admission, and the policy does not look
    /// further (power-of-two).
    #[error("{stage} engine {rejection}")]
    AdmissionRejected {
        /// The stage being picked.
        stage: Role,
        /// The chosen engine and the cap it reached.
        rejection: Rejection,
    },
    /// A PD bucket has prefill and decode candidates, but no prefill engine among
    /// them can hand its KV cache to any of the decode engines: they disagree on
    /// what the hand-over needs (transfer backend, page size, ...).
    #[error("no prefill engine can hand its KV cache to a decode engine: {}", join_unpaired(unpaired, *pairs))]
    NoCompatiblePair {
        /// The first pairs that cannot hand over (at most [`MAX_UNPAIRED_NAMED`]),
        /// each with the first thing its engines disagree on.
        unpaired: Vec<Unpaired>,
        /// How many pairs of the bucket's candidates cannot hand over (all of them).
        pairs: usize,
    },
    /// A request fact the policy cannot work with (e.g. an expected peak below the
    /// prompt length), or an admission check that failed.
    #[error("invalid routing signal: {message}")]
    InvalidSignal {
        /// The stage, when a stage was being picked.
        stage: Option<Role>,
        /// What was wrong.
        message: String,
    },
    /// A policy is configured in a way it cannot run.
    #[error("invalid policy configuration: {message}")]
    InvalidConfiguration {
        /// The stage, when a stage was being picked.
        stage: Option<Role>,
        /// What was wrong.
        message: String,
    },
    /// The policy returned an engine that is not one of its candidates (including a
    /// different `Arc` with a candidate's id).
    #[error("policy returned engine {engine}, which is not one of its {stage} candidates")]
    OutsideCandidates {
        /// The stage being picked.
        stage: Role,
        /// The engine returned.
        engine: EngineId,
    },
}

impl PickError {
    /// Whether the bucket loop should try the next bucket: true for missing candidates
    /// and admission rejections, false for everything that signals a defect.
    pub fn advances_to_next_bucket(&self) -> bool {
        matches!(
            self,
            PickError::NoCandidates { .. }
                | PickError::NoAdmissibleEngine { .. }
                | PickError::AdmissionRejected { .. }
                | PickError::NoCompatiblePair { .. }
        )
    }

    /// The stage the failure belongs to, when there is one.
    pub fn stage(&self) -> Option<Role> {
        match self {
            PickError::NoMatchingBucket { .. } => None,
            PickError::NoCompatiblePair { .. } => Some(Role::Prefill),
            PickError::NoCandidates { stage }
            | PickError::NoAdmissibleEngine { stage, .. }
            | PickError::AdmissionRejected { stage, .. }
            | PickError::OutsideCandidates { stage, .. } => Some(*stage),
            PickError::InvalidSignal { stage, .. }
            | PickError::InvalidConfiguration { stage, .. } => *stage,
        }
    }

    /// The admission rejections this failure carries.
    pub fn rejections(&self) -> &[Rejection] {
        match self {
            PickError::NoAdmissibleEngine { rejections, .. } => rejections,
            PickError::AdmissionRejected { rejection, .. } => std::slice::from_ref(rejection),
            _ => &[],
        }
    }

    /// Stable machine-readable code for metrics and API errors.
    pub fn code(&self) -> &'static str {
        match self {
            PickError::NoMatchingBucket { .. } => "no_matching_bucket",
            PickError::NoCandidates { .. } => "no_candidates",
            PickError::NoAdmissibleEngine { .. } => "no_admissible_engine",
            PickError::AdmissionRejected { .. } => "admission_rejected",
            PickError::NoCompatiblePair { .. } => "no_compatible_pair",
            PickError::InvalidSignal { .. } => "invalid_signal",
            PickError::InvalidConfiguration { .. } => "invalid_configuration",
            PickError::OutsideCandidates { .. } => "outside_candidates",
        }
    }
}

fn peak_suffix(peak: Option<u64>) -> String {
    peak.map(|p| format!(" with an expected peak of {p} tokens"))
        .unwrap_or_default()
}

fn join_unpaired(unpaired: &[Unpaired], pairs: usize) -> String {
    let named = unpaired
        .iter()
        .map(Unpaired::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    match pairs.saturating_sub(unpaired.len()) {
        0 => named,
        more => format!("{named}; and {more} more pairs"),
    }
}

fn join(rejections: &[Rejection]) -> String {
    rejections
        .iter()
        .map(Rejection::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
