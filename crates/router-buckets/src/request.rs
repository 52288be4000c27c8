//! What the handler hands a bucket, and what a bucket hands back.

use std::sync::Arc;

use router_policy::{Explanation, Observation, Pick, PickError, PrefixMemo};
use router_state::EngineId;

/// The prepared routing facts of one request: extracted once by the handler and
/// reused for every bucket attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BucketRequest<'a> {
    /// The model clients asked for.
    pub model: &'a str,
    /// Prompt length in tokens.
    pub input_tokens: u64,
    /// Prompt plus maximum output, when the output budget is known.
    pub expected_peak_tokens: Option<u64>,
    /// Prompt token ids, when the router tokenized the request.
    pub token_ids: Option<&'a [u32]>,
    /// Session key from the session header.
    pub session_key: Option<&'a str>,
    /// Routing key from the routing-key header.
    pub routing_key: Option<&'a str>,
    /// The request's prefix lookups, shared by every bucket attempt.
    pub prefix_memo: Option<&'a PrefixMemo>,
    /// Engines no pick may return (the engines a retried request failed on).
    pub excluded: &'a [EngineId],
    /// The LoRA adapter the request is for; `None` for the base model.
    pub adapter: Option<&'a str>,
    /// Where the selection records what it saw; a dry-run explanation's selection is
    /// made without effects (see [`Explanation`]).
    pub explain: Option<&'a Explanation>,
    /// Whether the selection times each bucket it tries (for the router's spans).
    pub timed: bool,
}

impl<'a> BucketRequest<'a> {
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
            explain: None,
            timed: false,
        }
    }

    /// Has the selection time each bucket it tries ([`BucketAttempt::took`](crate::BucketAttempt::took)).
    pub fn with_timing(mut self, timed: bool) -> Self {
        self.timed = timed;
        self
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

    /// Has the selection recorded in `explanation` (and, for a dry run, made without
    /// effects).
    pub fn with_explanation(mut self, explanation: Option<&'a Explanation>) -> Self {
        self.explain = explanation;
        self
    }

    /// Records what `observation` builds, when the request carries an explanation.
    pub fn observe(&self, observation: impl FnOnce() -> Observation) {
        if let Some(explanation) = self.explain {
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

/// A complete engine selection from one bucket.
#[derive(Debug, Clone)]
pub struct BucketPick {
    /// The bucket both picks came from.
    pub bucket: Arc<str>,
    /// The engine, or the prefill/decode pair.
    pub engines: EnginePicks,
}

/// One plain engine, or a prefill and a decode engine.
#[derive(Debug, Clone)]
pub enum EnginePicks {
    /// A plain bucket's pick.
    Plain(Pick),
    /// A PD bucket's pair.
    Pd {
        /// The prefill engine.
        prefill: Pick,
        /// The decode engine.
        decode: Pick,
    },
}

impl EnginePicks {
    /// The picks in dispatch order (prefill before decode).
    pub fn iter(&self) -> impl Iterator<Item = &Pick> {
        let (first, second) = match self {
            EnginePicks::Plain(pick) => (pick, None),
            EnginePicks::Pd { prefill, decode } => (prefill, Some(decode)),
        };
        std::iter::once(first).chain(second)
    }
}
