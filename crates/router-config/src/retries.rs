//! The `retries` section: how often a request an engine never started is sent to
//! another engine, and the router-wide budget that keeps retries from becoming a
//! storm.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ConfigError, MAX_MS};

/// Retries of requests an engine never started: the connection was refused, timed
/// out or reset before the request was written, or the engine answered 429 or 503
/// before any byte reached the client. Each retry goes to another engine of the
/// bucket first picked (PD: both legs, with a fresh bootstrap room); the budget
/// allows `budget_floor` retries in any window plus `budget_ratio` of the requests
/// dispatched in it.
///
/// ```yaml
/// retries: {max_attempts: 3, budget_ratio: 0.2, budget_floor: 10, budget_window_ms: 10000}
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Most attempts a request gets, the first included; 1 turns retries off.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Retries allowed in a window as a fraction of the requests dispatched in it.
    #[serde(default = "default_budget_ratio")]
    pub budget_ratio: f64,
    /// Retries allowed in any window whatever the traffic, so a quiet router can
    /// still step around a dead engine.
    #[serde(default = "default_budget_floor")]
    pub budget_floor: u32,
    /// The window the budget counts over, in milliseconds.
    #[serde(default = "default_budget_window")]
    pub budget_window_ms: u64,
}

/// The most attempts a request may be given.
const MAX_ATTEMPTS: u32 = 10;
/// The largest floor accepted.
const MAX_FLOOR: u32 = 1_000_000;

fn default_max_attempts() -> u32 {
    3
}
fn default_budget_ratio() -> f64 {
    0.2
}
fn default_budget_floor() -> u32 {
    10
}
fn default_budget_window() -> u64 {
    10_000
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: default_max_attempts(),
            budget_ratio: default_budget_ratio(),
            budget_floor: default_budget_floor(),
            budget_window_ms: default_budget_window(),
        }
    }
}

impl RetryConfig {
    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let &Self {
            max_attempts,
            budget_ratio,
            budget_floor,
            budget_window_ms,
        } = self;
        if !(1..=MAX_ATTEMPTS).contains(&max_attempts) {
            errors.push(ConfigError::at(
                "retries.max_attempts",
                format_args!("must be between 1 (no retries) and {MAX_ATTEMPTS}"),
            ));
        }
        if !(0.0..=1.0).contains(&budget_ratio) {
            errors.push(ConfigError::at(
                "retries.budget_ratio",
                "must be between 0 and 1",
            ));
        }
        if budget_floor > MAX_FLOOR {
            errors.push(ConfigError::at(
                "retries.budget_floor",
                format_args!("must be at most {MAX_FLOOR}"),
            ));
        }
        if !(1..=MAX_MS).contains(&budget_window_ms) {
            errors.push(ConfigError::at(
                "retries.budget_window_ms",
                format_args!("must be between 1 and {MAX_MS} (one day)"),
            ));
        }
    }
}
