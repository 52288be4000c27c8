//! The registry of policy types: [`PolicyConfig`], declared by the `policy_types!`
//! list (serde and JSON Schema), and the building of a configured policy.

use std::sync::Arc;

use router_state::Role;
use schemars::JsonSchema;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use crate::admission::AdmissionLimits;
use crate::affinity::{SessionAwareConfig, StickyConfig};
use crate::cache_aware::CacheAwareConfig;
use crate::config_error::PolicyConfigError;
use crate::dropped::{dropped_option, dropped_policy_type};
use crate::least_load::LoadBasedConfig;
use crate::policy::Policy;
use crate::power_of_two::PowerOfTwoConfig;
use crate::random::RandomConfig;
use crate::round_robin::RoundRobinConfig;
use crate::settings::{PolicyHandles, PolicySettings};

/// Declares the policy types: `PolicyConfig` with one variant each, its `type` names
/// and the dispatch to each type's [`PolicySettings`].
macro_rules! policy_types {
    ($( $(#[$doc:meta])* $variant:ident($settings:ty) = $name:literal, )+) => {
        /// A role group's policy, selected by `type`.
        ///
        /// ```yaml
        /// policy: {type: power_of_two, admission: {max_running_requests: 64}}
        /// ```
        /// Unknown fields are errors, and removed options are rejected with the name of
        /// their replacement.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
        #[serde(remote = "Self", tag = "type")]
        pub enum PolicyConfig {
            $( $(#[$doc])* #[serde(rename = $name)] $variant($settings), )+
        }

        impl PolicyConfig {
            /// The `type` name.
            pub fn type_name(&self) -> &'static str {
                match self {
                    $( PolicyConfig::$variant(_) => $name, )+
                }
            }

            /// The settings of the policy's type.
            pub fn settings(&self) -> &dyn PolicySettings {
                match self {
                    $( PolicyConfig::$variant(settings) => settings, )+
                }
            }

            /// The settings of the policy's type, for editing.
            pub fn settings_mut(&mut self) -> &mut dyn PolicySettings {
                match self {
                    $( PolicyConfig::$variant(settings) => settings, )+
                }
            }
        }
    };
}

policy_types! {
    /// Rotate over the candidates.
    RoundRobin(RoundRobinConfig) = "round_robin",
    /// Choose uniformly at random.
    Random(RandomConfig) = "random",
    /// Sample two candidates and keep the one under lower stage pressure.
    PowerOfTwo(PowerOfTwoConfig) = "power_of_two",
    /// Choose the least loaded candidate.
    LoadBased(LoadBasedConfig) = "load_based",
    /// Prefer an engine holding the prompt's prefix (plain and prefill groups only).
    CacheAware(CacheAwareConfig) = "cache_aware",
    /// Keep a session on its engine; power-of-two for new and keyless sessions.
    SessionAware(SessionAwareConfig) = "session_aware",
    /// Keep a routing key on its engine; a configurable fallback otherwise.
    Sticky(StickyConfig) = "sticky",
}

impl<'de> Deserialize<'de> for PolicyConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        if let Some(map) = value.as_object() {
            if let Some(dropped) = map
                .get("type")
                .and_then(|t| t.as_str())
                .and_then(dropped_policy_type)
            {
                return Err(D::Error::custom(format_args!("policy type {dropped}")));
            }
            if let Some(dropped) = map.keys().find_map(|k| dropped_option(k)) {
                return Err(D::Error::custom(format_args!("option {dropped}")));
            }
        }
        PolicyConfig::deserialize(value).map_err(D::Error::custom)
    }
}

impl Serialize for PolicyConfig {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        PolicyConfig::serialize(self, serializer)
    }
}

impl Default for PolicyConfig {
    /// `power_of_two` with no caps.
    fn default() -> Self {
        PolicyConfig::PowerOfTwo(PowerOfTwoConfig::default())
    }
}

impl PolicyConfig {
    /// The admission caps the policy applies.
    pub fn admission(&self) -> &AdmissionLimits {
        self.settings().admission()
    }

    /// The admission caps the policy applies, for editing.
    pub fn admission_mut(&mut self) -> &mut AdmissionLimits {
        self.settings_mut().admission_mut()
    }

    /// Checks the settings without building anything.
    ///
    /// # Errors
    /// The first invalid setting.
    pub fn validate(&self) -> Result<(), PolicyConfigError> {
        self.admission().validate()?;
        self.settings().validate()
    }

    /// Checks the settings and that the policy can serve a group of `role`.
    ///
    /// # Errors
    /// The first invalid setting, or a role the policy cannot pick for.
    pub fn validate_for(&self, role: Role) -> Result<(), PolicyConfigError> {
        self.settings().check_role(role)?;
        self.validate()
    }

    /// Whether the policy reads prefix ownership (and so needs token ids and a
    /// prefix source).
    pub fn needs_prefix_source(&self) -> bool {
        self.settings().needs_prefix_source()
    }

    /// Whether the policy keeps keys on engines (and so needs the affinity backend).
    pub fn needs_affinity(&self) -> bool {
        self.settings().needs_affinity()
    }

    /// Validates and builds the policy for a group of `role` around the shared
    /// `handles`.
    ///
    /// # Errors
    /// The first invalid setting, a role the policy cannot serve, or missing state.
    pub fn build(
        &self,
        role: Role,
        handles: &PolicyHandles,
    ) -> Result<Arc<dyn Policy>, PolicyConfigError> {
        self.validate_for(role)?;
        self.settings().build(Arc::new(*self.admission()), handles)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<PolicyConfig, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn parses_each_type_with_admission() {
        let p = parse(
            r#"{"type": "power_of_two", "admission": {"max_running_requests": 64}, "seed": 3}"#,
        )
        .unwrap();
        assert_eq!(p.type_name(), "power_of_two");
        assert_eq!(p.admission().max_running_requests, Some(64));
        for name in ["round_robin", "random", "power_of_two", "load_based"] {
            let p = parse(&format!(r#"{{"type": "{name}"}}"#)).unwrap();
            assert_eq!(p.type_name(), name);
            assert_eq!(*p.admission(), AdmissionLimits::default());
        }
    }

    #[test]
    fn rejects_unknown_types_fields_and_missing_type() {
        let err = parse(r#"{"type": "fastest"}"#).unwrap_err();
        assert!(
            err.starts_with(
                "unknown variant `fastest`, expected one of `round_robin`, `random`, `power_of_two`, `load_based`"
            ),
            "{err}"
        );
        let err = parse(r#"{"type": "round_robin", "seed": 1}"#).unwrap_err();
        assert!(
            err.starts_with("unknown field `seed`, expected `admission`"),
            "{err}"
        );
        let err = parse(r#"{"admission": {}}"#).unwrap_err();
        assert!(err.starts_with("missing field `type`"), "{err}");
        let err = parse(r#"{"type": "load_based", "admission": {"max_inflight": 2}}"#).unwrap_err();
        assert!(err.starts_with("unknown field `max_inflight`"), "{err}");
    }

    #[test]
    fn dropped_policy_types_name_their_replacement() {
        for (json, expected) in [
            (
                r#"{"type": "fused_score"}"#,
                "policy type `fused_score` was removed: attach an explicit policy",
            ),
            (
                r#"{"type": "score_policy"}"#,
                "policy type `score_policy` was removed: attach an explicit policy",
            ),
            (
                r#"{"type": "legacy_host_affinity"}"#,
                "policy type `legacy_host_affinity` was removed: attach `power_of_two`",
            ),
        ] {
            let err = parse(json).unwrap_err();
            assert!(err.starts_with(expected), "{err}");
        }
    }

    #[test]
    fn dropped_options_name_their_replacement() {
        for (key, expected) in [
            (
                "fuse",
                "option `fuse` was removed: attach an explicit policy",
            ),
            (
                "stable_pair",
                "option `stable_pair` was removed: bucket-first selection",
            ),
            (
                "affinity_mode",
                "option `affinity_mode` was removed: `session_aware` always reuses",
            ),
            (
                "session_affinity_mode",
                "option `session_affinity_mode` was removed: sessions are bound",
            ),
            (
                "prefix_cache_min_share",
                "option `prefix_cache_min_share` was removed: use `cache_aware`",
            ),
            (
                "filter",
                "option `filter` was removed: `admission.max_inflight_requests` replaces",
            ),
            (
                "max_in_flight",
                "option `max_in_flight` was removed: use `admission.max_inflight_requests`",
            ),
        ] {
            let err = parse(&format!(r#"{{"type": "power_of_two", "{key}": true}}"#)).unwrap_err();
            assert!(err.starts_with(expected), "{key}: {err}");
        }
    }

    #[tokio::test]
    async fn build_validates_caps_and_wires_a_working_policy() {
        let handles = PolicyHandles::new(Arc::default());
        let zero =
            parse(r#"{"type": "random", "admission": {"max_inflight_requests": 0}}"#).unwrap();
        assert_eq!(
            zero.build(Role::Plain, &handles).unwrap_err().to_string(),
            "admission.max_inflight_requests must be at least 1: a cap of 0 admits nothing"
        );
        let engines = router_state::test_util::fleet("m", router_state::Role::Plain, "e", 1);
        let request = crate::PickRequest::new(
            crate::RequestFacts::new("m", 10),
            router_state::Role::Plain,
            "b",
        );
        for name in ["round_robin", "random", "power_of_two", "load_based"] {
            let policy = parse(&format!(r#"{{"type": "{name}"}}"#))
                .unwrap()
                .build(Role::Plain, &handles)
                .unwrap();
            let pick = policy.pick(&engines, &request).await.unwrap();
            assert!(
                Arc::ptr_eq(&pick.engine, &engines[0]),
                "{name} picks the only engine"
            );
        }
        let limited =
            parse(r#"{"type": "round_robin", "admission": {"max_inflight_requests": 1}}"#).unwrap();
        let policy = limited.build(Role::Plain, &handles).unwrap();
        let _busy = handles.load.acquire(engines[0].id());
        let err = policy.pick(&engines, &request).await.unwrap_err();
        assert_eq!(
            err.code(),
            "no_admissible_engine",
            "the configured caps reach the policy"
        );
    }

    #[tokio::test]
    async fn a_configured_seed_makes_choices_reproducible() {
        let handles = PolicyHandles::new(Arc::default());
        let engines = router_state::test_util::fleet("m", router_state::Role::Plain, "e", 16);
        let request = crate::PickRequest::new(
            crate::RequestFacts::new("m", 10),
            router_state::Role::Plain,
            "b",
        );
        for name in ["random", "power_of_two"] {
            let config = parse(&format!(r#"{{"type": "{name}", "seed": 42}}"#)).unwrap();
            let (a, b) = (
                config.build(Role::Plain, &handles).unwrap(),
                config.build(Role::Plain, &handles).unwrap(),
            );
            for _ in 0..32 {
                let (pa, pb) = (
                    a.pick(&engines, &request).await.unwrap(),
                    b.pick(&engines, &request).await.unwrap(),
                );
                assert_eq!(
                    pa.engine.id(),
                    pb.engine.id(),
                    "{name} with one seed picks alike"
                );
            }
        }
    }

    #[test]
    fn round_trips_and_exposes_a_tagged_schema() {
        let p =
            parse(r#"{"type": "random", "seed": 9, "admission": {"max_kv_tokens": 10}}"#).unwrap();
        let back = parse(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(p, back);
        let schema = serde_json::to_string(&schemars::schema_for!(PolicyConfig)).unwrap();
        for name in [
            "round_robin",
            "random",
            "power_of_two",
            "load_based",
            "max_pending_prefill_tokens",
        ] {
            assert!(schema.contains(name), "schema names {name}");
        }
        assert!(
            !schema.contains("fused_score"),
            "dropped types are not in the schema"
        );
    }
}
