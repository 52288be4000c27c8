//! What selection knows of one request: prepared once by the handler, read by the
//! bucket loop and, with the stage and bucket of a pick, by every policy.

use router_state::EngineId;

use crate::cache::PrefixMemo;
use crate::error::PickError;
use crate::explain::{Explanation, Observation};

/// The facts of one request.
///
/// It carries no HTTP body, handles or load observations: policies read those from
/// their own state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestFacts<'a> {
    /// The model clients asked for.
    pub model: &'a str,
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
    /// Engines no pick may return (the engines a retried request failed on): groups
    /// leave them out of the candidates a policy sees.
    pub excluded: &'a [EngineId],
    /// The LoRA adapter the request is for (`None`: the base model): groups offer
    /// only engines that serve it, and its prompt is looked up in the adapter's cache
    /// namespace.
    pub adapter: Option<&'a str>,
    /// The cache namespace its prompt is looked up in when it is not the adapter's
    /// (a request with a `cache_salt`: `kv_events::cache_namespace`).
    pub cache_namespace: Option<&'a str>,
    /// Where selection records what it saw; a dry-run explanation's selection is made
    /// without effects (see [`Explanation`]).
    pub explain: Option<&'a Explanation>,
    /// Whether the bucket loop times each bucket it tries (for the router's spans).
    pub timed: bool,
}

impl<'a> RequestFacts<'a> {
    /// A request with no output budget, token ids or keys.
    pub fn new(model: &'a str, input_tokens: u64) -> Self {
        Self {
            model,
            input_tokens,
            expected_peak_tokens: None,
            token_ids: None,
            session_key: None,
            routing_key: None,
            prefix_memo: None,
            excluded: &[],
            adapter: None,
            cache_namespace: None,
            explain: None,
            timed: false,
        }
    }

    /// Sets the expected peak from the request's maximum output tokens.
    ///
    /// # Errors
    /// [`PickError::InvalidSignal`] when input plus output overflows.
    pub fn with_max_output_tokens(
        mut self,
        max_output_tokens: Option<u64>,
    ) -> Result<Self, PickError> {
        self.expected_peak_tokens = expected_peak(self.input_tokens, max_output_tokens)?;
        Ok(self)
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

    /// Sets the memo that shares prefix lookups across bucket attempts.
    pub fn with_prefix_memo(mut self, memo: Option<&'a PrefixMemo>) -> Self {
        self.prefix_memo = memo;
        self
    }

    /// Sets the engines no pick may return.
    pub fn with_excluded(mut self, engines: &'a [EngineId]) -> Self {
        self.excluded = engines;
        self
    }

    /// Sets the LoRA adapter the request is for.
    pub fn with_adapter(mut self, adapter: Option<&'a str>) -> Self {
        self.adapter = adapter;
        self
    }

    /// Sets the cache namespace the prompt is looked up in (see
    /// [`cache_namespace`](Self::cache_namespace)).
    pub fn with_cache_namespace(mut self, namespace: Option<&'a str>) -> Self {
        self.cache_namespace = namespace;
        self
    }

    /// The cache namespace the prompt's pages are looked up in: the one set, else
    /// the adapter's.
    pub fn lookup_namespace(&self) -> Option<&'a str> {
        self.cache_namespace.or(self.adapter)
    }

    /// Has the selection recorded in `explanation` (and, for a dry run, made without
    /// effects).
    pub fn with_explanation(mut self, explanation: Option<&'a Explanation>) -> Self {
        self.explain = explanation;
        self
    }

    /// Has the bucket loop time each bucket it tries.
    pub fn with_timing(mut self, timed: bool) -> Self {
        self.timed = timed;
        self
    }

    /// Whether selection is a dry run, and so must change nothing.
    pub fn is_dry_run(&self) -> bool {
        self.explain.is_some_and(Explanation::is_dry_run)
    }

    /// Whether observations of the selection are kept: worth building (see
    /// [`observe`](Self::observe)).
    pub fn keeps_observations(&self) -> bool {
        self.explain.is_some_and(Explanation::keeps_observations)
    }

    /// Whether the policy's own rotation and generator move on: in every pick but a
    /// dry run's (see [`Explanation::shadow`]).
    pub fn moves_own_state(&self) -> bool {
        self.explain.is_none_or(Explanation::moves_own_state)
    }

    /// Records what `observation` builds, when the request carries an explanation
    /// that keeps it.
    pub fn observe(&self, observation: impl FnOnce() -> Observation) {
        if let Some(explanation) = self.explain
            && explanation.keeps_observations()
        {
            explanation.record(observation());
        }
    }
}

/// Input plus maximum output tokens, checked for overflow; `None` when the output
/// budget is unknown.
///
/// # Errors
/// [`PickError::InvalidSignal`] when the sum does not fit in a `u64`.
pub fn expected_peak(
    input_tokens: u64,
    max_output_tokens: Option<u64>,
) -> Result<Option<u64>, PickError> {
    max_output_tokens
        .map(|output| {
            input_tokens
                .checked_add(output)
                .ok_or_else(|| PickError::InvalidSignal {
                    stage: None,
                    message: format!(
                        "{input_tokens} input tokens plus {output} output tokens overflows"
                    ),
                })
        })
        .transpose()
}
