//! A group's shadow policy: on a sampled share of the group's picks it picks too,
//! among the same candidates, as a dry run ([`Explanation::shadow`]): nothing is
//! dispatched or reserved, no affinity binding is written, the prefix index is not
//! touched; only the shadow policy's own rotation and generator move on. The group
//! counts how often the two agree and the cached prompt tokens each pick's engine
//! holds, by the request's own prefix lookup.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use router_policy::{
    CacheLookup, ConfigError, Explanation, Observation, Pick, PickRequest, Policy, PolicyConfig,
    PolicyHandles,
};
use router_state::{Engine, EngineId, Role};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A group's shadow policy as configured.
///
/// ```yaml
/// shadow: {policy: {type: cache_aware}, every: 10}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShadowConfig {
    /// The policy that picks beside the group's own.
    pub policy: PolicyConfig,
    /// One pick of the group in this many is shadowed, on average (1: every pick);
    /// 1 to 1,000,000, default 10.
    #[serde(default = "ShadowConfig::default_every")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub every: u32,
}

impl ShadowConfig {
    /// Most picks between two shadowed ones.
    pub const MAX_EVERY: u32 = 1_000_000;

    fn default_every() -> u32 {
        10
    }

    /// Validates the configuration at `path` and builds the shadow of a group of
    /// `role`.
    ///
    /// # Errors
    /// `every` out of `1..=MAX_EVERY`, or a policy that cannot be built.
    pub fn build(
        &self,
        path: &str,
        role: Role,
        handles: &PolicyHandles,
    ) -> Result<Shadow, ConfigError> {
        if !(1..=Self::MAX_EVERY).contains(&self.every) {
            return Err(ConfigError::at(
                format!("{path}.every"),
                format_args!("must be between 1 and {}", Self::MAX_EVERY),
            ));
        }
        let policy = self
            .policy
            .build(role, handles)
            .map_err(|e| ConfigError::at(format!("{path}.policy"), e))?;
        Ok(Shadow {
            policy,
            name: self.policy.type_name(),
            every: u64::from(self.every),
            stats: Arc::default(),
        })
    }
}

/// What a group's shadow picks added up to; read at scrape time. Each counter moves
/// once a shadowed pick's outcome is known, so none of them ever goes back.
#[derive(Debug, Default)]
pub struct ShadowStats {
    /// The group's picks offered to the shadow so far (real picks the group made,
    /// shadowed or not): the sampling's count.
    seen: AtomicU64,
    agreed: AtomicU64,
    disagreed: AtomicU64,
    none: AtomicU64,
    cached_tokens: AtomicU64,
    live_cached_tokens: AtomicU64,
}

/// A snapshot of [`ShadowStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShadowTotals {
    /// Shadowed picks where the shadow policy picked the group's engine.
    pub agreed: u64,
    /// Shadowed picks where it picked another engine.
    pub disagreed: u64,
    /// Shadowed picks where it picked none.
    pub none: u64,
    /// Prompt tokens the shadow's engines held, summed over the picks it made.
    pub cached_tokens: u64,
    /// Prompt tokens the group's engines held on the same picks, summed.
    pub live_cached_tokens: u64,
}

impl ShadowTotals {
    /// Every shadowed pick.
    pub fn picks(&self) -> u64 {
        self.agreed + self.disagreed + self.none
    }
}

impl ShadowStats {
    /// The sums so far.
    pub fn totals(&self) -> ShadowTotals {
        let read = |n: &AtomicU64| n.load(Ordering::Relaxed);
        ShadowTotals {
            agreed: read(&self.agreed),
            disagreed: read(&self.disagreed),
            none: read(&self.none),
            cached_tokens: read(&self.cached_tokens),
            live_cached_tokens: read(&self.live_cached_tokens),
        }
    }
}

/// Whether the `n`-th pick offered is shadowed: one in `every` on average, spread by
/// a mixing of `n` (splitmix64's finalizer) so that the sampled picks do not line up
/// with a rotation of the group's engines, as every `every`-th pick would.
fn sampled(n: u64, every: u64) -> bool {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).is_multiple_of(every)
}

/// A group's shadow policy, its sampling and its sums.
#[derive(Debug, Clone)]
pub struct Shadow {
    policy: Arc<dyn Policy>,
    name: &'static str,
    every: u64,
    stats: Arc<ShadowStats>,
}

impl Shadow {
    /// The shadow policy's type name.
    pub fn policy_name(&self) -> &'static str {
        self.name
    }

    /// Its sums.
    pub fn stats(&self) -> &Arc<ShadowStats> {
        &self.stats
    }

    /// Picks beside the group's pick of `request` when this pick is sampled, as the
    /// group's policy has just picked (before its pick is reserved): `None` when not
    /// sampled, else the shadow's pick, if it made one. [`count`](Self::count) then
    /// counts it against the pick the group made.
    pub(crate) async fn pick(
        &self,
        candidates: &[Arc<Engine>],
        request: &PickRequest<'_>,
    ) -> Option<Option<Pick>> {
        let n = self.stats.seen.fetch_add(1, Ordering::Relaxed);
        if !sampled(n, self.every) {
            return None;
        }
        let explanation = Explanation::shadow();
        let facts = request.facts.with_explanation(Some(&explanation));
        let shadowed = PickRequest::new(facts, request.stage, request.bucket_id);
        Some(self.policy.pick(candidates, &shadowed).await.ok())
    }

    /// Counts the shadow's `picked` against the group's `live` pick of `request`, as
    /// reserved; records it when the request is recorded.
    pub(crate) fn count(&self, picked: Option<Pick>, request: &PickRequest<'_>, live: &Pick) {
        let lookup = request.facts.prefix_memo.and_then(|memo| memo.first());
        let held = |engine: &EngineId, predicted: Option<u64>| match lookup.as_deref() {
            Some(Ok(CacheLookup::Answered(hits))) => {
                hits.matched_tokens(engine, request.facts.input_tokens)
            }
            _ => predicted.unwrap_or(0),
        };
        let live_cached_tokens = held(live.engine.id(), live.predicted_cached_tokens);
        let cached_tokens = picked
            .as_ref()
            .map_or(0, |p| held(p.engine.id(), p.predicted_cached_tokens));
        let engine = picked.map(|p| p.engine.id().clone());
        let agreed = engine.as_ref().map(|e| e == live.engine.id());
        let outcome = match agreed {
            Some(true) => &self.stats.agreed,
            Some(false) => &self.stats.disagreed,
            None => &self.stats.none,
        };
        outcome.fetch_add(1, Ordering::Relaxed);
        if engine.is_some() {
            self.stats
                .cached_tokens
                .fetch_add(cached_tokens, Ordering::Relaxed);
            self.stats
                .live_cached_tokens
                .fetch_add(live_cached_tokens, Ordering::Relaxed);
        }
        request.observe(|| Observation::Shadow {
            bucket: request.bucket_id.to_owned(),
            stage: request.stage,
            policy: self.name,
            engine,
            agreed: agreed.unwrap_or(false),
            cached_tokens,
            live_cached_tokens,
        });
    }
}
