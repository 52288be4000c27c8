//! The `timeouts` section: how long the router waits for engines and for clients.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ConfigError, MAX_MS};

/// Upstream timeouts; each gives the client a 504.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeoutConfig {
    /// Connecting to an engine, with the TLS handshake for an `https://` one, in
    /// milliseconds.
    #[serde(default = "default_connect")]
    pub connect_ms: u64,
    /// From sending a request to the engine's response head, in milliseconds.
    #[serde(default = "default_first_byte")]
    pub first_byte_ms: u64,
    /// Longest silence between two body chunks of a response, in milliseconds.
    #[serde(default = "default_idle")]
    pub idle_ms: u64,
    /// How long an idle engine connection is kept for reuse, in milliseconds; keep
    /// it below the engines' keep-alive timeout (uvicorn's is 5 s).
    #[serde(default = "default_pool_idle")]
    pub pool_idle_ms: u64,
    /// How long a client may take to send a request head, counted from its first
    /// byte (from the accept, for a connection's first request), in milliseconds;
    /// then the connection is closed.
    #[serde(default = "default_client_header")]
    pub client_header_ms: u64,
    /// How long a kept-alive client connection may sit idle between a response and
    /// the next request's first byte, in milliseconds; then it is closed.
    #[serde(default = "default_client_idle")]
    pub client_idle_ms: u64,
    /// How long a client may take to send a whole request body, in milliseconds;
    /// then it gets a 408.
    #[serde(default = "default_client_body")]
    pub client_body_ms: u64,
    /// How long a client may accept no byte of an answer (a stream it stopped
    /// reading), in milliseconds; then the connection is closed, the engine legs are
    /// cancelled and the engines' in-flight slots released.
    #[serde(default = "default_client_write")]
    pub client_write_ms: u64,
}

fn default_connect() -> u64 {
    2_000
}
fn default_first_byte() -> u64 {
    300_000
}
fn default_idle() -> u64 {
    120_000
}
fn default_pool_idle() -> u64 {
    4_000
}
fn default_client_header() -> u64 {
    10_000
}
fn default_client_idle() -> u64 {
    60_000
}
fn default_client_body() -> u64 {
    30_000
}
fn default_client_write() -> u64 {
    30_000
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        Self {
            connect_ms: default_connect(),
            first_byte_ms: default_first_byte(),
            idle_ms: default_idle(),
            pool_idle_ms: default_pool_idle(),
            client_header_ms: default_client_header(),
            client_idle_ms: default_client_idle(),
            client_body_ms: default_client_body(),
            client_write_ms: default_client_write(),
        }
    }
}

impl TimeoutConfig {
    /// Every timeout is 1 ms to one day.
    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let Self {
            connect_ms,
            first_byte_ms,
            idle_ms,
            pool_idle_ms,
            client_header_ms,
            client_idle_ms,
            client_body_ms,
            client_write_ms,
        } = *self;
        for (field, value) in [
            ("timeouts.connect_ms", connect_ms),
            ("timeouts.first_byte_ms", first_byte_ms),
            ("timeouts.idle_ms", idle_ms),
            ("timeouts.pool_idle_ms", pool_idle_ms),
            ("timeouts.client_header_ms", client_header_ms),
            ("timeouts.client_idle_ms", client_idle_ms),
            ("timeouts.client_body_ms", client_body_ms),
            ("timeouts.client_write_ms", client_write_ms),
        ] {
            check_ms(field, value, errors);
        }
    }
}

/// A duration setting: at least 1 ms, at most one day.
pub(crate) fn check_ms(field: &str, value: u64, errors: &mut Vec<ConfigError>) {
    if value == 0 {
        errors.push(ConfigError::at(field, "must be at least 1"));
    } else if value > MAX_MS {
        errors.push(ConfigError::at(
            field,
            format_args!("must be at most {MAX_MS} (one day)"),
        ));
    }
}

/// A count setting: at least 1.
pub(crate) fn check_count(field: &str, value: u64, errors: &mut Vec<ConfigError>) {
    if value == 0 {
        errors.push(ConfigError::at(field, "must be at least 1"));
    }
}
