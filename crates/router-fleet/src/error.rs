//! Why a change could not be applied.

use router_state::{EngineId, NameError, RegistryError};
use router_upstream::EngineUrlError;

use crate::spec::{MAX_DP_SIZE, Source};

/// Why a [`Change`](crate::Change) could not be applied. Messages name engines by id
/// and never repeat their URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// The engine's URL is not an `http://host:port` base URL.
    #[error("url: {0}")]
    Url(#[from] EngineUrlError),
    /// The id or the model cannot name one.
    #[error("{field} {error}")]
    Name {
        /// `id` or `model`.
        field: &'static str,
        /// What is wrong with it.
        error: NameError,
    },
    /// A number of data-parallel ranks outside 1 to [`MAX_DP_SIZE`].
    #[error("dp_size {value}{} is not between 1 and {MAX_DP_SIZE}", if *.introspected { " (from /server_info)" } else { "" })]
    DpSize {
        /// The value given.
        value: u64,
        /// Whether the engine's `/server_info` said it.
        introspected: bool,
    },
    /// The engine declares no role, and introspection could not tell it.
    #[error("{}", if *.reachable {
        "the engine's /server_info does not say its role; set `role`"
    } else {
        "the engine is unreachable, so its role is unknown; set `role`"
    })]
    UnknownRole {
        /// Whether the engine answered at all.
        reachable: bool,
    },
    /// The engine with this id comes from another source, which alone may replace or
    /// remove it.
    #[error("engine {id} comes from {owner}, which alone may replace or remove it")]
    Owned {
        /// The engine.
        id: EngineId,
        /// Its source.
        owner: Source,
    },
    /// The registry refused it (a duplicate id, a role that would mix plain and PD
    /// engines in one model).
    #[error(transparent)]
    Registry(#[from] RegistryError),
}
