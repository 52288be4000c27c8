//! A request's class for flow control: its tenant (a header's value, or a digest of
//! its API key) and its priority band (a header's integer, else the body's
//! `priority`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use http::HeaderMap;
use http::header::AUTHORIZATION;
use sha2::{Digest, Sha256};

use super::objectives::ClusterObjectives;
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
    /// The class of a request to `model` with `headers` whose body sent
    /// `body_priority`; `cluster` has the objectives the cluster gives the model (its
    /// band is then the header's objective's alone).
    ///
    /// # Errors
    /// 400 for a priority header that is not an integer or an objective, or a tenant
    /// header that is not a valid tenant name.
    pub(crate) fn classify(
        &self,
        headers: &HeaderMap,
        body_priority: Option<i64>,
        (cluster, model): (&ClusterObjectives, &str),
    ) -> Result<Class, ApiError> {
        let priority = &self.config.priority;
        let (from_header, ordering) = cluster.read(model, |cluster| {
            let from_header = match &priority.header {
                Some(name) => header_priority(headers, name, &priority.objectives, cluster)?,
                None => None,
            };
            // A model whose objectives the cluster gives is ordered by them alone:
            // the body's priority goes to the engine, but no client chooses its own
            // band.
            let ordering = match cluster {
                Some(_) => from_header,
                None => from_header.or(body_priority),
            };
            Ok::<_, ApiError>((from_header, ordering))
        })?;
        let band = priority.band(ordering.unwrap_or(0));
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

/// The priority the header `name` gives: an objective's of the configuration, else,
/// for a model whose objectives the cluster gives, the cluster's objective's (a name
/// it does not know is no priority, as one may come or go at any time, and an
/// integer is a name like any other), else an integer.
fn header_priority(
    headers: &HeaderMap,
    name: &str,
    objectives: &BTreeMap<String, i64>,
    cluster: Option<&BTreeMap<String, i64>>,
) -> Result<Option<i64>, ApiError> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let value = value.to_str().ok().map(str::trim);
    if let Some(value) = value {
        if let Some(priority) = objectives.get(value) {
            return Ok(Some(*priority));
        }
        if let Some(cluster) = cluster {
            return Ok(cluster.get(value).copied());
        }
        if let Ok(priority) = value.parse::<i64>() {
            return Ok(Some(priority));
        }
    }
    let named = if objectives.is_empty() {
        ""
    } else {
        " or an objective of flow.priority.objectives"
    };
    Err(ApiError::invalid(
        "invalid_priority",
        name,
        format!("the {name} header must be an integer{named}"),
    ))
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
