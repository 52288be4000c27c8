//! The `affinity` section: where session and routing keys come from, and the limits
//! of the binding store they fill.

use std::time::Duration;

use router_state::affinity::AffinityConfig;
use schemars::JsonSchema;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use super::ConfigError;

/// Session and routing-key affinity (`session_aware` and `sticky` groups).
///
/// ```yaml
/// affinity: {session_header: x-session-id, idle_timeout_ms: 600000}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct AffinitySettings {
    /// Request header carrying the session key.
    #[serde(default = "default_session_header")]
    pub session_header: String,
    /// Request header carrying the routing key.
    #[serde(default = "default_routing_key_header")]
    pub routing_key_header: String,
    /// A binding unused this long is forgotten, in milliseconds.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_ms: u64,
    /// How often idle bindings are freed, in milliseconds.
    #[serde(default = "default_sweep_interval")]
    pub sweep_interval_ms: u64,
    /// Most bindings kept; past it the longest-idle one is evicted.
    #[serde(default = "default_max_entries")]
    pub max_entries: usize,
    /// Longest key accepted, in bytes; a longer header is a 400.
    #[serde(default = "default_max_key_bytes")]
    pub max_key_bytes: usize,
}

fn default_session_header() -> String {
    "x-session-id".into()
}
fn default_routing_key_header() -> String {
    "x-switchyard-routing-key".into()
}
fn default_idle_timeout() -> u64 {
    600_000
}
fn default_sweep_interval() -> u64 {
    60_000
}
fn default_max_entries() -> usize {
    1 << 20
}
fn default_max_key_bytes() -> usize {
    256
}

impl Default for AffinitySettings {
    fn default() -> Self {
        Self {
            session_header: default_session_header(),
            routing_key_header: default_routing_key_header(),
            idle_timeout_ms: default_idle_timeout(),
            sweep_interval_ms: default_sweep_interval(),
            max_entries: default_max_entries(),
            max_key_bytes: default_max_key_bytes(),
        }
    }
}

/// Removed affinity settings of earlier routers are named with their replacement.
impl<'de> Deserialize<'de> for AffinitySettings {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        if let Some(dropped) = value.as_object().and_then(|map| {
            map.keys()
                .find_map(|k| router_policy::dropped_option(k).or(legacy_mode(k)))
        }) {
            return Err(D::Error::custom(format_args!("option {dropped}")));
        }
        AffinitySettings::deserialize(value).map_err(D::Error::custom)
    }
}

impl Serialize for AffinitySettings {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        AffinitySettings::serialize(self, serializer)
    }
}

/// `mode` inside the section is the old `affinity_mode`.
fn legacy_mode(key: &str) -> Option<&'static router_policy::DroppedOption> {
    (key == "mode")
        .then(|| router_policy::dropped_option("affinity_mode"))
        .flatten()
}

impl AffinitySettings {
    /// The store limits.
    pub fn store_config(&self) -> AffinityConfig {
        AffinityConfig {
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            max_entries: self.max_entries,
            max_key_bytes: self.max_key_bytes,
        }
    }

    pub(super) fn validate(&self, errors: &mut Vec<ConfigError>) {
        for (field, name) in [
            ("affinity.session_header", &self.session_header),
            ("affinity.routing_key_header", &self.routing_key_header),
        ] {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                errors.push(ConfigError::at(field, "is not a valid HTTP header name"));
            }
        }
        if self
            .session_header
            .eq_ignore_ascii_case(&self.routing_key_header)
        {
            errors.push(ConfigError::at(
                "affinity.routing_key_header",
                "must differ from affinity.session_header",
            ));
        }
        for (field, value) in [
            ("affinity.idle_timeout_ms", self.idle_timeout_ms),
            ("affinity.sweep_interval_ms", self.sweep_interval_ms),
            ("affinity.max_entries", self.max_entries as u64),
            ("affinity.max_key_bytes", self.max_key_bytes as u64),
        ] {
            if value == 0 {
                errors.push(ConfigError::at(field, "must be at least 1"));
            }
        }
    }
}
