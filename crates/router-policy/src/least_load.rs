//! Least-load selection (`load_based`).

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
use crate::walk::{admit, first_admitted, reserve};

/// Most candidates one pick compares: of more, it compares the [`LEAST_LOAD_WINDOW`]
/// consecutive candidates from its rotating start, so a pick costs the same at 1,024
/// candidates as at 32, and successive picks' windows slide over every candidate.
pub const LEAST_LOAD_WINDOW: usize = 32;

/// Chooses the least loaded candidate (of a window of [`LEAST_LOAD_WINDOW`] when
/// there are more).
///
/// Load is the engine's reported running plus waiting requests, corrected by the
/// requests this router dispatched since the report, when every compared candidate
/// has a fresh report; otherwise it is the router-local in-flight count for all of
/// them, so the two scales are never mixed. Ties are broken by a rotating start
/// position, so equal engines share traffic instead of the first one taking it all.
/// A rejected engine is passed over for the next least loaded admissible one of the
/// window, then for the first admissible one after the window.
#[derive(Debug)]
pub struct LeastLoadPolicy {
    load: Arc<EngineReportedLoadTable>,
    admission: Arc<dyn EngineAdmission>,
    rotor: AtomicUsize,
}

impl LeastLoadPolicy {
    /// A policy reading load from `load`.
    pub fn new(load: Arc<EngineReportedLoadTable>, admission: Arc<dyn EngineAdmission>) -> Self {
        Self {
            load,
            admission,
            rotor: AtomicUsize::new(0),
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
        // A dry run reads the rotor without turning it.
        let start = if !request.moves_own_state() {
            self.rotor.load(Ordering::Relaxed)
        } else {
            self.rotor.fetch_add(1, Ordering::Relaxed)
        } % n;
        let rotated = |k: usize| (start + k) % n;
        let window: Vec<usize> = (0..n.min(LEAST_LOAD_WINDOW)).map(rotated).collect();
        let observations: Vec<_> = window
            .iter()
            .map(|&i| snapshot.observe(engines[i].id()))
            .collect();
        let reported: Option<Vec<u64>> = observations
            .iter()
            .map(|o| o.corrected_reported_requests())
            .collect();
        let (scores, reason) = match reported {
            Some(scores) => (scores, PickReason::LeastLoadReported),
            None => (
                observations.iter().map(|o| o.in_flight).collect(),
                PickReason::LeastLoadLocal,
            ),
        };
        let reason = if n == 1 {
            PickReason::SingleCandidate
        } else {
            reason
        };
        let best = (0..window.len())
            .min_by_key(|&k| scores[k])
            .expect("at least one candidate");
        let engine = &engines[window[best]];
        let Some(rejection) = admit(
            self.admission.as_ref(),
            engine,
            &observations[best].metrics(),
            request,
        )?
        else {
            return Ok(Pick::new(Arc::clone(engine), reason));
        };
        let mut order: Vec<usize> = (0..window.len()).filter(|&k| k != best).collect();
        order.sort_by_key(|&k| scores[k]);
        let order = order
            .into_iter()
            .map(|k| window[k])
            .chain((window.len()..n).map(rotated));
        first_admitted(
            engines,
            order,
            &snapshot,
            self.admission.as_ref(),
            request,
            reason,
            vec![rejection],
        )
    }
}

impl Policy for LeastLoadPolicy {
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

/// Settings of `load_based`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadBasedConfig {
    /// Per-engine caps.
    #[serde(default)]
    pub admission: AdmissionLimits,
}

impl PolicySettings for LoadBasedConfig {
    admission_field!();

    fn build(
        &self,
        admission: Arc<dyn EngineAdmission>,
        handles: &PolicyHandles,
    ) -> Result<Arc<dyn Policy>, PolicyConfigError> {
        Ok(Arc::new(LeastLoadPolicy::new(
            Arc::clone(&handles.load),
            admission,
        )))
    }
}
