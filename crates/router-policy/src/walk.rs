//! Walking candidates in a policy's preference order until admission accepts one.

use std::sync::Arc;

use router_state::{Engine, LoadSnapshot};

use crate::admission::{EngineAdmission, admit};
use crate::error::{PickError, Rejection};
use crate::policy::{Pick, PickReason, PickRequest};

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
