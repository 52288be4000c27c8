//! Admission within a pick: checking the engine a policy chose ([`admit`], recorded
//! when the request is), and walking candidates in a policy's preference order until
//! admission accepts one ([`first_admitted`]).

use std::sync::Arc;

use router_state::{Engine, EngineMetrics, EngineReportedLoadTable, LoadSnapshot, Reservation};

use crate::admission::{AdmissionDecision, EngineAdmission};
use crate::error::{PickError, Rejection};
use crate::explain::Observation;
use crate::pick::{Pick, PickReason};
use crate::policy::PickRequest;

/// Runs `admission` on a chosen engine: `Ok(None)` admits, `Ok(Some(_))` is a
/// rejection, and a check that cannot run is an invalid signal. A recorded request
/// records the check.
pub(crate) fn admit(
    admission: &dyn EngineAdmission,
    engine: &Engine,
    metrics: &EngineMetrics,
    request: &PickRequest<'_>,
) -> Result<Option<Rejection>, PickError> {
    let exceeded = match admission.check(engine, metrics) {
        Ok(AdmissionDecision::Allow) => None,
        Ok(AdmissionDecision::Reject(exceeded)) => Some(exceeded),
        Err(e) => {
            return Err(PickError::InvalidSignal {
                stage: Some(request.stage),
                message: e.to_string(),
            });
        }
    };
    request.observe(|| Observation::Admission {
        bucket: request.bucket_id.to_owned(),
        stage: request.stage,
        engine: engine.id().clone(),
        metrics: *metrics,
        caps: admission.limits(),
        rejected: exceeded,
    });
    Ok(exceeded.map(|exceeded| Rejection {
        engine: engine.id().clone(),
        exceeded,
    }))
}

/// Checks engines in `order` and returns the first one admission accepts. The first
/// engine of the order is credited with `first_reason`, any later one with
/// [`PickReason::NextAdmitted`]. `rejections` holds engines already turned away; when
/// every engine in the order is rejected too, the pick fails with all of them.
pub(crate) fn first_admitted(
    engines: &[Arc<Engine>],
    order: impl IntoIterator<Item = usize>,
    snapshot: &LoadSnapshot,
    admission: &dyn EngineAdmission,
    request: &PickRequest<'_>,
    first_reason: PickReason,
    mut rejections: Vec<Rejection>,
) -> Result<Pick, PickError> {
    for (position, index) in order.into_iter().enumerate() {
        let engine = &engines[index];
        let metrics = snapshot.observe(engine.id()).metrics();
        match admit(admission, engine, &metrics, request)? {
            None => {
                let reason = if position == 0 && rejections.is_empty() {
                    first_reason
                } else {
                    PickReason::NextAdmitted
                };
                return Ok(Pick::new(Arc::clone(engine), reason));
            }
            Some(rejection) => rejections.push(rejection),
        }
    }
    Err(if rejections.is_empty() {
        PickError::NoCandidates {
            stage: request.stage,
        }
    } else {
        PickError::NoAdmissibleEngine {
            stage: request.stage,
            rejections,
        }
    })
}

/// Reserves `pick`'s engine with `admission` ([`EngineAdmission::reserve`]), for a
/// policy's [`Policy::reserve`](crate::Policy::reserve).
pub(crate) fn reserve(
    load: &EngineReportedLoadTable,
    admission: &dyn EngineAdmission,
    pick: &Pick,
) -> Result<Option<Reservation>, Rejection> {
    admission
        .reserve(&pick.engine, load)
        .map_err(|exceeded| Rejection {
            engine: pick.engine.id().clone(),
            exceeded,
        })
}
