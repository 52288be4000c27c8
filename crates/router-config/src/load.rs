//! The `load` section: how engines' load reports are read and how long they count.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::timeouts::check_ms;
use crate::{ConfigError, MAX_MS};

/// The shortest interval between reads of an engine's `/metrics`.
const MIN_METRICS_INTERVAL_MS: u64 = 10;

/// Engine load reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadConfig {
    /// How long a rank's report stays fresh after receipt, in milliseconds.
    #[serde(default = "default_freshness")]
    pub freshness_ms: u64,
    /// How often an engine that serves no `/server_info` (vLLM, which has no
    /// `LoadStat` feed) has its load read from its `/metrics`, in milliseconds; 0
    /// never reads it.
    #[serde(default = "default_metrics_interval")]
    pub metrics_interval_ms: u64,
}

fn default_freshness() -> u64 {
    5_000
}

fn default_metrics_interval() -> u64 {
    1_000
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            freshness_ms: default_freshness(),
            metrics_interval_ms: default_metrics_interval(),
        }
    }
}

impl LoadConfig {
    /// Freshness is 1 ms to one day; `/metrics` is read never or every 10 ms to one
    /// day.
    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let Self {
            freshness_ms,
            metrics_interval_ms,
        } = *self;
        check_ms("load.freshness_ms", freshness_ms, errors);
        if metrics_interval_ms != 0
            && !(MIN_METRICS_INTERVAL_MS..=MAX_MS).contains(&metrics_interval_ms)
        {
            errors.push(ConfigError::at(
                "load.metrics_interval_ms",
                format_args!(
                    "must be 0 (never read /metrics) or between {MIN_METRICS_INTERVAL_MS} and {MAX_MS} (one day)"
                ),
            ));
        }
    }
}
