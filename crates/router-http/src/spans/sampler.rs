//! Which requests' spans are recorded. A request's server span is sampled as a share
//! of requests (`traces.sample_ratio`, counted, [`Share`]), also when it continues a
//! client's trace: the client's `traceparent` names the trace and the parent, but its
//! sampled flag decides only with `traces.honor_client_sampling` (otherwise a client
//! could make the router export every span it makes, whatever the ratio; a
//! trace-id-ratio sampler would not stop it either, as the client picks the trace
//! id). Spans under a request's follow its decision.

use std::sync::Arc;

use opentelemetry::trace::{
    Link, SamplingDecision, SamplingResult, SpanKind, TraceContextExt, TraceId, TraceState,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::ShouldSample;

use crate::share::Share;

/// See the module documentation.
#[derive(Debug, Clone)]
pub(crate) struct RequestSampler {
    share: Arc<Share>,
    honor_client: bool,
}

impl RequestSampler {
    /// Samples `ratio` of the requests; a client's sampled flag decides instead for
    /// the requests continuing its trace when `honor_client`.
    pub(crate) fn new(ratio: f64, honor_client: bool) -> Self {
        Self {
            share: Arc::new(Share::new(ratio)),
            honor_client,
        }
    }

    fn decide(&self, parent: Option<&opentelemetry::trace::SpanContext>) -> SamplingDecision {
        let follows_parent = parent.filter(|p| !p.is_remote() || self.honor_client);
        let sampled = match follows_parent {
            Some(parent) => parent.is_sampled(),
            None => self.share.take(),
        };
        if sampled {
            SamplingDecision::RecordAndSample
        } else {
            SamplingDecision::Drop
        }
    }
}

impl ShouldSample for RequestSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        _trace_id: TraceId,
        _name: &str,
        _span_kind: &SpanKind,
        _attributes: &[KeyValue],
        _links: &[Link],
    ) -> SamplingResult {
        let parent = parent_context
            .filter(|cx| cx.has_active_span())
            .map(|cx| cx.span().span_context().clone());
        SamplingResult {
            decision: self.decide(parent.as_ref()),
            attributes: Vec::new(),
            trace_state: parent.map_or_else(TraceState::default, |p| p.trace_state().clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags};

    use super::*;

    /// A parent span's context: a client's (`remote`) or the router's own.
    fn parent(sampled: bool, remote: bool) -> Context {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        // A trace id a trace-id-ratio sampler takes at any ratio.
        let trace = TraceId::from_hex("4bf92f3577b34da60000000000000000").unwrap();
        let span = SpanContext::new(trace, SpanId::from(7), flags, remote, TraceState::default());
        Context::new().with_remote_span_context(span)
    }

    /// How many of `n` spans under `parent` are sampled.
    fn sampled(sampler: &RequestSampler, parent: Option<&Context>, n: usize) -> usize {
        (0..n)
            .filter(|_| {
                let result = sampler.should_sample(
                    parent,
                    TraceId::from(1),
                    "switchyard.request",
                    &SpanKind::Server,
                    &[],
                    &[],
                );
                result.decision == SamplingDecision::RecordAndSample
            })
            .count()
    }

    #[test]
    fn a_clients_sampled_flag_decides_only_when_honored() {
        let client = parent(true, true);
        let ratio = RequestSampler::new(0.25, false);
        assert_eq!(sampled(&ratio, Some(&client), 8), 2, "the ratio decides");
        assert_eq!(sampled(&ratio, None, 8), 2, "as for a new trace");
        let unsampled = parent(false, true);
        assert_eq!(sampled(&ratio, Some(&unsampled), 8), 2);
        let honoring = RequestSampler::new(0.25, true);
        assert_eq!(sampled(&honoring, Some(&client), 8), 8);
        assert_eq!(sampled(&honoring, Some(&unsampled), 8), 0);
        assert_eq!(sampled(&honoring, None, 8), 2);
    }

    #[test]
    fn spans_under_a_request_follow_its_decision() {
        let sampler = RequestSampler::new(0.25, false);
        assert_eq!(sampled(&sampler, Some(&parent(true, false)), 8), 8);
        assert_eq!(sampled(&sampler, Some(&parent(false, false)), 8), 0);
        assert_eq!(
            sampled(&sampler, None, 4),
            1,
            "no request's share was taken"
        );
    }
}
