//! Uniform random choice.

use std::sync::Arc;

use router_state::{Engine, EngineReportedLoadTable, Reservation};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::admission::{AdmissionLimits, EngineAdmission};
use crate::config_error::PolicyConfigError;
use crate::error::{PickError, Rejection};
use crate::future::BoxFuture;
use crate::pick::{Pick, PickReason};
use crate::policy::{PickRequest, Policy};
use crate::rng::SharedRng;
use crate::settings::{PolicyHandles, PolicySettings, admission_field};
use crate::walk::{admit, reserve};

/// Chooses a candidate uniformly at random. When admission rejects it, the choice is
/// made again uniformly among the admitted candidates; when all are rejected the pick
/// fails with every rejection.
#[derive(Debug)]
pub struct RandomPolicy {
    load: Arc<EngineReportedLoadTable>,
    admission: Arc<dyn EngineAdmission>,
    rng: SharedRng,
}

impl RandomPolicy {
    /// A policy seeded from process randomness.
    pub fn new(load: Arc<EngineReportedLoadTable>, admission: Arc<dyn EngineAdmission>) -> Self {
        Self {
            load,
            admission,
            rng: SharedRng::from_entropy(),
        }
    }

    /// A policy with a fixed seed: the same picks for the same inputs.
    pub fn with_seed(
        load: Arc<EngineReportedLoadTable>,
        admission: Arc<dyn EngineAdmission>,
        seed: u64,
    ) -> Self {
        Self {
            load,
            admission,
            rng: SharedRng::from_seed(seed),
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
        let snapshot = self.load.snapshot();
        let check = |engine: &Engine| {
            let metrics = snapshot.observe(engine.id()).metrics();
            admit(self.admission.as_ref(), engine, &metrics, request)
        };
        let mut draws = self.rng.draws(!request.moves_own_state());
        let first = draws.index(n);
        let Some(first_rejection) = check(&engines[first])? else {
            let reason = if n == 1 {
                PickReason::SingleCandidate
            } else {
                PickReason::Random
            };
            return Ok(Pick::new(Arc::clone(&engines[first]), reason));
        };
        let mut rejections = vec![first_rejection];
        let mut admitted = Vec::new();
        for (index, engine) in engines.iter().enumerate().filter(|(i, _)| *i != first) {
            match check(engine)? {
                None => admitted.push(index),
                Some(rejection) => rejections.push(rejection),
            }
        }
        if admitted.is_empty() {
            return Err(PickError::NoAdmissibleEngine {
                stage: request.stage,
                rejections,
            });
        }
        Ok(Pick::new(
            Arc::clone(&engines[admitted[draws.index(admitted.len())]]),
            PickReason::NextAdmitted,
        ))
    }
}

impl Policy for RandomPolicy {
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

/// Settings of `random`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RandomConfig {
    /// Per-engine caps.
    #[serde(default)]
    pub admission: AdmissionLimits,
    /// Fixed seed for reproducible choices; absent = seeded per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl PolicySettings for RandomConfig {
    admission_field!();

    fn build(
        &self,
        admission: Arc<dyn EngineAdmission>,
        handles: &PolicyHandles,
    ) -> Result<Arc<dyn Policy>, PolicyConfigError> {
        let load = Arc::clone(&handles.load);
        Ok(match self.seed {
            Some(seed) => Arc::new(RandomPolicy::with_seed(load, admission, seed)),
            None => Arc::new(RandomPolicy::new(load, admission)),
        })
    }
}
