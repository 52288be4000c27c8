//! The `routing_headers` setting: what a client is told of how its request was
//! routed.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The routing headers of an answer (`x-switchyard-bucket`, `x-switchyard-engine`,
/// `x-switchyard-prefill`, `x-switchyard-decode`, `x-switchyard-reason`,
/// `x-switchyard-prompt-tokens`) and the engine ids in error messages.
///
/// ```yaml
/// routing_headers: without_engines
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RoutingHeaders {
    /// Every routing header, and engine ids in error messages.
    #[default]
    All,
    /// No engine id, in a header or an error message ("the decode engine failed"):
    /// the bucket, the reason and the prompt tokens are still sent.
    WithoutEngines,
    /// No routing header and no engine id; `x-request-id` is still sent.
    None,
}

impl RoutingHeaders {
    /// Whether clients are told engine ids.
    pub fn engine_ids(self) -> bool {
        self == Self::All
    }

    /// Whether clients get the routing headers at all.
    pub fn any(self) -> bool {
        self != Self::None
    }
}
