//! One engine as the router sees it.

use std::borrow::Borrow;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use crate::pd::PdProfile;

/// The most data-parallel ranks an engine may have (each rank gets its own feeds).
pub const MAX_DP_SIZE: u32 = 1024;

/// Stable identifier of an engine, unique within a router.
///
/// Ids are what configuration, metrics, response headers and error messages name; they
/// never contain the engine's URL unless an operator chose to make them so.
///
/// Ids compare as their strings do; two ids sharing one string (as the registry's,
/// the load table's and the prefix index's do) compare equal without reading it.
#[derive(Clone)]
pub struct EngineId(Arc<str>);

impl PartialEq for EngineId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for EngineId {}

impl PartialOrd for EngineId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for EngineId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        self.0.cmp(&other.0)
    }
}

/// Hashes as the string does, so an id and its `&str` find the same map entry.
impl std::hash::Hash for EngineId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl EngineId {
    /// Wraps an id string.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shared string behind the id, for cheap clones (metric labels).
    pub fn as_arc_str(&self) -> &Arc<str> {
        &self.0
    }
}

impl fmt::Debug for EngineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for EngineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Borrow<str> for EngineId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for EngineId {
    fn from(id: &str) -> Self {
        Self(id.into())
    }
}

impl From<String> for EngineId {
    fn from(id: String) -> Self {
        Self(id.into())
    }
}

/// What an engine does in a request: serve it whole, or one side of a
/// prefill/decode (PD) pair. The same values name the stage of a pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Serves a whole request.
    Plain,
    /// Computes the prompt's KV cache and hands it to a decode engine.
    Prefill,
    /// Receives the KV cache from a prefill engine and generates tokens.
    Decode,
}

impl Role {
    /// Lower-case name used in configuration, metrics and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Plain => "plain",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }

    /// Whether this role belongs to a prefill/decode pair.
    pub fn is_pd(self) -> bool {
        !matches!(self, Role::Plain)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the health checker currently lets an engine take requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Health {
    /// Routable.
    Healthy,
    /// Left out of every candidate set until it recovers.
    Unhealthy,
}

/// An engine: its identity, address, model, role and serving shape.
///
/// A `Engine` is immutable. The registry replaces the `Arc<Engine>` when any field
/// changes (health included), so a snapshot of candidates never changes under a pick,
/// and pointer identity distinguishes a candidate from a newer engine with the same id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    id: EngineId,
    /// The rendezvous seed of `id`, hashed once.
    rendezvous_seed: u64,
    url: Arc<str>,
    model: Arc<str>,
    role: Role,
    bootstrap_port: Option<u16>,
    dp_size: NonZeroU32,
    health: Health,
    /// The LoRA adapters it serves (from its `/v1/models`), sorted.
    adapters: Arc<[Arc<str>]>,
    /// What it says about the KV hand-over of a prefill/decode pair.
    pd_profile: PdProfile,
}

impl Engine {
    /// A healthy engine with one data-parallel rank and no bootstrap port.
    pub fn new(
        id: impl Into<EngineId>,
        url: impl Into<Arc<str>>,
        model: impl Into<Arc<str>>,
        role: Role,
    ) -> Self {
        let id = id.into();
        Self {
            rendezvous_seed: crate::affinity::rendezvous::seed(&id),
            id,
            url: url.into(),
            model: model.into(),
            role,
            bootstrap_port: None,
            dp_size: NonZeroU32::MIN,
            health: Health::Healthy,
            adapters: Arc::new([]),
            pd_profile: PdProfile::default(),
        }
    }

    /// Sets the LoRA adapters the engine serves.
    pub fn with_adapters(
        mut self,
        adapters: impl IntoIterator<Item = impl Into<Arc<str>>>,
    ) -> Self {
        let mut adapters: Vec<Arc<str>> = adapters.into_iter().map(Into::into).collect();
        adapters.sort();
        adapters.dedup();
        self.adapters = adapters.into();
        self
    }

    /// Sets what the engine says about the KV hand-over of a prefill/decode pair.
    pub fn with_pd_profile(mut self, profile: PdProfile) -> Self {
        self.pd_profile = profile;
        self
    }

    /// Sets the port of the prefill engine's KV-transfer bootstrap server.
    pub fn with_bootstrap_port(mut self, port: u16) -> Self {
        self.bootstrap_port = Some(port);
        self
    }

    /// Sets the number of data-parallel ranks (each publishes its own load and events).
    pub fn with_dp_size(mut self, dp_size: NonZeroU32) -> Self {
        self.dp_size = dp_size;
        self
    }

    /// Sets the health state.
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = health;
        self
    }

    /// The engine's stable id.
    pub fn id(&self) -> &EngineId {
        &self.id
    }

    /// [`rendezvous::seed`](crate::affinity::rendezvous::seed) of its id, computed
    /// once when the engine was made.
    pub fn rendezvous_seed(&self) -> u64 {
        self.rendezvous_seed
    }

    /// Base URL the router sends requests to, e.g. `http://10.0.0.7:30000`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The model this engine serves (the `model` field clients send).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Plain, prefill or decode.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Bootstrap port of a prefill engine, when known.
    pub fn bootstrap_port(&self) -> Option<u16> {
        self.bootstrap_port
    }

    /// Number of data-parallel ranks.
    pub fn dp_size(&self) -> NonZeroU32 {
        self.dp_size
    }

    /// The LoRA adapters the engine serves, sorted.
    pub fn adapters(&self) -> &[Arc<str>] {
        &self.adapters
    }

    /// Whether the engine serves LoRA adapter `name`.
    pub fn serves_adapter(&self, name: &str) -> bool {
        self.adapters
            .binary_search_by(|a| a.as_ref().cmp(name))
            .is_ok()
    }

    /// What the engine says about the KV hand-over of a prefill/decode pair.
    pub fn pd_profile(&self) -> &PdProfile {
        &self.pd_profile
    }

    /// Current health.
    pub fn health(&self) -> Health {
        self.health
    }

    /// Whether the engine may be offered as a candidate.
    pub fn is_healthy(&self) -> bool {
        self.health == Health::Healthy
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn ids_compare_and_hash_as_their_strings_shared_or_not(a in "[a-c]{0,3}", b in "[a-c]{0,3}") {
            let (id_a, id_b) = (EngineId::from(a.as_str()), EngineId::from(b.as_str()));
            let shared = id_a.clone();
            let hasher = std::collections::hash_map::RandomState::new();
            prop_assert_eq!(id_a == id_b, a == b);
            prop_assert_eq!(id_a.cmp(&id_b), a.cmp(&b));
            prop_assert_eq!(id_a.partial_cmp(&id_b), Some(a.cmp(&b)));
            prop_assert!(id_a == shared && id_a.cmp(&shared).is_eq());
            prop_assert_eq!(hasher.hash_one(&id_a), hasher.hash_one(a.as_str()));
            prop_assert_eq!(hasher.hash_one(&shared), hasher.hash_one(a.as_str()));
        }
    }
}
