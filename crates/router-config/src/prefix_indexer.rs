//! The `prefix_indexer` section: a prefix indexer shared by router replicas.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ConfigError, Secret};

/// The most indexers one section may name.
pub const MAX_INDEXERS: usize = 4;

/// Where a router's cache-aware groups look prompts up when replicas share one
/// prefix indexer, and the token lookups carry. `switchyard indexer` reads the same
/// file: with a token configured here it answers only lookups that carry it.
///
/// ```yaml
/// prefix_indexer: {url: "http://10.0.0.5:30100", timeout_ms: 50, token_file: /run/secrets/indexer}
/// ```
///
/// Two indexers (or more) of one fleet, in order of preference: a lookup goes to the
/// first whose breaker is closed, and to the next when it fails.
///
/// ```yaml
/// prefix_indexer: {urls: ["http://10.0.0.5:30100", "http://10.0.0.6:30100"]}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrefixIndexerConfig {
    /// The indexer's base URL, `http://host:port` (or `https://host:port`, reached
    /// with the `engine_tls` settings); `url` or `urls`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Indexers of the same fleet, in order of preference (1 to 4 distinct URLs, each
    /// as `url`): a lookup goes to the first whose breaker is closed and, when that
    /// one fails, to the next within what remains of `timeout_ms`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub urls: Vec<String>,
    /// Longest wait for a lookup, in milliseconds (1 to 10000), every indexer it
    /// tries included; past it the pick is `cache_unavailable` and the cache-miss
    /// fallback runs.
    #[serde(default = "default_indexer_timeout")]
    pub timeout_ms: u64,
    /// Bearer token routers send with each lookup and the indexer requires (never
    /// logged); without one (or `token_file`) lookups are not authenticated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// A file whose first line is the token (instead of `token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Lookups in flight at once (1 to 4096), across every model and indexer; one
    /// more finds the indexer unavailable at once (its pick is `cache_unavailable`)
    /// instead of queueing behind a slow indexer.
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
            url: Some(url.into()),
            urls: Vec::new(),
            timeout_ms: default_indexer_timeout(),
            token: None,
            token_file: None,
            max_lookups_in_flight: default_max_lookups_in_flight(),
        }
    }

    /// Lookups of the indexers at `urls`, in that order of preference, within the
    /// default timeout, with no token.
    pub fn failover<S: Into<String>>(urls: impl IntoIterator<Item = S>) -> Self {
        Self {
            url: None,
            urls: urls.into_iter().map(Into::into).collect(),
            ..Self::new("")
        }
    }

    /// The indexers' URLs in order of preference: `url`, or those of `urls`.
    pub fn indexer_urls(&self) -> Vec<&str> {
        self.url
            .iter()
            .chain(&self.urls)
            .map(String::as_str)
            .collect()
    }

    /// One indexer URL (`url`) or 1 to [`MAX_INDEXERS`] distinct ones (`urls`),
    /// each an engine-style base URL; the timeout 1 to 10000 ms; lookups in flight 1
    /// to 4096. The token is checked by whoever reads it (its file is read then).
    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let Self {
            url,
            urls,
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
        match (url, urls.is_empty()) {
            (Some(_), false) => errors.push(ConfigError::at(
                "prefix_indexer.urls",
                "set url or urls, not both",
            )),
            (None, true) => errors.push(ConfigError::at(
                "prefix_indexer.url",
                "one indexer's url (or urls) is required",
            )),
            _ => {}
        }
        if let Some(url) = url
            && let Err(e) = router_upstream::check_engine_url(url)
        {
            errors.push(ConfigError::at("prefix_indexer.url", e));
        }
        if urls.len() > MAX_INDEXERS {
            errors.push(ConfigError::at(
                "prefix_indexer.urls",
                format!("at most {MAX_INDEXERS} indexers"),
            ));
        }
        for (i, each) in urls.iter().enumerate() {
            let at = format!("prefix_indexer.urls[{i}]");
            if let Err(e) = router_upstream::check_engine_url(each) {
                errors.push(ConfigError::at(&at, e));
            } else if urls[..i].contains(each) {
                errors.push(ConfigError::at(&at, "named twice"));
            }
        }
        if !(1..=10_000).contains(timeout_ms) {
            errors.push(ConfigError::at(
                "prefix_indexer.timeout_ms",
                "must be 1 to 10000",
            ));
        }
    }
}
