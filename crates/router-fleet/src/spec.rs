//! What a source of engines says: an engine to add or replace, or one to remove.

pub use router_state::MAX_DP_SIZE;
use router_state::{EngineId, Role};

/// An engine as a source describes it. Configured values win over what the engine's
/// `/server_info` says; what neither says takes its default.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineSpec {
    /// Unique id across the router.
    pub id: EngineId,
    /// Base URL, e.g. `http://10.0.0.7:30000`.
    pub url: String,
    /// The model it serves.
    pub model: String,
    /// Plain, prefill or decode; absent = from `/server_info`.
    pub role: Option<Role>,
    /// A prefill engine's bootstrap port; absent = from `/server_info`.
    pub bootstrap_port: Option<u16>,
    /// Data-parallel ranks; absent = from `/server_info`, else 1.
    pub dp_size: Option<u32>,
    /// Base port of the `LoadStat` feed; absent = from `/server_info`, else none.
    pub load_port: Option<u16>,
    /// Base port of the KV-event publisher; absent = from `/server_info`.
    pub kv_port: Option<u16>,
    /// Base port of the KV-event replay socket; absent = from `/server_info`.
    pub kv_replay_port: Option<u16>,
}

impl EngineSpec {
    /// An engine of `model` at `url` whose role, ports and ranks come from its
    /// `/server_info`.
    pub fn new(id: impl Into<EngineId>, url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            url: url.into(),
            model: model.into(),
            role: None,
            bootstrap_port: None,
            dp_size: None,
            load_port: None,
            kv_port: None,
            kv_replay_port: None,
        }
    }

    /// With a declared role.
    pub fn with_role(mut self, role: Option<Role>) -> Self {
        self.role = role;
        self
    }
}

/// A change to the set of engines. Static configuration, a reloaded file, the admin
/// API and, later, a cluster watcher are sources of the same changes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// Add the engine; refused when its id is taken.
    Add(EngineSpec),
    /// Add the engine, or replace the one with its id (nothing changes when its
    /// spec is the same).
    Upsert(EngineSpec),
    /// Remove the engine with this id.
    Remove(EngineId),
}
