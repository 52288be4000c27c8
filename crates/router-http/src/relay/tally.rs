//! What an answer is counted for as it passes the router, whoever carries it: its
//! first byte (time to first token), the usage it reports (and the regret beside the
//! pick's prediction), the generating engine's time per output token, the request
//! counter and the decision record when it ends, and the in-flight guards and tenant
//! count it holds until then. The proxy's relayed body and the endpoint picker's
//! follow of a gateway's stream both end a request through one.

use std::sync::Arc;

use bytes::Bytes;
use router_flow::TenantGuard;
use router_state::InflightGuard;
use tokio::time::Instant;

use super::Predicted;
use super::tpot::TpotMeter;
use super::usage::UsageScan;
use crate::app::AppContext;
use crate::decisions::{PendingRecord, Usage};
use crate::metrics::{Compared, ModelLabels, ModelStageLabels, RequestLabels};
use crate::spans::RequestSpan;

/// How a request ended, for the request counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Not yet.
    Pending,
    Done,
    Failed,
    /// The client went away before the end.
    Cancelled,
}

/// See the module documentation.
pub(crate) struct Tally {
    ctx: Arc<AppContext>,
    model: Arc<str>,
    started: Instant,
    first_byte_seen: bool,
    ending: Ending,
    /// The request's decision record, with the answer's status.
    record: Option<(PendingRecord, u16)>,
    /// The request's span, which ends when the answer does.
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

impl std::fmt::Debug for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tally")
            .field("model", &self.model)
            .field("ending", &self.ending)
            .finish_non_exhaustive()
    }
}

impl Tally {
    /// An answer of `model`'s request, which arrived at `started`, holding `guards`.
    pub(crate) fn new(
        ctx: Arc<AppContext>,
        model: Arc<str>,
        started: Instant,
        guards: Vec<InflightGuard>,
    ) -> Self {
        Self {
            ctx,
            model,
            started,
            first_byte_seen: false,
            ending: Ending::Pending,
            record: None,
            _span: None,
            tpot: None,
            usage: UsageScan::default(),
            usage_stage: None,
            predicted: None,
            guards,
            _tenant: None,
        }
    }

    /// Holds the request's count against its tenant's cap until the answer ends.
    pub(crate) fn with_tenant(mut self, tenant: Option<TenantGuard>) -> Self {
        self._tenant = tenant;
        self
    }

    /// Holds the request's span until the answer ends.
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

    /// Has the answer complete `record`, the decision record of an answer of
    /// `status`, when it ends (at once if it has).
    pub(crate) fn with_record(mut self, record: Option<PendingRecord>, status: u16) -> Self {
        self.answered(record, status);
        self
    }

    /// The answer's head has come, of `status`: `record` is completed when the answer
    /// ends (at once if it has), and an answer that is not a success counts no usage
    /// and no time per token.
    pub(crate) fn answered(&mut self, record: Option<PendingRecord>, status: u16) {
        if !(200..300).contains(&status) {
            self.usage_stage = None;
            self.tpot = None;
        }
        self.record = record.map(|record| (record, status));
        if self.ending != Ending::Pending
            && let Some((record, status)) = self.record.take()
        {
            record.finish(status, "ok", "ok", self.reported());
        }
    }

    /// Whether the answer has ended.
    pub(crate) fn ended(&self) -> bool {
        self.ending != Ending::Pending
    }

    /// Counts a frame of the answer's body as it passes.
    pub(crate) fn data(&mut self, data: &Bytes) {
        if !self.first_byte_seen {
            self.first_byte_seen = true;
            let labels = ModelLabels {
                model: Arc::clone(&self.model),
            };
            self.ctx
                .metrics
                .time_to_first_token
                .get_or_create(&labels)
                .observe(self.started.elapsed().as_secs_f64());
        }
        if self.usage_stage.is_some() || self.record.is_some() {
            self.usage.scan(data);
        }
        if let Some((record, _)) = self.record.as_mut() {
            record.relayed();
        }
        if let Some(meter) = self.tpot.as_mut() {
            meter.frame(data, Instant::now());
        }
    }

    /// The in-flight guards, taken from the answer (which still ends as it ends).
    pub(crate) fn take_guards(&mut self) -> Vec<InflightGuard> {
        std::mem::take(&mut self.guards)
    }

    /// Ends the answer so, counted under `code`; only the first ending counts.
    pub(crate) fn finish(&mut self, ending: Ending, code: &'static str) {
        if self.ending != Ending::Pending {
            return;
        }
        self.ending = ending;
        let outcome = match ending {
            Ending::Done => "ok",
            Ending::Failed => "server_error",
            Ending::Cancelled | Ending::Pending => "cancelled",
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
}

impl Drop for Tally {
    fn drop(&mut self) {
        // Dropped before the end: the client went away.
        self.finish(Ending::Cancelled, "client_disconnected");
    }
}
