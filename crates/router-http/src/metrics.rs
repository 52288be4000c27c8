//! Prometheus metrics: counters and histograms recorded on the request path, the
//! collectors of the components that own scrape-time state, and the exposition in
//! the format the scraper asked for.

mod affinity;
mod exposition;
mod flow;
mod indexers;
mod prefix_cache;
mod regret;
mod shadow;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use router_fleet::Fleet;
use router_state::affinity::AffinityStore;

use crate::routing::Routing;

pub(crate) use exposition::Format;
pub(crate) use flow::{BandLabels, FlowMetrics, RefusalLabels, TenantLabels, band};
pub(crate) use indexers::{IndexerCounts, IndexerMetrics};
pub(crate) use regret::{Compared, Regret};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub(crate) model: Arc<str>,
    pub(crate) outcome: &'static str,
    pub(crate) code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PickLabels {
    pub(crate) model: Arc<str>,
    pub(crate) bucket: Arc<str>,
    pub(crate) stage: &'static str,
    pub(crate) engine: Arc<str>,
    pub(crate) reason: &'static str,
}

/// Engine picks by model, bucket, stage, engine and reason. An engine's series go
/// when it leaves the fleet ([`Picks::forget`]), so engines that come and go do not
/// grow the exposition.
#[derive(Debug, Clone, Default)]
pub(crate) struct Picks {
    family: Family<PickLabels, Counter>,
    /// Each engine's series, by engine id.
    series: Arc<Mutex<HashMap<Arc<str>, HashSet<PickLabels>>>>,
}

impl Picks {
    /// Counts a pick. A pick of a series not seen yet is counted only while
    /// `registered()` says its engine is in the fleet: a pick that ends after its
    /// engine left does not bring the engine's series back.
    pub(crate) fn count(&self, labels: &PickLabels, registered: impl FnOnce() -> bool) {
        if let Some(counter) = self.family.get(labels) {
            counter.inc();
            return;
        }
        // The engine leaves the registry before it is forgotten, which waits for
        // this lock: a series made here is in `series` when it is forgotten.
        let mut series = self.series.lock();
        if !registered() {
            return;
        }
        self.family.get_or_create(labels).inc();
        series
            .entry(Arc::clone(&labels.engine))
            .or_default()
            .insert(labels.clone());
    }

    /// Drops the series of `engine`, which left the fleet.
    pub(crate) fn forget(&self, engine: &str) {
        let mut series = self.series.lock();
        for labels in series.remove(engine).unwrap_or_default() {
            self.family.remove(&labels);
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BucketLabels {
    pub(crate) model: Arc<str>,
    pub(crate) bucket: Arc<str>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StageLabels {
    pub(crate) stage: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ModelStageLabels {
    pub(crate) model: Arc<str>,
    pub(crate) stage: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub(crate) reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    pub(crate) outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ModelLabels {
    pub(crate) model: Arc<str>,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn selection_histogram() -> Histogram {
    // 1 us to about 0.5 s.
    Histogram::new(exponential_buckets(0.000_001, 2.0, 20))
}

/// Every metric family of the router: those recorded on the request path, and the
/// collectors of the fleet and the affinity store, read at scrape time.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// The length of the last exposition, which the next is about as long as.
    exposition_bytes: AtomicUsize,
    /// Routed requests by model, outcome (`ok`, `client_error`, `server_error`,
    /// `cancelled`) and error code.
    pub(crate) requests: Family<RequestLabels, Counter>,
    /// Engine picks by model, bucket, stage, engine and reason.
    pub(crate) picks: Picks,
    /// Requests routed with a bucket demoted for its latency targets.
    pub(crate) slo_demotions: Family<BucketLabels, Counter>,
    /// The endpoint picker's streams (one a request through a gateway), by how they
    /// ended.
    pub(crate) picker_streams: Family<OutcomeLabels, Counter>,
    /// Time from dispatch to an engine's response head, by stage.
    pub(crate) upstream_latency: Histograms<StageLabels>,
    /// Time from a request's arrival to the first response byte sent to the client.
    pub(crate) time_to_first_token: Histograms<ModelLabels>,
    /// Time the bucket loop took to select a request's engines, by model.
    pub(crate) selection: Histograms<ModelLabels>,
    /// Prompt tokens cache-aware picks expected their engines to find cached.
    pub(crate) predicted_cached_tokens: Family<ModelStageLabels, Counter>,
    /// Prompt tokens of the picks that made such a prediction (the denominator).
    pub(crate) predicted_prompt_tokens: Family<ModelStageLabels, Counter>,
    /// Prompt tokens the engines' answers reported cached, by model and the stage of
    /// the engine that answered.
    pub(crate) reported_cached_tokens: Family<ModelStageLabels, Counter>,
    /// Prompt tokens the same answers reported (the denominator).
    pub(crate) reported_prompt_tokens: Family<ModelStageLabels, Counter>,
    /// Per engine, the cached tokens picks predicted beside those the same answers
    /// reported.
    pub(crate) regret: Regret,
    /// Requests sent again to another engine, by why the engine never started them.
    pub(crate) retries: Family<ReasonLabels, Counter>,
    /// Retries the budget refused (the request failed with its first engine's error).
    pub(crate) retries_refused: Counter,
    /// Flow control: queue waits and refusals, tenants' requests.
    pub(crate) flow: FlowMetrics,
    /// Configuration reloads by outcome (`applied`, `invalid`, `failed`), each
    /// present from startup.
    pub(crate) config_reloads: Family<OutcomeLabels, Counter>,
    /// Decision records by outcome (`written`, `dropped`, `failed`), present when
    /// records are configured.
    pub(crate) decision_records: Family<OutcomeLabels, Counter>,
    /// The router's spans by outcome (`ended`, `exported`, `failed`), present when
    /// traces are configured.
    pub(crate) spans: Family<OutcomeLabels, Counter>,
    /// Lookups of the shared prefix indexers, per indexer (series present when
    /// `prefix_indexer` is configured).
    pub(crate) indexers: IndexerMetrics,
}

impl Metrics {
    /// The request-path families, with the fleet's, the affinity store's and the
    /// tokenizers' prefix caches' collectors beside them, and `indexers`, which the
    /// links to the shared prefix indexers count in.
    pub(crate) fn new(
        fleet: &Arc<Fleet>,
        affinity: Option<Arc<dyn AffinityStore>>,
        routing: &Arc<Routing>,
        indexers: IndexerMetrics,
    ) -> Self {
        let mut metrics = Self::unregistered(indexers);
        metrics.register_routing();
        metrics.register_latency();
        metrics.register_predictions();
        metrics.register_retries();
        metrics.register_operations();
        metrics.register_collectors(fleet, affinity, routing);
        metrics
    }

    /// The request-path families, none of them registered yet; each configuration
    /// reload outcome is present.
    fn unregistered(indexers: IndexerMetrics) -> Self {
        let config_reloads = config_reloads();
        Self {
            registry: Registry::with_prefix("switchyard"),
            exposition_bytes: AtomicUsize::new(0),
            requests: Family::default(),
            picks: Picks::default(),
            slo_demotions: Family::default(),
            picker_streams: Family::default(),
            upstream_latency: Family::new_with_constructor(latency_histogram),
            time_to_first_token: Family::new_with_constructor(latency_histogram),
            selection: Family::new_with_constructor(selection_histogram),
            predicted_cached_tokens: Family::default(),
            predicted_prompt_tokens: Family::default(),
            reported_cached_tokens: Family::default(),
            reported_prompt_tokens: Family::default(),
            regret: Regret::default(),
            retries: Family::default(),
            retries_refused: Counter::default(),
            flow: FlowMetrics::default(),
            config_reloads,
            decision_records: Family::default(),
            spans: Family::default(),
            indexers,
        }
    }

    /// Registers the families of routing decisions: requests, picks and demotions.
    fn register_routing(&mut self) {
        self.registry.register(
            "requests",
            "Routed requests by model, outcome and error code",
            self.requests.clone(),
        );
        self.registry.register(
            "picks",
            "Engine picks by model, bucket, stage, engine and reason",
            self.picks.family.clone(),
        );
        self.registry.register(
            "slo_demotions",
            "Routed requests that tried a fitting bucket last because it was predicted to miss its latency targets, by model and bucket",
            self.slo_demotions.clone(),
        );
        self.registry.register(
            "picker_streams",
            "Requests through a gateway's endpoint picker, by how their stream ended: routed, answered (the router's error), cancelled, timeout, invalid or unauthenticated",
            self.picker_streams.clone(),
        );
    }

    /// Registers the latency histograms: upstream latency, time to first token and
    /// selection time.
    fn register_latency(&mut self) {
        self.registry.register(
            "selection_seconds",
            "Time the bucket loop took to select a request's engines (policy picks, prefix lookups), by model",
            self.selection.clone(),
        );
        self.registry.register(
            "upstream_latency_seconds",
            "Time from dispatch to the engine's response head, by stage",
            self.upstream_latency.clone(),
        );
        self.registry.register(
            "time_to_first_token_seconds",
            "Time from a request's arrival to its first response byte",
            self.time_to_first_token.clone(),
        );
    }

    /// Registers the cache-aware picks' predicted cached tokens, the cached tokens the
    /// engines' answers reported, and the denominator of each; and, per engine, the
    /// two compared on the same answers.
    fn register_predictions(&mut self) {
        self.registry
            .register_collector(Box::new(self.regret.clone()));
        self.registry.register(
            "predicted_cached_tokens",
            "Prompt tokens cache-aware picks expected their engines to find cached, by model and stage",
            self.predicted_cached_tokens.clone(),
        );
        self.registry.register(
            "predicted_prompt_tokens",
            "Prompt tokens of the picks that predicted cached tokens, by model and stage",
            self.predicted_prompt_tokens.clone(),
        );
        self.registry.register(
            "reported_cached_tokens",
            "Prompt tokens the engines' answers reported cached (0 for an answer that reports its prompt tokens but no cached ones), by model and the answering engine's stage",
            self.reported_cached_tokens.clone(),
        );
        self.registry.register(
            "reported_prompt_tokens",
            "Prompt tokens the engines' answers reported, by model and the answering engine's stage",
            self.reported_prompt_tokens.clone(),
        );
    }

    /// Registers the retries and the retries the budget refused.
    fn register_retries(&mut self) {
        self.registry.register(
            "retries",
            "Requests sent again to another engine, by why the engine never started them",
            self.retries.clone(),
        );
        self.registry.register(
            "retries_refused",
            "Retries the router-wide retry budget refused",
            self.retries_refused.clone(),
        );
    }

    /// Registers the operational families: configuration reloads, decision records,
    /// spans and the shared indexers' lookups.
    fn register_operations(&mut self) {
        self.indexers.register(&mut self.registry);
        register_config_reloads(&mut self.registry, &self.config_reloads);
        self.registry.register(
            "decision_records",
            "Decision records: written, dropped (the writer's queue was full) or failed (the file could not be written); of those written, unpaged (replayable, without their pages)",
            self.decision_records.clone(),
        );
        self.registry.register(
            "spans",
            "The router's spans: ended (handed to the exporter's bounded queue), exported, or failed (their export failed); ended minus the others were dropped by the full queue or wait in it",
            self.spans.clone(),
        );
    }

    /// Registers the collectors read at scrape time: the fleet's, the affinity
    /// store's (when there is one), the tokenizers' prefix caches' and the shadow
    /// policies'.
    fn register_collectors(
        &mut self,
        fleet: &Arc<Fleet>,
        affinity: Option<Arc<dyn AffinityStore>>,
        routing: &Arc<Routing>,
    ) {
        router_fleet::register_metrics(fleet, &mut self.registry);
        self.flow.register(&mut self.registry, routing);
        if let Some(store) = affinity {
            self.registry
                .register_collector(Box::new(affinity::AffinityCollector(store)));
        }
        self.registry
            .register_collector(Box::new(prefix_cache::PrefixCacheCollector(Arc::clone(
                routing,
            ))));
        self.registry
            .register_collector(Box::new(shadow::ShadowCollector(Arc::clone(routing))));
    }

    /// The exposition of every family in `format`, written where the last one and an
    /// eighth more fit, so the text is not copied as it grows.
    pub(crate) fn encode(&self, format: Format) -> String {
        let last = self.exposition_bytes.load(Ordering::Relaxed);
        let text = encode_registry(&self.registry, format, last + last / 8);
        self.exposition_bytes.store(text.len(), Ordering::Relaxed);
        text
    }

    /// [`encode`](Self::encode) on the blocking pool: in front of a thousand engines
    /// the exposition takes milliseconds, which the requests of a serving thread
    /// would wait for.
    pub(crate) async fn render(self: &Arc<Self>, format: Format) -> String {
        let metrics = Arc::clone(self);
        match tokio::task::spawn_blocking(move || metrics.encode(format)).await {
            Ok(text) => text,
            Err(failed) => std::panic::resume_unwind(failed.into_panic()),
        }
    }
}

/// The exposition of every family of `registry` in `format`, written to a string of
/// `capacity` bytes to begin with.
pub(crate) fn encode_registry(registry: &Registry, format: Format, capacity: usize) -> String {
    let mut text = String::with_capacity(capacity);
    prometheus_client::encoding::text::encode(&mut text, registry)
        .expect("writing to a String cannot fail");
    match format {
        Format::OpenMetrics => text,
        Format::Prometheus => exposition::to_prometheus_text(&text),
    }
}

/// Configuration reloads by outcome, each outcome present from the start.
pub(crate) fn config_reloads() -> Family<OutcomeLabels, Counter> {
    let reloads: Family<OutcomeLabels, Counter> = Family::default();
    for outcome in ["applied", "invalid", "failed", "unreadable"] {
        drop(reloads.get_or_create(&OutcomeLabels { outcome }));
    }
    reloads
}

/// Registers `reloads` as `config_reloads` (a router's and an indexer's alike).
pub(crate) fn register_config_reloads(
    registry: &mut Registry,
    reloads: &Family<OutcomeLabels, Counter>,
) {
    registry.register(
        "config_reloads",
        "Configuration reloads: applied, invalid (the file was refused; the old configuration serves), failed (the fleet could not serve it; nothing stays changed), unreadable (the file was not read whole: missing, not a regular file, too large or still changing; the old configuration serves)",
        reloads.clone(),
    );
}

#[cfg(test)]
mod tests;
