//! Rotation over the candidates with a cursor owned by the policy instance.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use router_state::{Engine, EngineReportedLoadTable, Reservation};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::admission::{AdmissionLimits, EngineAdmission};
use crate::config_error::PolicyConfigError;
use crate::error::{PickError, Rejection};
use crate::future::BoxFuture;
use crate::pick::{Pick, PickReason};
use crate::policy::{PickRequest, Policy};
use crate::settings::{PolicyHandles, PolicySettings, admission_field};
use crate::walk::{first_admitted, reserve};

/// Takes the candidates in turn. Each instance (one per engine group) has its own
/// cursor, so `n` consecutive picks over an unchanged set of `n` candidates visit each
/// once. A rejected engine is skipped for the next admissible one in rotation order;
/// when all are rejected the pick fails with every rejection.
#[derive(Debug)]
pub struct RoundRobinPolicy {
    load: Arc<EngineReportedLoadTable>,
    admission: Arc<dyn EngineAdmission>,
    cursor: AtomicUsize,
}

impl RoundRobinPolicy {
    /// A policy reading load for admission from `load`.
    pub fn new(load: Arc<EngineReportedLoadTable>, admission: Arc<dyn EngineAdmission>) -> Self {
        Self {
            load,
            admission,
            cursor: AtomicUsize::new(0),
        }
    }

    fn select(
        &self,
        engines: &[Arc<Engine>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        let n = engines.len();
        if n == 0 {
            return Err(PickError::NoCandidates {
                stage: request.stage,
            });
        }
        // A dry run reads the cursor without moving it.
        let start = if !request.moves_own_state() {
            self.cursor.load(Ordering::Relaxed)
        } else {
            self.cursor.fetch_add(1, Ordering::Relaxed)
        } % n;
        let reason = if n == 1 {
            PickReason::SingleCandidate
        } else {
            PickReason::RoundRobin
        };
        first_admitted(
            engines,
            (0..n).map(|k| (start + k) % n),
            &self.load.snapshot(),
            self.admission.as_ref(),
            request,
            reason,
            Vec::new(),
        )
    }
}

impl Policy for RoundRobinPolicy {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Engine>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        Box::pin(std::future::ready(self.select(engines, request)))
    }

    fn reads_prompt(&self) -> bool {
        false
    }
    fn reserve(&self, pick: &Pick) -> Result<Option<Reservation>, Rejection> {
        reserve(&self.load, self.admission.as_ref(), pick)
    }
}

/// Settings of `round_robin`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoundRobinConfig {
    /// Per-engine caps.
    #[serde(default)]
    pub admission: AdmissionLimits,
}

impl PolicySettings for RoundRobinConfig {
    admission_field!();

    fn build(
        &self,
        admission: Arc<dyn EngineAdmission>,
        handles: &PolicyHandles,
    ) -> Result<Arc<dyn Policy>, PolicyConfigError> {
        Ok(Arc::new(RoundRobinPolicy::new(
            Arc::clone(&handles.load),
            admission,
        )))
    }
}
