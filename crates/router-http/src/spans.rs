//! The router's own spans, exported over OTLP/HTTP when `traces` is configured.
//!
//! A routed request gets a server span (`switchyard.request`), the child of the
//! client's `traceparent` when it sent a valid one, and lasting until its answer's
//! last byte, recorded for a share of requests ([`sampler`]); under it `prepare` (validating the body and tokenizing the prompt),
//! `select` (the bucket loop, with a `bucket_attempt` span under it per bucket tried,
//! timed by the bucket loop) and one
//! `dispatch` span per request sent to an engine, from sending to the engine's
//! response head. An engine is sent a `traceparent` naming its `dispatch` span, so its
//! spans join the trace under the router's. Without `traces` none of this exists:
//! requests carry `None` and the client's context is passed on unchanged
//! (`trace.rs`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::HeaderValue;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};

use router_buckets::{SelectError, Selection};

use crate::trace::TraceContext;
use router_config::TracesConfig;

mod counted;
mod sampler;

pub(crate) use counted::SpanCounts;
use counted::{Counted, CountedExporter};
use sampler::RequestSampler;

/// The exporter and the tracer every request's spans come from.
#[derive(Debug)]
pub(crate) struct Spans {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// How long a shutdown waits for the last export.
    export_timeout: Duration,
}

impl Spans {
    /// Starts the exporter's thread. Builds a blocking HTTP client: call it off the
    /// async runtime's threads.
    ///
    /// # Errors
    /// The exporter could not be built from `config`.
    pub(crate) fn start(config: &TracesConfig, counts: SpanCounts) -> Result<Self, String> {
        let exporter = SpanExporter::builder()
            .with_http()
            .with_endpoint(config.otlp_endpoint.as_str())
            .with_timeout(Duration::from_millis(config.export_timeout_ms))
            .build()
            .map_err(|e| e.to_string())?;
        let exporter = CountedExporter {
            inner: exporter,
            counts: counts.clone(),
        };
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(config.queue)
                    .with_max_export_batch_size(config.queue.min(512))
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Counted {
                inner: processor,
                counts,
            })
            .with_sampler(RequestSampler::new(
                config.sample_ratio,
                config.honor_client_sampling,
            ))
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("switchyard");
        Ok(Self {
            provider,
            tracer,
            export_timeout: Duration::from_millis(config.export_timeout_ms),
        })
    }

    /// Starts the server span of a request to `endpoint`, the child of `client`'s
    /// context when there is one.
    pub(crate) fn request(
        &self,
        endpoint: &'static str,
        client: Option<&TraceContext>,
    ) -> Arc<RequestSpan> {
        let parent = client.and_then(remote_context).unwrap_or_default();
        let span = self
            .tracer
            .span_builder("switchyard.request")
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new("http.route", endpoint)])
            .start_with_context(&self.tracer, &parent);
        Arc::new(RequestSpan {
            cx: parent.with_span(span),
            tracer: self.tracer.clone(),
        })
    }

    /// Exports what is queued and stops the exporter's thread (blocking, for at most
    /// the export timeout and a second).
    pub(crate) fn shutdown(&self) {
        let wait = self.export_timeout + Duration::from_secs(1);
        if let Err(e) = self.provider.shutdown_with_timeout(wait) {
            tracing::warn!("stopping the span exporter: {e}");
        }
    }
}

/// The client's `traceparent` as a remote parent.
fn remote_context(client: &TraceContext) -> Option<Context> {
    let (trace, parent, flags) = client.ids()?;
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(parent).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    Some(Context::new().with_remote_span_context(context))
}

/// One request's server span; it ends when the last holder (the relayed answer's
/// body, at its end) lets go.
#[derive(Debug)]
pub(crate) struct RequestSpan {
    cx: Context,
    tracer: SdkTracer,
}

impl RequestSpan {
    /// A child span of the request, started now and ended when dropped.
    pub(crate) fn child(&self, name: &'static str, attributes: Vec<KeyValue>) -> ChildSpan {
        let started = SystemTime::now();
        let span = self
            .tracer
            .span_builder(name)
            .with_start_time(started)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.cx);
        ChildSpan {
            cx: self.cx.with_span(span),
            tracer: self.tracer.clone(),
            started,
        }
    }

    /// Sets an attribute of the request's span.
    pub(crate) fn set(&self, attribute: KeyValue) {
        self.cx.span().set_attribute(attribute);
    }

    /// Marks the request's span failed with `message`.
    pub(crate) fn fail(&self, message: String) {
        self.cx.span().set_status(Status::error(message));
    }
}

impl Drop for RequestSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// A span under a request's, ended when dropped.
#[derive(Debug)]
pub(crate) struct ChildSpan {
    cx: Context,
    tracer: SdkTracer,
    started: SystemTime,
}

impl ChildSpan {
    /// Records a finished span under this one, from `start` to `end`.
    fn finished_child(
        &self,
        name: &'static str,
        attributes: Vec<KeyValue>,
        start: SystemTime,
        end: SystemTime,
    ) {
        let mut child = self
            .tracer
            .span_builder(name)
            .with_start_time(start)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.cx);
        child.end_with_timestamp(end);
    }

    /// Marks the span failed with `message`.
    pub(crate) fn fail(&self, message: String) {
        self.cx.span().set_status(Status::error(message));
    }

    /// The `traceparent` naming this span, for the engine it calls.
    pub(crate) fn traceparent(&self) -> Option<HeaderValue> {
        let context = self.cx.span().span_context().clone();
        context.is_valid().then(|| {
            let value = format!(
                "00-{}-{}-{:02x}",
                context.trace_id(),
                context.span_id(),
                context.trace_flags().to_u8()
            );
            HeaderValue::from_str(&value).expect("hex digits and dashes")
        })
    }
}

impl Drop for ChildSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// Records each bucket `selected` tried as a `bucket_attempt` span under `span` (the
/// selection's), one after the other from its start, each as long as its picks took:
/// its id and why it gave no pick, or the engines it picked.
pub(crate) fn record_attempts(span: &ChildSpan, selected: &Result<Selection, SelectError>) {
    let attempts = match selected {
        Ok(selection) => &selection.passed_over,
        Err(error) => error.attempts(),
    };
    let mut at = span.started;
    for attempt in attempts {
        let end = at + attempt.took.unwrap_or_default();
        span.finished_child(
            "bucket_attempt",
            vec![
                KeyValue::new("switchyard.bucket", attempt.bucket.to_string()),
                KeyValue::new("switchyard.outcome", attempt.error.code()),
            ],
            at,
            end,
        );
        at = end;
    }
    match selected {
        Ok(selection) => {
            let engines: Vec<String> = selection
                .pick
                .engines
                .iter()
                .map(|p| format!("{} ({})", p.engine.id(), p.reason.as_str()))
                .collect();
            span.finished_child(
                "bucket_attempt",
                vec![
                    KeyValue::new("switchyard.bucket", selection.pick.bucket.to_string()),
                    KeyValue::new("switchyard.outcome", "picked"),
                    KeyValue::new("switchyard.engines", engines.join(", ")),
                ],
                at,
                at + selection.took.unwrap_or_default(),
            );
        }
        Err(error) => span.fail(error.to_string()),
    }
}
