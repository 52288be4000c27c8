//! What a policy sees of one engine's load at the moment it picks.

use tokio::time::Instant;

/// An engine's aggregated report: every expected rank reported within the freshness
/// window, and counts are summed across ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReportedLoad {
    /// Running requests.
    pub running_requests: u64,
    /// Requests waiting in the engine's queue.
    pub waiting_requests: u64,
    /// KV-cache tokens in use.
    pub used_kv_tokens: u64,
    /// KV-cache capacity in tokens, when every rank reports one.
    pub max_kv_tokens: Option<u64>,
    /// Native fields, when every rank sends the native extension.
    pub native: Option<NativeAggregate>,
    /// Receipt time of the oldest rank report in this aggregate.
    pub received_at: Instant,
}

/// The native extension summed across ranks, with derived prefill speed and queue time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NativeAggregate {
    /// Prompt tokens waiting for prefill that the prefix cache does not cover.
    pub waiting_uncached_tokens: u64,
    /// KV tokens in use plus the tokens of queued requests.
    pub total_tokens: u64,
    /// Running-request limit.
    pub max_running_requests: u64,
    /// Uncached prompt tokens prefilled per second, from the counters of consecutive
    /// reports; `None` unless every rank has a measurement.
    pub prefill_tokens_per_sec: Option<f64>,
    /// Estimated time to prefill the waiting uncached tokens, in milliseconds.
    pub prefill_queue_ms: Option<f64>,
}

impl ReportedLoad {
    /// The native fields when the report also carries a valid capacity (known KV
    /// capacity and running limit), the precondition for comparing reported pressure.
    pub fn native_with_capacity(&self) -> Option<&NativeAggregate> {
        self.native
            .as_ref()
            .filter(|n| self.max_kv_tokens.is_some() && n.max_running_requests > 0)
    }
}

/// One engine's load as captured by a [`LoadSnapshot`](super::LoadSnapshot).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineObservation {
    /// The engine's aggregated report; `None` when missing, stale or rank-incomplete.
    pub reported: Option<ReportedLoad>,
    /// Requests this router has in flight to the engine. Always known.
    pub in_flight: u64,
    /// Requests this router dispatched to the engine after the report was captured,
    /// which the report cannot reflect yet. Zero without a report.
    pub dispatched_since_report: u64,
}

impl EngineObservation {
    /// The observation of an engine the table has never seen.
    pub const UNKNOWN: EngineObservation = EngineObservation {
        reported: None,
        in_flight: 0,
        dispatched_since_report: 0,
    };

    /// The dispatches the report has not seen yet that may still be on the engine: at
    /// most the requests this router has in flight to it, since one that has ended
    /// is on the engine no more.
    pub fn unseen_dispatches(&self) -> u64 {
        self.dispatched_since_report.min(self.in_flight)
    }

    /// The metrics admission checks read. The reported request counts are corrected
    /// by the [unseen dispatches](Self::unseen_dispatches), each counted as running
    /// and as waiting (it is one or the other by the next report), so a cap on them
    /// holds between reports as well as an observation can, and an engine whose
    /// reports stop while it idles is not held at its caps by requests long ended.
    pub fn metrics(&self) -> EngineMetrics {
        let reported = self.reported.as_ref();
        let unseen = self.unseen_dispatches();
        EngineMetrics {
            running_requests: reported.map(|r| r.running_requests.saturating_add(unseen)),
            waiting_requests: reported.map(|r| r.waiting_requests.saturating_add(unseen)),
            kv_tokens: reported.map(|r| r.native.map_or(r.used_kv_tokens, |n| n.total_tokens)),
            pending_prefill_tokens: reported
                .and_then(|r| r.native)
                .map(|n| n.waiting_uncached_tokens),
            inflight_requests: self.in_flight,
        }
    }

    /// The reported prefill queue time, corrected by the
    /// [unseen dispatches](Self::unseen_dispatches), each taken to bring `tokens_per_dispatch` uncached tokens at the
    /// measured prefill speed; `None` without a fresh native estimate.
    pub fn corrected_prefill_queue_ms(&self, tokens_per_dispatch: u64) -> Option<f64> {
        let native = self.reported?.native?;
        let queue = native.prefill_queue_ms?;
        let unseen = match native.prefill_tokens_per_sec {
            Some(speed) if speed > 0.0 => {
                self.unseen_dispatches() as f64 * tokens_per_dispatch as f64 * 1000.0 / speed
            }
            _ => 0.0,
        };
        Some(queue + unseen)
    }

    /// Reported running plus waiting requests, corrected by the
    /// [unseen dispatches](Self::unseen_dispatches); `None` without a fresh report.
    pub fn corrected_reported_requests(&self) -> Option<u64> {
        self.reported.map(|r| {
            r.running_requests
                .saturating_add(r.waiting_requests)
                .saturating_add(self.unseen_dispatches())
        })
    }
}

/// Per-engine metrics that admission caps compare against.
///
/// Reported metrics are `None` without a fresh, complete report, never zero; a cap on
/// an unknown metric admits. The router-local in-flight count is always known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineMetrics {
    /// Reported running requests, plus the dispatches since the report.
    pub running_requests: Option<u64>,
    /// Reported waiting requests, plus the dispatches since the report.
    pub waiting_requests: Option<u64>,
    /// Reported total KV tokens: the native `num_total_tokens` (in use plus queued),
    /// or the KV tokens in use for a basic report.
    pub kv_tokens: Option<u64>,
    /// Reported waiting uncached prompt tokens (native reports only).
    pub pending_prefill_tokens: Option<u64>,
    /// Router-local in-flight requests.
    pub inflight_requests: u64,
}
