//! Naive reference models: what a pick must satisfy, written as plainly as possible
//! and independently of the policies' code, for property tests to check against.

use std::sync::Arc;

use router_state::{Engine, EngineMetrics};

use super::Scenario;
use crate::{AdmissionLimits, Pick, PickError};

/// Whether `limits` admit an engine that shows `metrics`: every cap that is set is
/// above what the engine shows (a metric the engine does not report never rejects).
pub fn admits(limits: &AdmissionLimits, metrics: &EngineMetrics) -> bool {
    let below = |cap: Option<u64>, observed: Option<u64>| match (cap, observed) {
        (Some(cap), Some(observed)) => observed < cap,
        _ => true,
    };
    below(limits.max_running_requests, metrics.running_requests)
        && below(limits.max_waiting_requests, metrics.waiting_requests)
        && below(limits.max_kv_tokens, metrics.kv_tokens)
        && below(
            limits.max_pending_prefill_tokens,
            metrics.pending_prefill_tokens,
        )
        && below(
            limits.max_inflight_requests,
            Some(metrics.inflight_requests),
        )
}

/// Checks one pick's outcome over `scenario`'s engines under `limits`: a pick is one
/// of the candidates and admitted; an `exhaustive` policy (one that tries every
/// candidate) fails only when no candidate is admitted, with `no_admissible_engine`;
/// a policy that is not may instead stop at a rejected choice, which must name an
/// engine `limits` reject.
///
/// # Errors
/// What the outcome breaks, in words.
pub fn check_pick(
    scenario: &Scenario,
    limits: &AdmissionLimits,
    outcome: &Result<Pick, PickError>,
    exhaustive: bool,
) -> Result<(), String> {
    let admitted = |engine: &Engine| admits(limits, &scenario.metrics(engine));
    match outcome {
        Ok(pick) => {
            if !scenario
                .engines
                .iter()
                .any(|c| Arc::ptr_eq(c, &pick.engine))
            {
                return Err(format!("{} is not a candidate", pick.engine.id()));
            }
            if !admitted(&pick.engine) {
                return Err(format!("{} is not admitted", pick.engine.id()));
            }
            Ok(())
        }
        Err(PickError::AdmissionRejected { rejection, .. }) if !exhaustive => {
            match scenario
                .engines
                .iter()
                .find(|e| *e.id() == rejection.engine)
            {
                Some(engine) if !admitted(engine) => Ok(()),
                Some(engine) => Err(format!("{} was rejected but is admitted", engine.id())),
                None => Err(format!(
                    "{} was rejected but is no candidate",
                    rejection.engine
                )),
            }
        }
        Err(error) => match scenario.engines.iter().find(|e| admitted(e)) {
            Some(engine) => Err(format!(
                "failed ({}) although {} is admitted",
                error.code(),
                engine.id()
            )),
            None if exhaustive && error.code() != "no_admissible_engine" => Err(format!(
                "failed with {} where no candidate is admitted, not no_admissible_engine",
                error.code()
            )),
            None => Ok(()),
        },
    }
}
