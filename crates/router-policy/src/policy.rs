//! The policy contract: request facts in, one admitted engine (or a typed failure) out.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use router_state::{Engine, EngineId, Role};

use crate::cache::PrefixMemo;
use crate::error::PickError;
use crate::explain::{Explanation, Observation};

/// A boxed, sendable future, so [`Policy`] stays object-safe and a policy may await
/// remote lookups.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Chooses one engine from a candidate set.
///
/// `engines` is the exact candidate set of one engine group, sorted by id, healthy and
/// of the request's stage. A policy returns an engine from that set that passed its
/// admission check, or a [`PickError`]; it never looks outside the set, never chooses
/// another bucket, and never crosses a PD role boundary. Policies own the state
/// handles they read (load table, affinity store, prefix index), which are given at
/// construction; requests carry only facts.
pub trait Policy: Send + Sync + fmt::Debug {
    /// Picks one engine for `request` from `engines`.
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Engine>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>>;

    /// Whether picks read the prompt ([`PickRequest::token_ids`] or
    /// [`PickRequest::input_tokens`]); a router need not tokenize a prompt that no
    /// policy on its way reads. Every policy is taken to read it unless it says it
    /// does not.
    fn reads_prompt(&self) -> bool {
        true
    }
}

/// The facts of one stage of one request, as a bucket hands them to a group's policy.
///
/// It carries no HTTP body, handles or load observations: policies read those from
/// their own state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PickRequest<'a> {
    /// The model clients asked for.
    pub model: &'a str,
    /// Plain, prefill or decode: the role of the engine being picked.
    pub stage: Role,
    /// Id of the bucket the pick is made in.
    pub bucket_id: &'a str,
    /// Prompt length in tokens.
    pub input_tokens: u64,
    /// Prompt plus maximum output, when the output budget is known.
    pub expected_peak_tokens: Option<u64>,
    /// Prompt token ids, when the router tokenized the request.
    pub token_ids: Option<&'a [u32]>,
    /// Session key (from the session header), for session-aware policies.
    pub session_key: Option<&'a str>,
    /// Routing key (from the routing-key header), for sticky policies.
    pub routing_key: Option<&'a str>,
    /// The request's prefix lookups, shared by every bucket attempt; without one a
    /// cache-aware policy looks up afresh.
    pub prefix_memo: Option<&'a PrefixMemo>,
    /// Engines the pick must not return (the engines a retried request failed on):
    /// the group leaves them out of the candidates a policy sees.
    pub excluded: &'a [EngineId],
    /// The LoRA adapter the request is for (`None`: the base model): the group
    /// offers only engines that serve it, and its prompt is looked up in the
    /// adapter's cache namespace.
    pub adapter: Option<&'a str>,
    /// Where the pick records what it saw; a dry-run explanation's pick is made
    /// without effects (see [`Explanation`]).
    pub explain: Option<&'a Explanation>,
}

impl<'a> PickRequest<'a> {
    /// A request with no peak, token ids or keys.
    pub fn new(model: &'a str, stage: Role, bucket_id: &'a str, input_tokens: u64) -> Self {
        Self {
            model,
            stage,
            bucket_id,
            input_tokens,
            expected_peak_tokens: None,
            token_ids: None,
            session_key: None,
            routing_key: None,
            prefix_memo: None,
            excluded: &[],
            adapter: None,
            explain: None,
        }
    }

    /// Sets the expected peak (prompt plus maximum output).
    pub fn with_expected_peak(mut self, tokens: Option<u64>) -> Self {
        self.expected_peak_tokens = tokens;
        self
    }

    /// Sets the prompt's token ids.
    pub fn with_token_ids(mut self, token_ids: Option<&'a [u32]>) -> Self {
        self.token_ids = token_ids;
        self
    }

    /// Sets the session key.
    pub fn with_session_key(mut self, key: Option<&'a str>) -> Self {
        self.session_key = key;
        self
    }

    /// Sets the routing key.
    pub fn with_routing_key(mut self, key: Option<&'a str>) -> Self {
        self.routing_key = key;
        self
    }

    /// Sets the request's prefix-lookup memo.
    pub fn with_prefix_memo(mut self, memo: Option<&'a PrefixMemo>) -> Self {
        self.prefix_memo = memo;
        self
    }

    /// Sets the engines the pick must not return.
    pub fn with_excluded(mut self, engines: &'a [EngineId]) -> Self {
        self.excluded = engines;
        self
    }

    /// Sets the LoRA adapter the request is for.
    pub fn with_adapter(mut self, adapter: Option<&'a str>) -> Self {
        self.adapter = adapter;
        self
    }

    /// Has the pick recorded in `explanation` (and, for a dry run, made without
    /// effects).
    pub fn with_explanation(mut self, explanation: Option<&'a Explanation>) -> Self {
        self.explain = explanation;
        self
    }

    /// Whether the pick is a dry run, and so must change nothing.
    pub fn is_dry_run(&self) -> bool {
        self.explain.is_some_and(Explanation::is_dry_run)
    }

    /// Records `observation` when the pick is recorded; builds it only then.
    pub fn observe(&self, observation: impl FnOnce() -> Observation) {
        if let Some(explanation) = self.explain {
            explanation.record(observation());
        }
    }
}

/// A successful pick: an engine from the candidate set that passed admission.
#[derive(Debug, Clone)]
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
}

impl Pick {
    /// A pick with no cache prediction.
    pub fn new(engine: Arc<Engine>, reason: PickReason) -> Self {
        Self {
            engine,
            reason,
            predicted_cached_tokens: None,
            rank: None,
        }
    }

    /// Sets the data-parallel rank the request should go to.
    pub fn with_rank(mut self, rank: Option<u32>) -> Self {
        self.rank = rank;
        self
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
