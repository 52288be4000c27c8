//! The `admin` section: whether the engine admin API (`/workers`) is served, with
//! which token, and on which address. Off unless a token is configured; the serving
//! crate reads the token and checks it.

use std::net::SocketAddr;
use std::path::PathBuf;

use router_policy::ConfigError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Secret;

/// The engine admin API (`/workers`): off unless a token is configured, here or in
/// the `SWITCHYARD_ADMIN_TOKEN` environment variable.
///
/// ```yaml
/// admin: {token_file: /run/secrets/switchyard-admin, listen: 127.0.0.1:9090}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Bearer token the admin API requires (never logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// A file whose first line is the token (instead of `token`): a regular file of at
    /// most 16 KiB, read again on every reload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Serve the admin API on this address instead of the public one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
}

impl AdminConfig {
    /// The admin API's own address differs from the public one (`listen`).
    pub(crate) fn validate_listen(&self, listen: SocketAddr, errors: &mut Vec<ConfigError>) {
        if self
            .listen
            .is_some_and(|admin| admin == listen && admin.port() != 0)
        {
            errors.push(ConfigError::at(
                "admin.listen",
                "must differ from listen; omit it to serve the admin API on the public address",
            ));
        }
    }
}
