//! The `traces` section: the router's own spans exported over OTLP/HTTP, off unless an
//! endpoint is given.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// Spans of the router's own work, exported to an OpenTelemetry collector over
/// OTLP/HTTP (protobuf): one server span a routed request (the child of the client's
/// `traceparent` when it sends a valid one), with spans for preparation, selection,
/// each bucket tried, and each request sent to an engine (whose `traceparent` then
/// names that span). Spans wait in a bounded queue for a thread of their own to export
/// them in batches; a span that finds the queue full is dropped, never waited for.
///
/// ```yaml
/// traces: {otlp_endpoint: "http://otel-collector:4318/v1/traces", sample_ratio: 0.1}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TracesConfig {
    /// Where spans are posted: a collector's OTLP/HTTP traces URL.
    pub otlp_endpoint: String,
    /// `service.name` of the spans.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// The share of routed requests whose spans are recorded, above 0 and at most 1:
    /// exactly every `1 / sample_ratio`-th one (rounded), also of those that continue
    /// a client's trace, unless `honor_client_sampling`.
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
    /// A request continuing a client's trace is recorded when the client's
    /// `traceparent` says its trace is sampled, and only then, whatever
    /// `sample_ratio` says. Off by default: clients then cannot make the router
    /// export more spans than its ratio allows.
    #[serde(default)]
    pub honor_client_sampling: bool,
    /// How long one export may take, in milliseconds.
    #[serde(default = "default_export_timeout_ms")]
    pub export_timeout_ms: u64,
    /// Spans waiting to be exported, at most; past it a span is dropped.
    #[serde(default = "default_queue")]
    pub queue: usize,
}

/// The longest endpoint URL accepted.
const MAX_ENDPOINT_BYTES: usize = 2048;
/// The longest service name accepted.
const MAX_SERVICE_NAME_BYTES: usize = 128;
/// The longest queue accepted.
const MAX_QUEUE: usize = 1 << 16;

fn default_service_name() -> String {
    "switchyard".into()
}
fn default_sample_ratio() -> f64 {
    1.0
}
fn default_export_timeout_ms() -> u64 {
    10_000
}
fn default_queue() -> usize {
    2048
}

impl TracesConfig {
    /// Spans of every request to `otlp_endpoint`, with the default bounds.
    pub fn new(otlp_endpoint: impl Into<String>) -> Self {
        Self {
            otlp_endpoint: otlp_endpoint.into(),
            service_name: default_service_name(),
            sample_ratio: default_sample_ratio(),
            honor_client_sampling: false,
            export_timeout_ms: default_export_timeout_ms(),
            queue: default_queue(),
        }
    }

    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let Self {
            otlp_endpoint,
            service_name,
            sample_ratio,
            // Either way is valid.
            honor_client_sampling: _,
            export_timeout_ms,
            queue,
        } = self;
        let mut fail = |field: &str, message: String| {
            errors.push(ConfigError::at(format!("traces.{field}"), message));
        };
        let endpoint = otlp_endpoint;
        if endpoint.len() > MAX_ENDPOINT_BYTES
            || !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
            || http::Uri::try_from(endpoint.as_str()).is_err()
        {
            fail(
                "otlp_endpoint",
                format!("must be an http:// or https:// URL of at most {MAX_ENDPOINT_BYTES} bytes"),
            );
        }
        let name = service_name;
        if name.is_empty()
            || name.len() > MAX_SERVICE_NAME_BYTES
            || !name.bytes().all(|b| b.is_ascii_graphic())
        {
            fail(
                "service_name",
                format!("must be 1 to {MAX_SERVICE_NAME_BYTES} printable ASCII characters"),
            );
        }
        if !(*sample_ratio > 0.0 && *sample_ratio <= 1.0) {
            fail(
                "sample_ratio",
                format!("must be above 0 and at most 1, not {}", *sample_ratio),
            );
        }
        if !(100..=60_000).contains(export_timeout_ms) {
            fail("export_timeout_ms", "must be between 100 and 60000".into());
        }
        if !(1..=MAX_QUEUE).contains(queue) {
            fail("queue", format!("must be between 1 and {MAX_QUEUE}"));
        }
    }
}
