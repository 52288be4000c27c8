//! The `affinity` section: where session and routing keys come from, where their
//! engines are kept, and the limits of the binding store they fill.

use std::time::Duration;

use router_state::affinity::AffinityConfig;
use schemars::JsonSchema;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use crate::{ConfigError, MAX_MS};

/// Session and routing-key affinity (`session_aware` and `sticky` groups).
///
/// ```yaml
/// affinity: {session_header: x-session-id, idle_timeout_ms: 600000}
/// affinity: {backend: redis, redis: {url: "redis://127.0.0.1:6379/0"}}
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
    /// Where keys' engines are kept.
    #[serde(default)]
    pub backend: AffinityBackendKind,
    /// The Redis server of the `redis` backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisConfig>,
}

/// Where session and routing keys' engines are kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AffinityBackendKind {
    /// This process's own bindings: replicas behind one load balancer do not share
    /// them.
    #[default]
    Local,
    /// Bindings in a Redis server every replica names (`affinity.redis`), with a
    /// short local cache in front; local bindings while it is unreachable.
    Redis,
    /// No bindings: a key goes to the highest-random-weight engine among its group's
    /// routable engines (the next in that order when admission rejects), so every
    /// replica agrees with no store.
    Rendezvous,
}

/// The Redis server of the `redis` affinity backend.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:password@]host[:port][/db]` of a Redis 6.2 or later (not TLS,
    /// a Unix socket or Cluster); never logged.
    pub url: String,
    /// Prepended to every key written; replicas sharing bindings use the same one.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Longest wait for a connection, and for all the commands of one pick
    /// together, in milliseconds; past it the pick binds locally. A pick makes one
    /// lookup and, for a new binding, one bind (a few more only when replicas race
    /// on one key), each given the time the pick has left.
    #[serde(default = "default_redis_timeout")]
    pub timeout_ms: u64,
    /// How long a binding read from Redis is answered without asking again, in
    /// milliseconds; 0: every lookup asks. Another replica's rebinding is seen
    /// within this time.
    #[serde(default = "default_local_cache")]
    pub local_cache_ms: u64,
    /// Least time between connection attempts while Redis is unreachable, and how
    /// long no command is sent after one timed out (then a single one tries Redis
    /// while the others still bind locally), in milliseconds.
    #[serde(default = "default_reconnect_interval")]
    pub reconnect_interval_ms: u64,
}

impl std::fmt::Debug for RedisConfig {
    /// The URL is left out: it may hold a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("key_prefix", &self.key_prefix)
            .field("timeout_ms", &self.timeout_ms)
            .field("local_cache_ms", &self.local_cache_ms)
            .field("reconnect_interval_ms", &self.reconnect_interval_ms)
            .finish_non_exhaustive()
    }
}

fn default_key_prefix() -> String {
    "switchyard:affinity:".into()
}
fn default_redis_timeout() -> u64 {
    100
}
fn default_local_cache() -> u64 {
    1_000
}
fn default_reconnect_interval() -> u64 {
    1_000
}

/// Longest `affinity.redis.key_prefix`, in bytes.
const MAX_KEY_PREFIX_BYTES: usize = 128;
/// Longest `affinity.redis.timeout_ms`, the wait of one command.
const MAX_REDIS_TIMEOUT_MS: u64 = 10_000;

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
            backend: AffinityBackendKind::default(),
            redis: None,
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

    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let Self {
            session_header,
            routing_key_header,
            idle_timeout_ms,
            sweep_interval_ms,
            max_entries,
            max_key_bytes,
            backend: _,
            redis: _,
        } = self;
        // The backend and its server are checked together.
        self.validate_backend(errors);
        for (field, name) in [
            ("affinity.session_header", session_header),
            ("affinity.routing_key_header", routing_key_header),
        ] {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                errors.push(ConfigError::at(field, "is not a valid HTTP header name"));
            }
        }
        if session_header.eq_ignore_ascii_case(routing_key_header) {
            errors.push(ConfigError::at(
                "affinity.routing_key_header",
                "must differ from affinity.session_header",
            ));
        }
        if *idle_timeout_ms > MAX_MS {
            errors.push(ConfigError::at(
                "affinity.idle_timeout_ms",
                format_args!("must be at most {} (one day)", MAX_MS),
            ));
        }
        for (field, value) in [
            ("affinity.idle_timeout_ms", *idle_timeout_ms),
            ("affinity.sweep_interval_ms", *sweep_interval_ms),
            ("affinity.max_entries", *max_entries as u64),
            ("affinity.max_key_bytes", *max_key_bytes as u64),
        ] {
            if value == 0 {
                errors.push(ConfigError::at(field, "must be at least 1"));
            }
        }
    }

    fn validate_backend(&self, errors: &mut Vec<ConfigError>) {
        let Some(redis) = &self.redis else {
            if self.backend == AffinityBackendKind::Redis {
                errors.push(ConfigError::at(
                    "affinity.redis",
                    "is required by backend redis",
                ));
            }
            return;
        };
        if self.backend != AffinityBackendKind::Redis {
            errors.push(ConfigError::at(
                "affinity.redis",
                "is set but affinity.backend is not redis",
            ));
        }
        #[cfg(feature = "redis")]
        if let Err(e) =
            router_state::affinity::RedisAffinityStore::new(self.store_config(), redis.settings())
        {
            errors.push(ConfigError::at("affinity.redis.url", e));
        }
        let RedisConfig {
            // Checked as the Redis store parses it, above.
            url: _,
            key_prefix,
            timeout_ms,
            local_cache_ms,
            reconnect_interval_ms,
        } = redis;
        if key_prefix.is_empty()
            || key_prefix.len() > MAX_KEY_PREFIX_BYTES
            || !key_prefix.bytes().all(|b| b.is_ascii_graphic())
        {
            errors.push(ConfigError::at(
                "affinity.redis.key_prefix",
                format!("must be 1 to {MAX_KEY_PREFIX_BYTES} bytes of visible ASCII"),
            ));
        }
        if !(1..=MAX_REDIS_TIMEOUT_MS).contains(timeout_ms) {
            errors.push(ConfigError::at(
                "affinity.redis.timeout_ms",
                format!("must be 1 to {MAX_REDIS_TIMEOUT_MS}"),
            ));
        }
        if *local_cache_ms >= self.idle_timeout_ms {
            errors.push(ConfigError::at(
                "affinity.redis.local_cache_ms",
                "must be below affinity.idle_timeout_ms",
            ));
        }
        if *reconnect_interval_ms == 0 {
            errors.push(ConfigError::at(
                "affinity.redis.reconnect_interval_ms",
                "must be at least 1",
            ));
        }
    }
}

impl RedisConfig {
    /// A server at `url` with every other setting at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            key_prefix: default_key_prefix(),
            timeout_ms: default_redis_timeout(),
            local_cache_ms: default_local_cache(),
            reconnect_interval_ms: default_reconnect_interval(),
        }
    }

    /// The store's settings.
    #[cfg(feature = "redis")]
    pub fn settings(&self) -> router_state::affinity::RedisSettings {
        router_state::affinity::RedisSettings {
            url: self.url.clone(),
            key_prefix: self.key_prefix.clone(),
            timeout: Duration::from_millis(self.timeout_ms),
            cache_ttl: Duration::from_millis(self.local_cache_ms),
            reconnect_interval: Duration::from_millis(self.reconnect_interval_ms),
        }
    }
}
