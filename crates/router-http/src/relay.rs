//! The response body relayed from an engine to the client, frame by frame as it
//! arrives (never buffered whole), holding the in-flight guards of every engine the
//! request was dispatched to until the body ends or the client goes away.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use router_flow::TenantGuard;
use router_state::InflightGuard;
use tokio::time::{Instant, Sleep, sleep};

use crate::app::AppContext;
use crate::decisions::{PendingRecord, Usage};
use crate::metrics::{Compared, ModelLabels, ModelStageLabels, RequestLabels};
use crate::spans::RequestSpan;
use router_upstream::{H1Body, H1Error};

mod tpot;
mod usage;

use tpot::TpotMeter;
use usage::UsageScan;

/// A leg that must run to completion alongside the relayed body (a PD prefill).
pub(crate) type Companion = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A pick's prediction of the prompt tokens its engine finds cached, which the usage
/// the answer reports is compared with.
#[derive(Debug)]
pub(crate) struct Predicted {
    /// The engine predicted about (the pick's own id).
    engine: Arc<str>,
    /// The cached prompt tokens predicted.
    cached_tokens: u64,
}

impl Predicted {
    /// The prediction `pick` made, if its policy made one.
    pub(crate) fn of(pick: &router_policy::Pick) -> Option<Self> {
        pick.predicted_cached_tokens.map(|cached_tokens| Self {
            engine: Arc::clone(pick.engine.id().as_arc_str()),
            cached_tokens,
        })
    }
}

/// Why a relayed body stopped early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RelayError {
    #[error("the engine's response broke off: {0}")]
    Upstream(#[from] H1Error),
    #[error("the engine sent nothing for {0:?}")]
    Idle(Duration),
    #[error("the prefill leg failed: {0}")]
    Companion(String),
}

/// How the request ended, for the request counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Pending,
    Done,
    Failed,
}

/// See the module documentation.
pub(crate) struct RelayBody {
    inner: H1Body,
    companion: Option<Companion>,
    /// Armed when the engine first makes the body wait; most small answers
    /// complete without ever needing it.
    idle: Option<Pin<Box<Sleep>>>,
    idle_timeout: Duration,
    ctx: Arc<AppContext>,
    model: Arc<str>,
    started: Instant,
    first_byte_seen: bool,
    ending: Ending,
    /// The head, or data, was handed to the server since the body last made it wait:
    /// the server may still hold it in its write buffer.
    unflushed: bool,
    /// An error held back until the data before it is flushed.
    held: Option<RelayError>,
    /// The request's decision record, with the answer's status.
    record: Option<(PendingRecord, u16)>,
    /// The request's span, which ends when the body does.
    _span: Option<Arc<RequestSpan>>,
    /// Measures the generating engine's time per output token on a streamed answer.
    tpot: Option<TpotMeter>,
    /// The usage the answer reports.
    usage: UsageScan,
    /// The stage of the engine whose answer's usage is counted; `None` counts none
    /// (a refusal, or a batch, whose answer holds one usage per prompt).
    usage_stage: Option<&'static str>,
    /// The prediction the counted usage is compared with, per engine.
    predicted: Option<Predicted>,
    guards: Vec<InflightGuard>,
    /// The request's count against its tenant's cap, held as long as the guards.
    _tenant: Option<TenantGuard>,
}

impl std::fmt::Debug for RelayBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayBody")
            .field("model", &self.model)
            .field("ending", &self.ending)
            .finish_non_exhaustive()
    }
}

impl RelayBody {
    pub(crate) fn new(
        inner: H1Body,
        companion: Option<Companion>,
        ctx: Arc<AppContext>,
        model: Arc<str>,
        started: Instant,
        guards: Vec<InflightGuard>,
    ) -> Self {
        let idle_timeout = ctx.idle_timeout;
        let mut body = Self {
            inner,
            companion,
            idle: None,
            idle_timeout,
            ctx,
            model,
            started,
            first_byte_seen: false,
            ending: Ending::Pending,
            unflushed: true,
            held: None,
            record: None,
            _span: None,
            tpot: None,
            usage: UsageScan::default(),
            usage_stage: None,
            predicted: None,
            guards,
            _tenant: None,
        };
        if body.is_end_stream() {
            // An empty answer is complete before the server ever polls it.
            body.finish(Ending::Done, "ok");
        }
        body
    }

    /// Holds the request's count against its tenant's cap until the body ends.
    pub(crate) fn with_tenant(mut self, tenant: Option<TenantGuard>) -> Self {
        self._tenant = tenant;
        self
    }

    /// Holds the request's span until the body ends.
    pub(crate) fn with_span(mut self, span: Option<Arc<RequestSpan>>) -> Self {
        self._span = span;
        self
    }

    /// Measures `engine`'s time per output token on this answer, a streamed one,
    /// folding it into the load table's estimate when the answer completes.
    pub(crate) fn with_tpot(mut self, engine: Option<&router_state::Engine>) -> Self {
        self.tpot = engine.map(|e| TpotMeter::new(e.id().clone()));
        self
    }

    /// Counts the prompt and cached tokens the answer reports, under the stage of the
    /// engine that answered, and beside `predicted` under the engine predicted about.
    pub(crate) fn with_usage(
        mut self,
        stage: Option<&'static str>,
        predicted: Option<Predicted>,
    ) -> Self {
        self.usage_stage = stage;
        self.predicted = predicted;
        self
    }

    /// Has the body complete `record`, the decision record of an answer of
    /// `status`, when it ends.
    pub(crate) fn with_record(mut self, record: Option<PendingRecord>, status: u16) -> Self {
        self.record = record.map(|record| (record, status));
        if self.ending != Ending::Pending
            && let Some((record, status)) = self.record.take()
        {
            record.finish(status, "ok", "ok", self.reported());
        }
        self
    }

    fn finish(&mut self, ending: Ending, code: &'static str) {
        if self.ending != Ending::Pending {
            return;
        }
        self.ending = ending;
        let outcome = match ending {
            Ending::Done => "ok",
            Ending::Failed => "server_error",
            Ending::Pending => "cancelled",
        };
        if let Some((record, status)) = self.record.take() {
            record.finish(status, outcome, code, self.reported());
        }
        if ending == Ending::Done {
            self.count_usage();
        }
        if ending == Ending::Done
            && let Some(meter) = self.tpot.take()
            && let Some(per_token) = meter.per_token()
        {
            self.ctx
                .fleet()
                .load()
                .observe_tpot(&meter.engine, per_token);
        }
        let labels = RequestLabels {
            model: Arc::clone(&self.model),
            outcome,
            code,
        };
        self.ctx.metrics.requests.get_or_create(&labels).inc();
    }

    /// The usage the answer reported so far, for its decision record.
    fn reported(&self) -> Usage {
        Usage {
            prompt_tokens: self.usage.prompt_tokens(),
            cached_tokens: self.usage.cached_tokens(),
            completion_tokens: self.usage.completion_tokens(),
        }
    }

    /// Adds the prompt and cached tokens a complete answer reported to their counters,
    /// and to its pick's prediction's engine.
    fn count_usage(&self) {
        let (Some(stage), Some(prompt)) = (self.usage_stage, self.usage.prompt_tokens()) else {
            return;
        };
        // An engine reports no cached tokens on a miss (vLLM leaves the key out).
        let cached = self.usage.cached_tokens().unwrap_or(0).min(prompt);
        let labels = ModelStageLabels {
            model: Arc::clone(&self.model),
            stage,
        };
        let metrics = &self.ctx.metrics;
        metrics
            .reported_cached_tokens
            .get_or_create(&labels)
            .inc_by(cached);
        metrics
            .reported_prompt_tokens
            .get_or_create(&labels)
            .inc_by(prompt);
        if let Some(predicted) = &self.predicted {
            let compared = Compared {
                prompt_tokens: prompt,
                predicted_cached_tokens: predicted.cached_tokens,
                reported_cached_tokens: cached,
            };
            metrics.regret.count(&predicted.engine, compared, || {
                self.ctx.fleet.snapshot().get(&predicted.engine).is_some()
            });
        }
    }

    /// Ends the body with `error`, once the server has flushed the data before it: a
    /// server that meets a body error closes the connection at once and would drop
    /// what it still buffers, so the body first makes it wait (and flush).
    fn fail(
        &mut self,
        cx: &mut Context<'_>,
        error: RelayError,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        if self.unflushed {
            self.unflushed = false;
            self.held = Some(error);
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Some(Err(error)))
    }

    fn poll_inner(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let this = self;
        if let Some(companion) = this.companion.as_mut()
            && let Poll::Ready(result) = companion.as_mut().poll(cx)
        {
            this.companion = None;
            if let Err(e) = result {
                this.finish(Ending::Failed, "prefill_failed");
                return this.fail(cx, RelayError::Companion(e));
            }
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(idle) = this.idle.as_mut() {
                    idle.as_mut().reset(Instant::now() + this.idle_timeout);
                }
                if !this.first_byte_seen && frame.is_data() {
                    this.first_byte_seen = true;
                    let labels = ModelLabels {
                        model: Arc::clone(&this.model),
                    };
                    this.ctx
                        .metrics
                        .time_to_first_token
                        .get_or_create(&labels)
                        .observe(this.started.elapsed().as_secs_f64());
                }
                if let Some(data) = frame.data_ref() {
                    if this.usage_stage.is_some() || this.record.is_some() {
                        this.usage.scan(data);
                    }
                    if let Some((record, _)) = this.record.as_mut() {
                        record.relayed();
                    }
                }
                if let (Some(meter), Some(data)) = (this.tpot.as_mut(), frame.data_ref()) {
                    meter.frame(data, Instant::now());
                }
                if this.is_end_stream() {
                    // A server writing a known length stops polling here.
                    this.finish(Ending::Done, "ok");
                }
                this.unflushed |= frame.is_data();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish(Ending::Failed, "upstream_error");
                this.fail(cx, RelayError::Upstream(e))
            }
            Poll::Ready(None) if this.companion.is_none() => {
                this.finish(Ending::Done, "ok");
                Poll::Ready(None)
            }
            // The decode answer is complete but the prefill leg is still running (or
            // the decode answer has nothing new): wait, within the idle timeout.
            Poll::Ready(None) | Poll::Pending => {
                let timeout = this.idle_timeout;
                let idle = this.idle.get_or_insert_with(|| Box::pin(sleep(timeout)));
                ready!(idle.as_mut().poll(cx));
                this.finish(Ending::Failed, "upstream_timeout");
                Poll::Ready(Some(Err(RelayError::Idle(this.idle_timeout))))
            }
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let this = self.get_mut();
        if let Some(error) = this.held.take() {
            return Poll::Ready(Some(Err(error)));
        }
        let polled = this.poll_inner(cx);
        if polled.is_pending() {
            this.unflushed = false;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.companion.is_none() && self.held.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RelayBody {
    fn drop(&mut self) {
        if self.ending == Ending::Pending && self.held.is_none() && self.inner.is_end_stream() {
            // The whole answer was sent (a server writing a known length drops the body
            // once it has written it): a prefill leg still running goes on to its end,
            // holding its engine's in-flight count, within the idle timeout.
            if let Some(companion) = self.companion.take()
                && let Ok(runtime) = tokio::runtime::Handle::try_current()
            {
                // The prefill engine's guard comes first (`Pair::new`); the decode
                // engine's goes now, its answer being whole.
                let guards: Vec<InflightGuard> = std::mem::take(&mut self.guards)
                    .into_iter()
                    .take(1)
                    .collect();
                let timeout = self.idle_timeout;
                runtime.spawn(async move {
                    match tokio::time::timeout(timeout, companion).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!(error = %e, "a prefill leg failed after its decode answer was sent"),
                        Err(_) => tracing::warn!(?timeout, "a prefill leg sent nothing within the idle timeout after its decode answer was sent"),
                    }
                    drop(guards);
                });
            }
            self.finish(Ending::Done, "ok");
            return;
        }
        // Dropped before the end: the client went away. Dropping `inner` and the
        // companion closes both upstream requests, which is how engines learn of it.
        self.finish(Ending::Pending, "client_disconnected");
    }
}
