//! A bucket: a token-length range, a context capacity, a rank, and its engine groups.

use std::sync::Arc;

use router_policy::{PickError, PickRequest, RequestFacts};
use router_state::{EngineReportedLoadTable, ModelMode, RegistrySnapshot, Role};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::group::{EngineGroup, Offer};
use crate::pair;
use crate::pick::{BucketPick, EnginePicks};
use crate::slo::SloTargets;

/// An inclusive range of prompt lengths in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenLimits {
    /// Shortest prompt accepted.
    #[serde(default)]
    pub min: u64,
    /// Longest prompt accepted; absent = unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
}

impl TokenLimits {
    /// Whether `tokens` lies in the range.
    pub fn contains(&self, tokens: u64) -> bool {
        tokens >= self.min && self.max.is_none_or(|max| tokens <= max)
    }
}

/// A bucket's engine groups: one plain group, or a prefill and a decode group. Each
/// bucket is exactly one of these, so a partial or mixed PD bucket cannot be built.
#[derive(Debug, Clone)]
pub enum BucketGroups {
    /// Plain engines.
    Plain(EngineGroup),
    /// Prefill/decode pairs, both picked in this bucket.
    Pd {
        /// The prefill group.
        prefill: EngineGroup,
        /// The decode group.
        decode: EngineGroup,
    },
}

/// Why a bucket could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BucketError {
    /// A bucket needs a non-empty id.
    #[error("bucket id must not be empty")]
    EmptyId,
    /// The token range is empty.
    #[error("bucket {id}: limits.min ({min}) is above limits.max ({max})")]
    EmptyRange {
        /// The bucket.
        id: String,
        /// The range's minimum.
        min: u64,
        /// The range's maximum.
        max: u64,
    },
    /// The context capacity admits no request of the range.
    #[error(
        "bucket {id}: max_context_tokens ({context}) is below limits.min ({min}), so no request fits"
    )]
    ContextBelowRange {
        /// The bucket.
        id: String,
        /// The context capacity.
        context: u64,
        /// The range's minimum.
        min: u64,
    },
    /// Two buckets share an id.
    #[error("duplicate bucket id {0:?}")]
    DuplicateId(String),
}

/// Length constraints, rank and engine groups; owns complete plain or PD selection.
#[derive(Debug, Clone)]
pub struct Bucket {
    id: Arc<str>,
    rank: i32,
    limits: TokenLimits,
    max_context_tokens: Option<u64>,
    groups: BucketGroups,
    slo: Option<SloTargets>,
    /// The load table latency predictions read.
    pub(crate) load: Option<Arc<EngineReportedLoadTable>>,
}

impl Bucket {
    /// Builds a bucket.
    ///
    /// # Errors
    /// An empty id, an empty token range, or a context capacity below the range.
    pub fn new(
        id: impl Into<Arc<str>>,
        rank: i32,
        limits: TokenLimits,
        max_context_tokens: Option<u64>,
        groups: BucketGroups,
    ) -> Result<Self, BucketError> {
        let id = id.into();
        if id.is_empty() {
            return Err(BucketError::EmptyId);
        }
        if let Some(max) = limits.max
            && limits.min > max
        {
            return Err(BucketError::EmptyRange {
                id: id.to_string(),
                min: limits.min,
                max,
            });
        }
        if let Some(context) = max_context_tokens
            && (context == 0 || context < limits.min)
        {
            return Err(BucketError::ContextBelowRange {
                id: id.to_string(),
                context,
                min: limits.min,
            });
        }
        Ok(Self {
            id,
            rank,
            limits,
            max_context_tokens,
            groups,
            slo: None,
            load: None,
        })
    }

    /// Gives the bucket latency targets: a bucket predicted to miss them is tried
    /// after the fitting buckets predicted closer to them (see [`Bucket::predict`]).
    /// The targets are the caller's to check ([`SloTargets::problem`]; the bucket
    /// configuration does).
    pub fn with_slo(mut self, targets: SloTargets) -> Self {
        self.slo = Some(targets);
        self
    }

    /// Has the bucket's latency predictions read `load`; without it they are unknown.
    pub fn with_load(mut self, load: Arc<EngineReportedLoadTable>) -> Self {
        self.load = Some(load);
        self
    }

    /// The bucket's latency targets, if any.
    pub fn slo(&self) -> Option<SloTargets> {
        self.slo
    }

    /// The bucket's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Tie-breaker between buckets of equal capacity; lower ranks are tried first.
    pub fn rank(&self) -> i32 {
        self.rank
    }

    /// The accepted prompt lengths.
    pub fn limits(&self) -> TokenLimits {
        self.limits
    }

    /// The longest prompt plus output the bucket's engines hold; `None` = unbounded.
    pub fn max_context_tokens(&self) -> Option<u64> {
        self.max_context_tokens
    }

    /// The bucket's groups.
    pub fn groups(&self) -> &BucketGroups {
        &self.groups
    }

    /// Input capacity: the lesser of the range's maximum and the context capacity;
    /// `None` = unbounded.
    pub fn capacity(&self) -> Option<u64> {
        match (self.limits.max, self.max_context_tokens) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether where a request goes in this bucket can depend on its prompt: the
    /// bucket bounds the prompt's length (or its context, which holds the prompt) or
    /// one of its groups' policies reads the prompt.
    pub fn routes_on_prompt(&self) -> bool {
        let bounded =
            self.limits.min > 0 || self.limits.max.is_some() || self.max_context_tokens.is_some();
        let reads = match &self.groups {
            BucketGroups::Plain(group) => group.policy().reads_prompt(),
            BucketGroups::Pd { prefill, decode } => {
                prefill.policy().reads_prompt() || decode.policy().reads_prompt()
            }
        };
        bounded || reads
    }

    /// Whether a request of `input_tokens` (and, when known, `expected_peak_tokens`)
    /// fits this bucket.
    pub fn accepts(&self, input_tokens: u64, expected_peak_tokens: Option<u64>) -> bool {
        let needed = expected_peak_tokens.unwrap_or(input_tokens);
        self.limits.contains(input_tokens) && self.max_context_tokens.is_none_or(|c| needed <= c)
    }

    /// The stage-specific request a group of this bucket is called with.
    pub fn pick_request<'a>(&'a self, request: &RequestFacts<'a>, stage: Role) -> PickRequest<'a> {
        PickRequest::new(*request, stage, &self.id)
    }

    /// Picks the bucket's complete selection: its plain engine, or a prefill engine and
    /// then a decode engine that can hand a request's KV cache over (engines that
    /// cannot pair are left out of the candidates). A failed decode pick discards the
    /// prefill pick.
    ///
    /// # Errors
    /// The failing group's [`PickError`] (with its stage), or
    /// [`PickError::InvalidConfiguration`] when the bucket's kind does not match the
    /// engines serving the model.
    pub async fn pick_engines(
        &self,
        engines: &RegistrySnapshot,
        request: &RequestFacts<'_>,
    ) -> Result<BucketPick, PickError> {
        let engines = match &self.groups {
            BucketGroups::Plain(group) => {
                self.check_mode(engines, request.model, ModelMode::Plain)?;
                EnginePicks::Plain(
                    group
                        .pick(engines, &self.pick_request(request, Role::Plain))
                        .await?,
                )
            }
            BucketGroups::Pd { prefill, decode } => {
                self.check_mode(engines, request.model, ModelMode::Pd)?;
                self.pick_pair(prefill, decode, engines, request).await?
            }
        };
        Ok(BucketPick {
            bucket: Arc::clone(&self.id),
            engines,
        })
    }

    /// Picks a prefill engine some decode candidate can take the KV cache of, then a
    /// decode engine that can take it (see `pair`).
    async fn pick_pair(
        &self,
        prefill: &EngineGroup,
        decode: &EngineGroup,
        engines: &RegistrySnapshot,
        request: &RequestFacts<'_>,
    ) -> Result<EnginePicks, PickError> {
        let prefill_request = self.pick_request(request, Role::Prefill);
        let decode_request = self.pick_request(request, Role::Decode);
        let decodes = decode.eligible(engines, &decode_request);
        let prefills = Offer::new(prefill.eligible(engines, &prefill_request), Role::Prefill);
        let prefills = pair::pairable_prefills(prefills, &decodes, &prefill_request);
        let prefill = prefill.pick_offered(prefills, &prefill_request).await?;
        let decodes = Offer::new(decodes, Role::Decode);
        let decodes = pair::decodes_for(&prefill.engine, decodes, &decode_request);
        let decode = decode.pick_offered(decodes, &decode_request).await?;
        Ok(EnginePicks::Pd { prefill, decode })
    }

    fn check_mode(
        &self,
        engines: &RegistrySnapshot,
        model: &str,
        expected: ModelMode,
    ) -> Result<(), PickError> {
        match engines.model_mode(model) {
            Some(mode) if mode != expected => Err(PickError::InvalidConfiguration {
                stage: None,
                message: format!(
                    "bucket {} selects {} engines, but model {model:?} is served by {} engines",
                    self.id,
                    expected.as_str(),
                    mode.as_str()
                ),
            }),
            _ => Ok(()),
        }
    }
}
