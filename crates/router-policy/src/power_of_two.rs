//! Power-of-two choices with stage-aware pressure comparison.

use std::cmp::Ordering;
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
use crate::pressure::{Basis, compare};
use crate::rng::SharedRng;
use crate::settings::{PolicyHandles, PolicySettings, admission_field};
use crate::walk::{admit, reserve};

/// Samples two distinct candidates uniformly and keeps the one under lower stage
/// pressure (a complete tie keeps the first sampled); a single candidate is taken
/// directly. Admission runs exactly once, on the chosen engine, against the
/// observation it was chosen on: a rejection is returned to the bucket loop, with no
/// resampling and no switch to the other sample.
#[derive(Debug)]
pub struct PowerOfTwoPolicy {
    load: Arc<EngineReportedLoadTable>,
    admission: Arc<dyn EngineAdmission>,
    rng: SharedRng,
}

impl PowerOfTwoPolicy {
    /// A policy seeded from process randomness.
    pub fn new(load: Arc<EngineReportedLoadTable>, admission: Arc<dyn EngineAdmission>) -> Self {
        Self {
            load,
            admission,
            rng: SharedRng::from_entropy(),
        }
    }

    /// A policy with a fixed seed: the same samples for the same inputs.
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
        let stage = request.stage;
        if engines.is_empty() {
            return Err(PickError::NoCandidates { stage });
        }
        let snapshot = self.load.snapshot();
        let (engine, observation, reason) = if let [only] = engines {
            (
                only,
                snapshot.observe(only.id()),
                PickReason::SingleCandidate,
            )
        } else {
            let (i, j) = self
                .rng
                .draws(!request.moves_own_state())
                .two_distinct(engines.len());
            let (a, b) = (&engines[i], &engines[j]);
            let (oa, ob) = (snapshot.observe(a.id()), snapshot.observe(b.id()));
            let (order, basis) = compare(stage, &oa, &ob, request.facts.input_tokens);
            let reason = match basis {
                Basis::Reported => PickReason::PowerOfTwoReported,
                Basis::Local => PickReason::PowerOfTwoLocal,
            };
            if order == Ordering::Greater {
                (b, ob, reason)
            } else {
                (a, oa, reason)
            }
        };
        match admit(
            self.admission.as_ref(),
            engine,
            &observation.metrics(),
            request,
        )? {
            None => Ok(Pick::new(Arc::clone(engine), reason)),
            Some(rejection) => Err(PickError::AdmissionRejected { stage, rejection }),
        }
    }
}

impl Policy for PowerOfTwoPolicy {
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

/// Settings of `power_of_two`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PowerOfTwoConfig {
    /// Per-engine caps, checked once on the chosen engine.
    #[serde(default)]
    pub admission: AdmissionLimits,
    /// Fixed seed for reproducible sampling; absent = seeded per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl PolicySettings for PowerOfTwoConfig {
    admission_field!();

    fn build(
        &self,
        admission: Arc<dyn EngineAdmission>,
        handles: &PolicyHandles,
    ) -> Result<Arc<dyn Policy>, PolicyConfigError> {
        let load = Arc::clone(&handles.load);
        Ok(match self.seed {
            Some(seed) => Arc::new(PowerOfTwoPolicy::with_seed(load, admission, seed)),
            None => Arc::new(PowerOfTwoPolicy::new(load, admission)),
        })
    }
}
