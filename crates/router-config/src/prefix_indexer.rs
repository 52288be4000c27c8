//! The `prefix_indexer` section: a prefix indexer shared by router replicas.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// Where a router's cache-aware groups look prompts up when replicas share one
/// prefix indexer.
///
/// ```yaml
/// prefix_indexer: {url: "http://10.0.0.5:30100", timeout_ms: 50}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrefixIndexerConfig {
    /// The indexer's base URL, `http://host:port` (or `https://host:port`, reached
    /// with the `engine_tls` settings).
    pub url: String,
    /// Longest wait for a lookup, in milliseconds (1 to 10000); past it the pick is
    /// `cache_unavailable` and the cache-miss fallback runs.
    #[serde(default = "default_indexer_timeout")]
    pub timeout_ms: u64,
}

fn default_indexer_timeout() -> u64 {
    50
}

impl PrefixIndexerConfig {
    /// The URL is an engine-style base URL; the timeout 1 to 10000 ms.
    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let Self { url, timeout_ms } = self;
        if let Err(e) = router_upstream::check_engine_url(url) {
            errors.push(ConfigError::at("prefix_indexer.url", e));
        }
        if !(1..=10_000).contains(timeout_ms) {
            errors.push(ConfigError::at(
                "prefix_indexer.timeout_ms",
                "must be 1 to 10000",
            ));
        }
    }
}
