//! What a policy type's settings provide ([`PolicySettings`]: caps, needs, how the
//! policy is built) and the shared state every policy is built around
//! ([`PolicyHandles`], with the [`AffinityBackend`] affinity policies keep keys in).
//! Each policy's file implements the trait; the registry of policy types (`config`)
//! dispatches to it.

use std::fmt;
use std::sync::Arc;

use router_state::affinity::AffinityStore;
use router_state::{EngineReportedLoadTable, Role};

use crate::admission::{AdmissionLimits, EngineAdmission};
use crate::cache::CacheSource;
use crate::config_error::PolicyConfigError;
use crate::policy::Policy;

/// A policy type's settings: the caps it applies, what it needs and how it is built.
/// Each policy's file implements it for the policy's settings; registering the type
/// is one line in the `policy_types!` list of the registry (`config`), which names it
/// and gives it its place in the configuration, its schema and its documentation.
pub trait PolicySettings: fmt::Debug + Send + Sync {
    /// The per-engine caps; the policy checks them where its algorithm needs to.
    fn admission(&self) -> &AdmissionLimits;

    /// The per-engine caps, for editing.
    fn admission_mut(&mut self) -> &mut AdmissionLimits;

    /// Checks the settings beyond the caps (by default there are none).
    ///
    /// # Errors
    /// The first invalid setting.
    fn validate(&self) -> Result<(), PolicyConfigError> {
        Ok(())
    }

    /// Checks that the policy can pick engines of `role` (by default, every role).
    ///
    /// # Errors
    /// A role the policy cannot pick for.
    fn check_role(&self, role: Role) -> Result<(), PolicyConfigError> {
        let _ = role;
        Ok(())
    }

    /// Whether the policy reads prefix ownership (and so needs token ids and a prefix
    /// source).
    fn needs_prefix_source(&self) -> bool {
        false
    }

    /// Whether the policy keeps keys on engines (and so needs the affinity backend).
    fn needs_affinity(&self) -> bool {
        false
    }

    /// Builds the policy around the shared `handles`, with `admission` made from its
    /// caps.
    ///
    /// # Errors
    /// State the policy needs is missing from `handles`.
    fn build(
        &self,
        admission: Arc<dyn EngineAdmission>,
        handles: &PolicyHandles,
    ) -> Result<Arc<dyn Policy>, PolicyConfigError>;
}

/// The two accessors of a settings struct's `admission` field, for its
/// [`PolicySettings`] impl.
macro_rules! admission_field {
    () => {
        fn admission(&self) -> &$crate::admission::AdmissionLimits {
            &self.admission
        }

        fn admission_mut(&mut self) -> &mut $crate::admission::AdmissionLimits {
            &mut self.admission
        }
    };
}
pub(crate) use admission_field;

/// The shared state policies are built with. Application wiring creates each handle
/// once; every policy holds clones of the same `Arc`s.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PolicyHandles {
    /// Reported engine load and router-local request accounting.
    pub load: Arc<EngineReportedLoadTable>,
    /// The model's prefix-ownership source, for cache-aware policies.
    pub prefix: Option<Arc<dyn CacheSource>>,
    /// Where affinity policies keep session and routing-key engines.
    pub affinity: Option<AffinityBackend>,
}

impl PolicyHandles {
    /// Handles around a load table, with no prefix source.
    pub fn new(load: Arc<EngineReportedLoadTable>) -> Self {
        Self {
            load,
            prefix: None,
            affinity: None,
        }
    }

    /// Sets where session-aware and sticky policies keep their keys' engines.
    pub fn with_affinity(mut self, backend: Option<AffinityBackend>) -> Self {
        self.affinity = backend;
        self
    }

    /// Sets the prefix source cache-aware policies read.
    pub fn with_prefix_source(mut self, source: Option<Arc<dyn CacheSource>>) -> Self {
        self.prefix = source;
        self
    }
}

/// Where affinity policies keep a key's engine.
#[derive(Debug, Clone)]
pub enum AffinityBackend {
    /// Bindings in a store: the process's own, or one shared by replicas.
    Store(Arc<dyn AffinityStore>),
    /// No bindings: the key's rendezvous order over the candidates.
    Rendezvous,
}
