//! A request's class for flow control: its tenant (a header's value, or a digest of
//! its API key) and its priority band (a header's integer, else the body's
//! `priority`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use http::HeaderMap;
use http::header::AUTHORIZATION;
use sha2::{Digest, Sha256};

use super::{ANONYMOUS, ModelFlow};
use crate::error::ApiError;

/// What flow control knows of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Class {
    /// The tenant.
    pub(crate) tenant: Arc<str>,
    /// The priority band (0 is the most urgent).
    pub(crate) band: u8,
    /// The priority the header gave, to be written into a body that has none when
    /// the section says to forward it.
    pub(crate) forward_priority: Option<i64>,
}

impl ModelFlow {
    /// The class of a request with `headers` whose body sent `body_priority`.
    ///
    /// # Errors
    /// 400 for a priority header that is not an integer, or a tenant header that is
    /// not a valid tenant name.
    pub(crate) fn classify(
        &self,
        headers: &HeaderMap,
        body_priority: Option<i64>,
    ) -> Result<Class, ApiError> {
        let priority = &self.config.priority;
        let from_header = match &priority.header {
            Some(name) => header_priority(headers, name, &priority.objectives)?,
            None => None,
        };
        let band = priority.band(from_header.or(body_priority).unwrap_or(0));
        let tenant = match &self.config.tenants {
            Some(tenants) => match &tenants.header {
                Some(name) => header_tenant(headers, name)?,
                None => key_tenant(headers),
            },
            None => Arc::from(ANONYMOUS),
        };
        Ok(Class {
            tenant,
            band,
            forward_priority: from_header.filter(|_| priority.forward && body_priority.is_none()),
        })
    }
}

/// The priority the header `name` gives: an objective's, or an integer.
fn header_priority(
    headers: &HeaderMap,
    name: &str,
    objectives: &BTreeMap<String, i64>,
) -> Result<Option<i64>, ApiError> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let value = value.to_str().ok().map(str::trim);
    value
        .and_then(|v| objectives.get(v).copied().or_else(|| v.parse::<i64>().ok()))
        .map(Some)
        .ok_or_else(|| {
            let named = if objectives.is_empty() {
                String::new()
            } else {
                " or an objective of flow.priority.objectives".to_owned()
            };
            ApiError::invalid(
                "invalid_priority",
                name,
                format!("the {name} header must be an integer{named}"),
            )
        })
}

fn header_tenant(headers: &HeaderMap, name: &str) -> Result<Arc<str>, ApiError> {
    let Some(value) = headers.get(name) else {
        return Ok(Arc::from(ANONYMOUS));
    };
    let tenant = value
        .to_str()
        .ok()
        .filter(|v| router_config::check_tenant(v).is_ok());
    tenant.map(Arc::from).ok_or_else(|| {
        ApiError::invalid(
            "invalid_tenant",
            name,
            format!(
                "the {name} header must be 1 to {} bytes of printable ASCII without spaces or \" \\ {{ }} , =",
                router_config::MAX_TENANT_BYTES
            ),
        )
    })
}

/// `key-` and the first 16 hex digits of the bearer token's SHA-256: the same key is
/// the same tenant, and no key reaches a label or a log.
fn key_tenant(headers: &HeaderMap) -> Arc<str> {
    let token = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return Arc::from(ANONYMOUS);
    };
    let digest = Sha256::digest(token);
    let mut name = String::with_capacity(20);
    name.push_str("key-");
    for byte in &digest[..8] {
        // Writing to a String cannot fail.
        let _ = write!(name, "{byte:02x}");
    }
    Arc::from(name)
}
