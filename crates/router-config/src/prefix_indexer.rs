//! The `prefix_indexer` section: a prefix indexer shared by router replicas.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ConfigError, Secret};

/// Where a router's cache-aware groups look prompts up when replicas share one
/// prefix indexer, and the token lookups carry. `switchyard indexer` reads the same
/// file: with a token configured here it answers only lookups that carry it.
///
/// ```yaml
/// prefix_indexer: {url: "http://10.0.0.5:30100", timeout_ms: 50, token_file: /run/secrets/indexer}
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
    /// Bearer token routers send with each lookup and the indexer requires (never
    /// logged); without one (or `token_file`) lookups are not authenticated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// A file whose first line is the token (instead of `token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Lookups in flight at once (1 to 4096), across every model; one more finds the
    /// indexer unavailable at once (its pick is `cache_unavailable`) instead of
    /// queueing behind a slow indexer.
    #[serde(default = "default_max_lookups_in_flight")]
    #[schemars(range(min = 1, max = 4096))]
    pub max_lookups_in_flight: u32,
}

fn default_indexer_timeout() -> u64 {
    50
}

fn default_max_lookups_in_flight() -> u32 {
    256
}

impl PrefixIndexerConfig {
    /// Lookups of the indexer at `url`, within the default timeout, with no token.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            timeout_ms: default_indexer_timeout(),
            token: None,
            token_file: None,
            max_lookups_in_flight: default_max_lookups_in_flight(),
        }
    }

    /// The URL is an engine-style base URL; the timeout 1 to 10000 ms; lookups in
    /// flight 1 to 4096. The token is checked by whoever reads it (its file is read
    /// then).
    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let Self {
            url,
            timeout_ms,
            token: _,
            token_file: _,
            max_lookups_in_flight,
        } = self;
        if !(1..=4096).contains(max_lookups_in_flight) {
            errors.push(ConfigError::at(
                "prefix_indexer.max_lookups_in_flight",
                "must be 1 to 4096",
            ));
        }
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
