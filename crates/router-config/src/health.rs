//! The `health` section: probes of each engine's `/health` and the circuit breaker
//! dispatch failures feed.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::timeouts::{check_count, check_ms};
use crate::{ConfigError, MAX_MS};

/// Health probes (`GET /health`) and the circuit breaker fed by dispatch failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// Time between probes of an engine, in milliseconds.
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
    /// A probe's timeout, in milliseconds.
    #[serde(default = "default_probe_timeout")]
    pub timeout_ms: u64,
    /// Consecutive failed probes that make an engine unhealthy.
    #[serde(default = "default_failures")]
    pub failure_threshold: u32,
    /// Consecutive passed probes that make an unhealthy engine healthy again.
    #[serde(default = "default_successes")]
    pub success_threshold: u32,
    /// Consecutive dispatches without an answer (connection failed, broken or timed
    /// out) that open an engine's breaker; an answer of any status is not a failure.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long an open breaker waits before its half-open trial (the next
    /// dispatch), in milliseconds.
    #[serde(default = "default_cooldown")]
    pub breaker_cooldown_ms: u64,
    /// The largest share (0-100) of a pool (a model's engines of one role; each
    /// group the buckets list by id) that open breakers may hold out at once.
    #[serde(default = "default_max_ejected_percent")]
    pub max_ejected_percent: u8,
}

fn default_interval() -> u64 {
    2_000
}
fn default_probe_timeout() -> u64 {
    2_000
}
fn default_failures() -> u32 {
    3
}
fn default_successes() -> u32 {
    2
}
fn default_breaker_failures() -> u32 {
    5
}
fn default_cooldown() -> u64 {
    10_000
}
fn default_max_ejected_percent() -> u8 {
    50
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval_ms: default_interval(),
            timeout_ms: default_probe_timeout(),
            failure_threshold: default_failures(),
            success_threshold: default_successes(),
            breaker_failures: default_breaker_failures(),
            breaker_cooldown_ms: default_cooldown(),
            max_ejected_percent: default_max_ejected_percent(),
        }
    }
}

impl HealthConfig {
    /// Probe times are 1 ms to one day, thresholds at least 1, the ejected share a
    /// percentage.
    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let Self {
            interval_ms,
            timeout_ms,
            failure_threshold,
            success_threshold,
            breaker_failures,
            breaker_cooldown_ms,
            max_ejected_percent,
        } = *self;
        if max_ejected_percent > 100 {
            errors.push(ConfigError::at(
                "health.max_ejected_percent",
                format_args!("must be at most 100, got {max_ejected_percent}"),
            ));
        }
        check_ms("health.interval_ms", interval_ms, errors);
        check_ms("health.timeout_ms", timeout_ms, errors);
        // 0: an open breaker lets a probe through at once. A day at most: the
        // breaker's reopening time is its opening time plus the cooldown, which
        // overflows the clock (a panic) for the largest values.
        if breaker_cooldown_ms > MAX_MS {
            errors.push(ConfigError::at(
                "health.breaker_cooldown_ms",
                format_args!("must be at most {MAX_MS} (one day)"),
            ));
        }
        for (field, value) in [
            ("health.failure_threshold", failure_threshold),
            ("health.success_threshold", success_threshold),
            ("health.breaker_failures", breaker_failures),
        ] {
            check_count(field, u64::from(value), errors);
        }
    }
}
