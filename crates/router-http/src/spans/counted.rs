//! Counts of the spans the router hands to the exporter and what became of them:
//! `switchyard_spans_total{outcome}`, `ended` (handed to the bounded queue),
//! `exported` and `failed` (their batch's export failed or timed out); `ended` minus
//! the others is what the full queue dropped, or what waits in it.

use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::metrics::OutcomeLabels;

/// The span counters, by outcome.
pub(crate) type SpanCounts = Family<OutcomeLabels, Counter>;

fn count(counts: &SpanCounts, outcome: &'static str, n: usize) {
    counts
        .get_or_create(&OutcomeLabels { outcome })
        .inc_by(n as u64);
}

/// A processor that counts each span it passes on as `ended`.
#[derive(Debug)]
pub(super) struct Counted<P> {
    pub(super) inner: P,
    pub(super) counts: SpanCounts,
}

impl<P: SpanProcessor> SpanProcessor for Counted<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        count(&self.counts, "ended", 1);
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// An exporter that counts each batch's spans as `exported` or `failed`.
#[derive(Debug)]
pub(super) struct CountedExporter<E> {
    pub(super) inner: E,
    pub(super) counts: SpanCounts,
}

impl<E: SpanExporter> SpanExporter for CountedExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        count(
            &self.counts,
            if result.is_ok() { "exported" } else { "failed" },
            n,
        );
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
