//! What a source of engines says: an engine to add or replace, or one to remove.

use std::fmt;

pub use router_state::MAX_DP_SIZE;
use router_state::{EngineId, Role};

/// Where an engine comes from. The fleet records each engine's source, and only that
/// source may replace or remove it: an engine of one source never takes the place of
/// another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The configuration file, at startup or reloaded.
    Config,
    /// The admin API (`/workers`).
    Admin,
    /// Kubernetes discovery.
    Kubernetes,
}

impl Source {
    /// `config`, `admin` or `kubernetes`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Admin => "admin",
            Self::Kubernetes => "kubernetes",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Config => "the configuration file",
            Self::Admin => "the admin API",
            Self::Kubernetes => "Kubernetes discovery",
        })
    }
}

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
    /// The source that adds it, and alone may replace or remove it.
    pub source: Source,
}

impl EngineSpec {
    /// An engine of `model` at `url`, from the configuration file, whose role, ports
    /// and ranks come from its `/server_info`.
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
            source: Source::Config,
        }
    }

    /// From `source`.
    pub fn with_source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    /// With a declared role.
    pub fn with_role(mut self, role: Option<Role>) -> Self {
        self.role = role;
        self
    }
}

/// A change to the set of engines. Static configuration, a reloaded file, the admin
/// API and Kubernetes discovery are sources of the same changes; each changes only
/// its own engines.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// Add the engine; refused when its id is taken.
    Add(EngineSpec),
    /// Add the engine, or replace the one with its id (nothing changes when its
    /// spec is the same); refused when another source's engine has the id.
    Upsert(EngineSpec),
    /// Remove the engine with this id; refused when it is another source's.
    Remove(EngineId, Source),
}
