//! The `engine_tls` section: how engines at `https://` URLs are trusted, and the
//! client certificate shown to those that ask for one. The serving crate reads the
//! files and reports what is wrong with them.

use std::path::PathBuf;

use router_policy::ConfigError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// TLS to engines at `https://` URLs. Their certificates must be signed by an
/// authority the system trusts or one in `ca_file`, and name the host of the
/// engine's URL; `cert_file` and `key_file` (both or neither) are shown to engines
/// that ask for a client certificate (mutual TLS). Without the section, `https://`
/// engines are trusted by the system's authorities alone. The files are read at
/// startup (each at most 1 MiB of PEM); a restart reads them again.
///
/// ```yaml
/// engine_tls:
///   ca_file: /etc/switchyard/engines-ca.pem
///   cert_file: /etc/switchyard/router.pem
///   key_file: /etc/switchyard/router.key
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EngineTlsConfig {
    /// PEM certificates of authorities trusted besides the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The router's PEM certificate chain (its own certificate first), for engines
    /// that require a client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// The PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

impl EngineTlsConfig {
    /// Each path names a file; the client certificate and its key come together.
    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let Self {
            ca_file,
            cert_file,
            key_file,
        } = self;
        let mut fail = |field: &str, message: &str| {
            errors.push(ConfigError::at(format!("engine_tls.{field}"), message));
        };
        for (field, path) in [
            ("ca_file", ca_file),
            ("cert_file", cert_file),
            ("key_file", key_file),
        ] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                fail(field, "must name a file");
            }
        }
        match (cert_file, key_file) {
            (Some(_), None) => fail(
                "key_file",
                "must be set with cert_file: the client certificate needs its key",
            ),
            (None, Some(_)) => fail(
                "cert_file",
                "must be set with key_file: the key needs its client certificate",
            ),
            _ => {}
        }
    }
}
