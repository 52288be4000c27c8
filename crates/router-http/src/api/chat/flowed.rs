//! The bucket loop under the model's flow control: the request's class, its
//! tenant's cap, and the queue it waits in when every fitting bucket is full.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use router_buckets::{SelectError, Selection};
use router_flow::TenantGuard;
use router_policy::{Explanation, RequestFacts};
use serde_json::{Value, json};

use super::{Ready, select};
use crate::app::AppContext;
use crate::error::ApiError;
use crate::flow::{Class, ModelFlow, Refusal};
use crate::metrics::{BandLabels, RefusalLabels, TenantLabels, band};
use crate::trace::Tracing;

/// A request's selection under flow control.
pub(super) struct Flowed {
    /// The selection, or the bucket loop's failure.
    pub(super) selected: Result<Selection, SelectError>,
    /// Why flow control refused the request, when it did (the answer is then its
    /// error, not the bucket loop's).
    pub(super) refused: Option<Refusal>,
    /// How long the request waited in the queue, when it did.
    pub(super) waited: Option<Duration>,
    /// The request's class, when its model has flow control.
    pub(super) class: Option<Class>,
    /// The request's count against its tenant's cap.
    pub(super) tenant: Option<TenantGuard>,
}

impl Flowed {
    /// What a decision record says of the request's flow control, if it had any.
    pub(super) fn record(&self) -> Option<Value> {
        let class = self.class.as_ref()?;
        Some(json!({
            "band": class.band,
            "tenant": &*class.tenant,
            "waited_ms": self.waited.map(|w| w.as_secs_f64() * 1e3),
            "refused": self.refused.as_ref().map(|r| if r.timed_out() { "timeout" } else { "full" }),
        }))
    }

    /// The error the request is answered with.
    pub(super) fn error(
        refused: Option<Refusal>,
        error: SelectError,
        load: &router_state::LoadSnapshot,
    ) -> ApiError {
        match refused {
            Some(refusal) => ApiError::of_refusal(refusal, load),
            None => ApiError::of_selection(error, load),
        }
    }
}

/// Runs the bucket loop for `request` on `ready`'s route, under its model's flow
/// control when it has any. A recorded request's explanation holds the last
/// selection made.
///
/// # Errors
/// 400 for a malformed priority or tenant header, 429 for a tenant at its cap.
pub(super) async fn flowed(
    ctx: &AppContext,
    ready: &Ready<'_>,
    request: &RequestFacts<'_>,
    headers: &HeaderMap,
    tracing: &Tracing,
    recording: Option<&Explanation>,
) -> Result<Flowed, ApiError> {
    let route = &ready.route;
    let Some(flow) = route.flow.as_deref() else {
        return Ok(Flowed {
            selected: select(ctx, route, request, tracing).await,
            refused: None,
            waited: None,
            class: None,
            tenant: None,
        });
    };
    let class = flow.classify(
        headers,
        ready.prepared.priority,
        (&ctx.objectives, &route.id),
    )?;
    let tenant = admit_tenant(ctx, flow, &route.id, &class)?;
    let again = || {
        if let Some(explanation) = recording {
            explanation.clear();
        }
        select(ctx, route, request, tracing)
    };
    let kind = || crate::flow::kind(&route.resolver, request);
    let outcome = flow.select(&class, kind, again).await;
    let labels = BandLabels {
        model: Arc::clone(&route.id),
        band: band(class.band),
    };
    let (selected, refused, waited) = match outcome {
        Ok(admitted) => {
            if let Some(waited) = admitted.waited {
                ctx.metrics
                    .flow
                    .waits
                    .get_or_create(&labels)
                    .observe(waited.as_secs_f64());
            }
            (Ok(admitted.selection), None, admitted.waited)
        }
        Err(Refusal::Select(error)) => (Err(error), None, None),
        Err(refusal) => {
            let reason = if refusal.timed_out() {
                "timeout"
            } else {
                "full"
            };
            tracing::warn!(model = %route.id, band = class.band, reason, "the model's queue refused a request");
            let labels = RefusalLabels {
                model: labels.model,
                band: labels.band,
                reason,
            };
            ctx.metrics.flow.refusals.get_or_create(&labels).inc();
            (Err(refusal.select_error().clone()), Some(refusal), None)
        }
    };
    Ok(Flowed {
        selected,
        refused,
        waited,
        class: Some(class),
        tenant,
    })
}

/// Counts the request against its tenant's cap, and counts it admitted or refused.
fn admit_tenant(
    ctx: &AppContext,
    flow: &ModelFlow,
    model: &Arc<str>,
    class: &Class,
) -> Result<Option<TenantGuard>, ApiError> {
    if flow.config().tenants.is_none() {
        return Ok(None);
    }
    let held = flow.hold_tenant(class);
    let labels = TenantLabels {
        model: Arc::clone(model),
        tenant: flow.tenant_label(&class.tenant),
        outcome: if held.is_ok() { "admitted" } else { "refused" },
    };
    ctx.metrics.flow.tenants.get_or_create(&labels).inc();
    if held.is_err() {
        tracing::info!(model = %model, tenant = %labels.tenant, "a tenant at its in-flight cap was refused");
    }
    held
}
