//! The `picker` section: Switchyard as the endpoint picker of a Gateway API
//! inference gateway, answering Envoy's external processing gRPC service
//! (`ext_proc`) on an address of its own. Off unless configured.

use std::net::SocketAddr;
use std::path::PathBuf;

use router_policy::ConfigError;
use router_state::Role;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{DiscoveryConfig, EngineRole, ModelConfig, Secret};

/// The most gRPC streams (requests) one gateway connection may hold open at once.
pub const MAX_PICKER_STREAMS: u32 = 1 << 20;

/// The endpoint picker: a gateway asks it which engine serves each request, and
/// routes the request there itself.
///
/// ```yaml
/// picker: {listen: 0.0.0.0:9002, token_file: /run/secrets/switchyard-picker}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PickerConfig {
    /// The address the `ext_proc` gRPC service listens on (HTTP/2, over TLS with
    /// `tls`).
    pub listen: SocketAddr,
    /// Most requests one gateway connection has in the picker at once (one gRPC
    /// stream each, from the request's headers to its answer's end); further ones
    /// wait in the gateway.
    #[serde(default = "default_max_streams")]
    #[schemars(range(min = 1, max = 1_048_576))]
    pub max_streams: u32,
    /// Bearer token every stream must carry in its `authorization` metadata (Envoy's
    /// `grpc_service.initial_metadata`; never logged); without one (or `token_file`)
    /// whoever reaches `listen` may have requests routed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// A file whose first line is the token (instead of `token`): a regular file of at
    /// most 16 KiB, read at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Serve over TLS: with a certificate and key of the operator's, or (`tls: {}`)
    /// a self-signed certificate made at start, for gateways that encrypt without
    /// verifying (the Inference Extension's default); plain HTTP/2 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<PickerTls>,
}

/// The picker's TLS: a PEM certificate chain and its private key, or neither for a
/// self-signed certificate made at start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PickerTls {
    /// The PEM certificate chain (at most 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// Its PEM private key (at most 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

fn default_max_streams() -> u32 {
    4096
}

impl PickerConfig {
    /// The picker's own address, its stream bound, and no model it cannot serve: a
    /// gateway sends a request to the one endpoint it is named, so a prefill/decode
    /// pair, which needs two legs, is served on the proxy path only.
    pub(crate) fn validate(
        &self,
        listen: SocketAddr,
        admin: Option<SocketAddr>,
        models: &[ModelConfig],
        discovery: &DiscoveryConfig,
        errors: &mut Vec<ConfigError>,
    ) {
        let taken = |other: SocketAddr| other == self.listen && other.port() != 0;
        if taken(listen) || admin.is_some_and(taken) {
            errors.push(ConfigError::at(
                "picker.listen",
                "must differ from listen and admin.listen",
            ));
        }
        if let Some(tls) = &self.tls
            && tls.cert_file.is_some() != tls.key_file.is_some()
        {
            errors.push(ConfigError::at(
                "picker.tls",
                "set both cert_file and key_file, or neither for a self-signed certificate",
            ));
        }
        if !(1..=MAX_PICKER_STREAMS).contains(&self.max_streams) {
            errors.push(ConfigError::at(
                "picker.max_streams",
                format!("must be between 1 and {MAX_PICKER_STREAMS}"),
            ));
        }
        let paired = |role: Option<EngineRole>| role.is_some_and(|r| Role::from(r).is_pd());
        for (i, model) in models.iter().enumerate() {
            let engines = model.engines.iter().any(|e| paired(e.role));
            let buckets = model
                .buckets
                .iter()
                .flatten()
                .any(|bucket| bucket.groups.pd.is_some());
            if engines || buckets {
                errors.push(ConfigError::at(
                    format!("models[{i}]"),
                    format!(
                        "model {:?} has prefill/decode engines, which the endpoint picker cannot serve (a gateway sends a request to one endpoint); serve it on the proxy path, from a router without `picker`",
                        model.id
                    ),
                ));
            }
        }
        let discovered = discovery.kubernetes.iter().flat_map(|k| k.models.iter());
        for (i, found) in discovered.enumerate() {
            if paired(found.role) {
                errors.push(ConfigError::at(
                    format!("discovery.kubernetes.models[{i}].role"),
                    "prefill and decode engines cannot be served by the endpoint picker (a gateway sends a request to one endpoint)",
                ));
            }
        }
    }
}
