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
    /// One pick of the group in this many is shadowed (1: every pick); default 10.
    #[serde(default = "ShadowConfig::default_every")]
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

/// What a group's shadow picks added up to; read at scrape time.
#[derive(Debug, Default)]
pub struct ShadowStats {
    /// The group's picks so far, shadowed or not: the sampling's count.
    seen: AtomicU64,
    picks: AtomicU64,
    picked: AtomicU64,
    agreed: AtomicU64,
    cached_tokens: AtomicU64,
    live_cached_tokens: AtomicU64,
}

/// A snapshot of [`ShadowStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShadowTotals {
    /// Picks of the group that were shadowed.
    pub picks: u64,
    /// Of those, the ones the shadow policy picked an engine for.
    pub picked: u64,
    /// Of those, the ones where it picked the group's engine.
    pub agreed: u64,
    /// Prompt tokens the shadow's engines held, summed.
    pub cached_tokens: u64,
    /// Prompt tokens the group's engines held on the same picks, summed.
    pub live_cached_tokens: u64,
}

impl ShadowStats {
    /// The sums so far.
    pub fn totals(&self) -> ShadowTotals {
        let read = |n: &AtomicU64| n.load(Ordering::Relaxed);
        ShadowTotals {
            picks: read(&self.picks),
            picked: read(&self.picked),
            agreed: read(&self.agreed),
            cached_tokens: read(&self.cached_tokens),
            live_cached_tokens: read(&self.live_cached_tokens),
        }
    }
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

    /// Picks beside the group's `live` pick of `request` when this pick is sampled,
    /// and counts the outcome; records it when the request is recorded.
    pub(crate) async fn beside(
        &self,
        candidates: &[Arc<Engine>],
        request: &PickRequest<'_>,
        live: &Pick,
    ) {
        if !self
            .stats
            .seen
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(self.every)
        {
            return;
        }
        self.stats.picks.fetch_add(1, Ordering::Relaxed);
        let explanation = Explanation::shadow();
        let facts = request.facts.with_explanation(Some(&explanation));
        let shadowed = PickRequest::new(facts, request.stage, request.bucket_id);
        let picked = self.policy.pick(candidates, &shadowed).await.ok();
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
        if let Some(engine) = &engine {
            self.stats.picked.fetch_add(1, Ordering::Relaxed);
            if engine == live.engine.id() {
                self.stats.agreed.fetch_add(1, Ordering::Relaxed);
            }
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
            cached_tokens,
            live_cached_tokens,
        });
    }
}
