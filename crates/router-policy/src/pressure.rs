//! Pure comparisons of two engines' stage pressure.

use std::cmp::Ordering;

use router_state::{EngineObservation, ReportedLoad, Role};

/// What a comparison was decided on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Basis {
    /// Both engines had fresh native reports with valid capacity.
    Reported,
    /// At least one did not; router-local in-flight requests decided.
    Local,
}

/// Compares the pressure of `a` and `b` for `stage` and a request of `tokens` prompt
/// tokens; `Less` means `a` is less loaded.
///
/// Plain and prefill compare estimated prefill queue time (when both have it),
/// corrected by the dispatches each report has not seen yet (each taken to be a
/// request like this one), then waiting uncached tokens, waiting requests and running
/// requests. Decode compares
/// waiting requests, running requests, KV usage fraction and KV tokens in use. Ties in
/// reported pressure, and engines lacking a fresh native report with valid capacity,
/// are decided by router-local in-flight requests.
pub(crate) fn compare(
    stage: Role,
    a: &EngineObservation,
    b: &EngineObservation,
    tokens: u64,
) -> (Ordering, Basis) {
    let local = a.in_flight.cmp(&b.in_flight);
    let (Some(ra), Some(rb)) = (native_report(a), native_report(b)) else {
        return (local, Basis::Local);
    };
    let reported = match stage {
        Role::Plain | Role::Prefill => {
            let queue = match (
                a.corrected_prefill_queue_ms(tokens),
                b.corrected_prefill_queue_ms(tokens),
            ) {
                (Some(qa), Some(qb)) => qa.total_cmp(&qb),
                _ => Ordering::Equal,
            };
            queue.then_with(|| compare_prefill(ra, rb))
        }
        Role::Decode => compare_decode(ra, rb),
    };
    (reported.then(local), Basis::Reported)
}

fn native_report(observation: &EngineObservation) -> Option<&ReportedLoad> {
    observation
        .reported
        .as_ref()
        .filter(|r| r.native_with_capacity().is_some())
}

fn compare_prefill(a: &ReportedLoad, b: &ReportedLoad) -> Ordering {
    let (Some(na), Some(nb)) = (a.native, b.native) else {
        return Ordering::Equal;
    };
    na.waiting_uncached_tokens
        .cmp(&nb.waiting_uncached_tokens)
        .then(a.waiting_requests.cmp(&b.waiting_requests))
        .then(a.running_requests.cmp(&b.running_requests))
}

fn compare_decode(a: &ReportedLoad, b: &ReportedLoad) -> Ordering {
    a.waiting_requests
        .cmp(&b.waiting_requests)
        .then(a.running_requests.cmp(&b.running_requests))
        .then(usage_fraction(a, b))
        .then(a.used_kv_tokens.cmp(&b.used_kv_tokens))
}

/// `used_a / max_a` against `used_b / max_b` by cross-multiplication; equal when a
/// capacity is unknown or zero.
fn usage_fraction(a: &ReportedLoad, b: &ReportedLoad) -> Ordering {
    match (a.max_kv_tokens, b.max_kv_tokens) {
        (Some(ma), Some(mb)) if ma > 0 && mb > 0 => (u128::from(a.used_kv_tokens) * u128::from(mb))
            .cmp(&(u128::from(b.used_kv_tokens) * u128::from(ma))),
        _ => Ordering::Equal,
    }
}

#[cfg(test)]
mod tests;
