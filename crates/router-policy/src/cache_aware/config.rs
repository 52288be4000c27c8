//! Settings of `cache_aware`, with the defaults operators know from SGLang's router.

use std::sync::Arc;

use router_state::Role;
use schemars::JsonSchema;
use serde::de::{Error as _, Unexpected};
use serde::{Deserialize, Deserializer, Serialize};

use super::CacheAwarePolicy;
use crate::admission::{AdmissionLimits, EngineAdmission};
use crate::config_error::PolicyConfigError;
use crate::policy::Policy;
use crate::settings::{PolicyHandles, PolicySettings, admission_field};

/// A finite real number from configuration (ratios, factors). Compares by value;
/// non-finite values are refused when the configuration is validated.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct Real(f64);

/// Finite by construction, so equality is reflexive.
impl Eq for Real {}

impl Real {
    /// `value` as a `Real`; `None` when it is NaN or infinite.
    pub fn new(value: f64) -> Option<Self> {
        value.is_finite().then_some(Self(value))
    }

    /// The number.
    pub fn get(self) -> f64 {
        self.0
    }
}

/// Reads a number as [`Real::new`] takes it: NaN and infinities are refused.
impl<'de> Deserialize<'de> for Real {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = f64::deserialize(deserializer)?;
        Real::new(value)
            .ok_or_else(|| D::Error::invalid_value(Unexpected::Float(value), &"a finite number"))
    }
}

/// Settings of `cache_aware`.
///
/// ```yaml
/// policy:
///   type: cache_aware
///   min_matched_tokens: 1024
///   candidates: {min_engines: 8, ratio: 0.05, max_engines: 32}
///   pressure_guard: {abs_tokens: 1024, rel: 1.5}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheAwareConfig {
    /// Per-engine caps, checked explicitly on every engine the policy would return.
    #[serde(default)]
    pub admission: AdmissionLimits,
    /// Fewest cached prompt tokens that count as a hit.
    #[serde(default = "default_tokens")]
    pub min_matched_tokens: u64,
    /// Smallest cached share of the prompt, in `(0, 1]`, that counts as a hit; unset =
    /// no ratio gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_match_ratio: Option<Real>,
    /// How many prefix holders are considered.
    #[serde(default)]
    pub candidates: CandidateBounds,
    /// Holders with at most this many more uncached tokens than the best one are near
    /// ties, which the pressure guard may reorder.
    #[serde(default = "default_tokens")]
    pub switch_margin_tokens: u64,
    /// When a near tie goes to the less pressured holder.
    #[serde(default)]
    pub pressure_guard: PressureGuard,
    /// Soft queue gate: holders reporting at least this many waiting requests are set
    /// aside while others are usable; unset = no gate.
    #[serde(
        default,
        alias = "worker_queue_limit",
        skip_serializing_if = "Option::is_none"
    )]
    pub engine_queue_limit: Option<u64>,
    /// With the gate set: when every holder is set aside and no engine of the group
    /// reports fewer waiting requests than this floor, the least pressured holder is
    /// still used (never bypassing admission). At most `engine_queue_limit`; unset =
    /// keep every holder when all are set aside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saturation_queue_floor: Option<u64>,
    /// On a miss, engines sampled for the least pressured one (power of k); a value
    /// covering the group takes the exact minimum.
    #[serde(default = "default_load_choices")]
    pub min_load_choices: usize,
    /// What a cached token held only on a slower tier (host memory, disk, a shared
    /// pool) is worth against one on the device, in `[0, 1]`: the engine must load it
    /// back before it counts. Holders are ranked, and gated by `min_matched_tokens`
    /// and `min_match_ratio`, on device tokens plus this share of slower ones.
    #[serde(default = "default_slower_tier_weight")]
    pub slower_tier_weight: Real,
    /// How a holder's cached tokens are weighed against engines' queues.
    #[serde(default)]
    pub score: CacheScore,
    /// Bounded load, at least 1: a holder whose requests (reported running and
    /// waiting plus dispatches since the report, else the router's own in flight)
    /// exceed `ceil(load_bound x (group's requests + 1) / group's engines)` is set
    /// aside, and when every holder is, the request goes to the least pressured of
    /// `min_load_choices` engines under the bound (`cache_spill`); `null` = no
    /// bound.
    #[serde(default = "default_load_bound")]
    pub load_bound: Option<Real>,

    /// Fixed seed for reproducible sampling; absent = seeded per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// How `cache_aware` weighs a holder's cached tokens against engines' queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CacheScore {
    /// The admitted holder with the fewest uncached tokens; near ties go to the less
    /// pressured one (the pressure guard); a miss samples `min_load_choices` engines.
    #[default]
    Cached,
    /// The engine of the group, holder or not, with the shortest predicted time to
    /// first token: its prefill queue (corrected for dispatches its report has not
    /// seen) plus this prompt's tokens it does not hold, at its measured prefill
    /// speed. Used when every engine of the group has a fresh native report with a
    /// measured speed; otherwise as `cached`.
    Ttft,
}

/// Bounds on the number of prefix holders considered: the best
/// `min(group, max_engines, max(min_engines, ceil(ratio x group)))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CandidateBounds {
    /// Lower bound.
    #[serde(default = "default_min_engines", alias = "min_workers")]
    pub min_engines: usize,
    /// Share of the group, in `[0, 1]`.
    #[serde(default = "default_candidate_ratio")]
    pub ratio: Real,
    /// Upper bound.
    #[serde(default = "default_max_engines", alias = "max_workers")]
    pub max_engines: usize,
}

/// The pressure guard: among near ties, holder A yields to B when A's queue is
/// worse by more than the absolute threshold *and* by more than the relative factor.
/// Milliseconds of estimated prefill queue are compared when the threshold is set and
/// both engines report them; waiting uncached tokens otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PressureGuard {
    /// Off = near ties keep the prefix order.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Absolute threshold in waiting uncached tokens.
    #[serde(default = "default_tokens")]
    pub abs_tokens: u64,
    /// Absolute threshold in milliseconds of estimated prefill queue; unset = compare
    /// tokens only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abs_ms: Option<u64>,
    /// Relative factor, above 1.
    #[serde(default = "default_rel")]
    pub rel: Real,
}

fn default_tokens() -> u64 {
    1024
}
fn default_load_choices() -> usize {
    2
}
fn default_min_engines() -> usize {
    8
}
fn default_candidate_ratio() -> Real {
    Real(0.05)
}
fn default_max_engines() -> usize {
    32
}
fn default_slower_tier_weight() -> Real {
    Real(1.0)
}
fn default_load_bound() -> Option<Real> {
    Some(Real(1.25))
}
fn default_true() -> bool {
    true
}
fn default_rel() -> Real {
    Real(1.5)
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        Self {
            admission: AdmissionLimits::default(),
            min_matched_tokens: default_tokens(),
            min_match_ratio: None,
            candidates: CandidateBounds::default(),
            switch_margin_tokens: default_tokens(),
            pressure_guard: PressureGuard::default(),
            engine_queue_limit: None,
            saturation_queue_floor: None,
            min_load_choices: default_load_choices(),
            slower_tier_weight: default_slower_tier_weight(),
            score: CacheScore::default(),
            load_bound: default_load_bound(),
            seed: None,
        }
    }
}

impl Default for CandidateBounds {
    fn default() -> Self {
        Self {
            min_engines: default_min_engines(),
            ratio: default_candidate_ratio(),
            max_engines: default_max_engines(),
        }
    }
}

impl Default for PressureGuard {
    fn default() -> Self {
        Self {
            enabled: true,
            abs_tokens: default_tokens(),
            abs_ms: None,
            rel: default_rel(),
        }
    }
}

impl CandidateBounds {
    /// How many holders a group of `group` engines considers.
    pub fn count(&self, group: usize) -> usize {
        let share = (self.ratio.get() * group as f64).ceil();
        // `share` is finite and at most `group` for a validated ratio.
        let share = if share >= 0.0 { share as usize } else { 0 };
        group.min(self.max_engines.min(self.min_engines.max(share)))
    }
}

impl CacheAwareConfig {
    /// Checks every setting.
    ///
    /// # Errors
    /// The first invalid setting, named by its configuration path.
    pub fn validate(&self) -> Result<(), PolicyConfigError> {
        self.admission.validate()?;
        let invalid = |setting, reason| Err(PolicyConfigError::Invalid { setting, reason });
        if let Some(r) = self.min_match_ratio.map(Real::get)
            && !(r > 0.0 && r <= 1.0)
        {
            return invalid("min_match_ratio", "must be in (0, 1]");
        }
        let c = &self.candidates;
        if c.min_engines == 0 {
            return invalid("candidates.min_engines", "must be at least 1");
        }
        if c.max_engines < c.min_engines {
            return invalid("candidates.max_engines", "must be at least min_engines");
        }
        if !(0.0..=1.0).contains(&c.ratio.get()) {
            return invalid("candidates.ratio", "must be in [0, 1]");
        }
        if self.pressure_guard.rel.get() <= 1.0 {
            return invalid("pressure_guard.rel", "must be a finite number above 1");
        }
        if self.engine_queue_limit == Some(0) {
            return invalid(
                "engine_queue_limit",
                "must be at least 1: a limit of 0 sets every engine aside",
            );
        }
        match (self.saturation_queue_floor, self.engine_queue_limit) {
            (Some(_), None) => {
                return invalid("saturation_queue_floor", "needs engine_queue_limit");
            }
            (Some(floor), Some(limit)) if floor > limit => {
                return invalid(
                    "saturation_queue_floor",
                    "must be at most engine_queue_limit",
                );
            }
            _ => {}
        }
        if self.min_load_choices == 0 {
            return invalid("min_load_choices", "must be at least 1");
        }
        if self.load_bound.is_some_and(|b| b.get() < 1.0) {
            return invalid("load_bound", "must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.slower_tier_weight.get()) {
            return invalid("slower_tier_weight", "must be in [0, 1]");
        }
        Ok(())
    }
}

impl PolicySettings for CacheAwareConfig {
    admission_field!();

    fn validate(&self) -> Result<(), PolicyConfigError> {
        CacheAwareConfig::validate(self)
    }

    fn check_role(&self, role: Role) -> Result<(), PolicyConfigError> {
        if role == Role::Decode {
            return Err(PolicyConfigError::WrongRole {
                policy: "cache_aware",
                role,
                hint: ": a decode engine receives its prompt's KV from the prefill engine, so attach power_of_two or load_based to decode groups",
            });
        }
        Ok(())
    }

    fn needs_prefix_source(&self) -> bool {
        true
    }

    fn build(
        &self,
        admission: Arc<dyn EngineAdmission>,
        handles: &PolicyHandles,
    ) -> Result<Arc<dyn Policy>, PolicyConfigError> {
        let source = handles.prefix.clone().ok_or(PolicyConfigError::MissingState {
            policy: "cache_aware",
            needs: "the model's prefix index: set the model's tokenizer (prompts are hashed by token ids) and serve it with engines that publish KV events",
        })?;
        Ok(Arc::new(CacheAwarePolicy::new(
            source,
            Arc::clone(&handles.load),
            admission,
            self.clone(),
        )?))
    }
}
