//! The fleet's metric families, read from its state at scrape time: per-engine
//! gauges, the feed counters and the prefix indexes' size.

use std::borrow::Borrow;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use router_state::kv_events::{KvFeedStats, PrefixIndex};
use router_state::{Engine, FeedMemory, LoadSnapshot, RegistrySnapshot};

use crate::fleet::Fleet;

/// Registers the fleet's metric families with `registry`.
pub fn register_metrics(fleet: &Arc<Fleet>, registry: &mut Registry) {
    registry.register_collector(Box::new(FleetCollector(Arc::clone(fleet))));
}

#[derive(Debug)]
struct FleetCollector(Arc<Fleet>);

/// One family of samples, each with one label. Label values are engine ids, model
/// names (both checked by [`router_state::check_name`]: nothing to escape) and
/// fixed words, borrowed where they are kept.
fn family<M: EncodeMetric, V: Borrow<str>>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    samples: impl IntoIterator<Item = (V, M)>,
) -> Result<(), std::fmt::Error> {
    let mut samples = samples.into_iter().peekable();
    let Some((_, first)) = samples.peek() else {
        return Ok(());
    };
    let kind: MetricType = first.metric_type();
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (value, sample) in samples {
        sample.encode(metric.encode_family(&[(label, value.borrow())])?)?;
    }
    Ok(())
}

impl Collector for FleetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let fleet = &self.0;
        let snapshot = fleet.snapshot();
        let load = fleet.load().snapshot();
        let engines: Vec<_> = snapshot.engines().collect();
        engine_families(&mut encoder, fleet, &engines, &load)?;
        engine_timing_families(&mut encoder, &engines, &load)?;
        load_feed_family(&mut encoder, fleet)?;
        feed_memory_families(&mut encoder, fleet.feed_memory())?;
        kv_feed_families(&mut encoder, fleet.kv_stats())?;
        let indexes = fleet.prefix_indexes();
        kv_feed_age_family(&mut encoder, &snapshot, &indexes)?;
        prefix_index_families(&mut encoder, &indexes)
    }
}

/// The engine id as a label value.
fn id(engine: &Engine) -> &str {
    engine.id().as_str()
}

/// Encodes each engine's in-flight requests, health and breaker state.
fn engine_families(
    encoder: &mut DescriptorEncoder,
    fleet: &Fleet,
    engines: &[&Arc<Engine>],
    load: &LoadSnapshot,
) -> Result<(), std::fmt::Error> {
    family(
        encoder,
        "engine_in_flight",
        "Requests this router has in flight per engine",
        "engine",
        engines.iter().map(|e| {
            let in_flight = load.observe(e.id()).in_flight;
            (
                id(e),
                ConstGauge::new(i64::try_from(in_flight).unwrap_or(i64::MAX)),
            )
        }),
    )?;
    if !engines.is_empty() {
        let mut info = encoder.encode_descriptor(
            "engine_info",
            "Always 1: an engine's model and role, to join the engine families on `engine` (every engine of a model down, say)",
            None,
            MetricType::Gauge,
        )?;
        for engine in engines {
            let labels = [
                ("engine", engine.id().as_str()),
                ("model", engine.model()),
                ("role", engine.role().as_str()),
            ];
            ConstGauge::new(1i64).encode(info.encode_family(&labels)?)?;
        }
    }
    family(
        encoder,
        "engine_healthy",
        "Whether an engine is routable (probes pass, breaker closed)",
        "engine",
        engines
            .iter()
            .map(|e| (id(e), ConstGauge::new(i64::from(e.is_healthy())))),
    )?;
    family(
        encoder,
        "engine_breaker_open",
        "Whether an engine's circuit breaker holds dispatches back (open, or half-open with its trial running)",
        "engine",
        engines.iter().filter_map(|e| {
            let open = fleet.breaker(e.id())?.is_open();
            Some((id(e), ConstGauge::new(i64::from(open))))
        }),
    )?;
    let held = ConstCounter::new(fleet.breakers_held_closed());
    held.encode(encoder.encode_descriptor(
        "breakers_held_closed",
        "Breakers kept closed because opening them would have held out more than health.max_ejected_percent of a pool",
        None,
        held.metric_type(),
    )?)
}

/// Encodes each engine's measured time per output token and load-report age.
fn engine_timing_families(
    encoder: &mut DescriptorEncoder,
    engines: &[&Arc<Engine>],
    load: &LoadSnapshot,
) -> Result<(), std::fmt::Error> {
    family(
        encoder,
        "engine_tpot_seconds",
        "Time per output token this router measured on the engine's streamed answers (a moving average; absent when none in the last 10 s; kept for models with a time-per-token target)",
        "engine",
        engines.iter().filter_map(|e| {
            let tpot = load.tpot(e.id())?;
            Some((id(e), ConstGauge::new(tpot.as_secs_f64())))
        }),
    )?;
    family(
        encoder,
        "engine_load_report_age_seconds",
        "Age of an engine's freshest complete load report (absent when none is fresh)",
        "engine",
        engines.iter().filter_map(|e| {
            let reported = load.observe(e.id()).reported?;
            let age = load
                .captured_at()
                .saturating_duration_since(reported.received_at);
            Some((id(e), ConstGauge::new(age.as_secs_f64())))
        }),
    )
}

/// Encodes the load-feed messages by outcome.
fn load_feed_family(encoder: &mut DescriptorEncoder, fleet: &Fleet) -> Result<(), std::fmt::Error> {
    family(
        encoder,
        "load_feed_messages",
        "Load-feed messages by outcome since start",
        "outcome",
        fleet
            .feed_stats()
            .counts()
            .into_iter()
            .map(|(outcome, n)| (outcome, ConstCounter::new(n))),
    )
}

/// Encodes what the feeds hold of their shared memory budget, its size, and the
/// frames and batches it refused.
fn feed_memory_families(
    encoder: &mut DescriptorEncoder,
    memory: &FeedMemory,
) -> Result<(), std::fmt::Error> {
    let gauge = |bytes: usize| ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX));
    let in_use = gauge(memory.in_use());
    in_use.encode(encoder.encode_descriptor(
        "feed_memory_bytes",
        "Bytes the engine feeds hold of limits.zmq_memory_bytes: messages still arriving, KV-event batches kept while a gap is repaired",
        None,
        in_use.metric_type(),
    )?)?;
    let limit = gauge(memory.limit());
    limit.encode(encoder.encode_descriptor(
        "feed_memory_limit_bytes",
        "limits.zmq_memory_bytes: what the engine feeds may hold together",
        None,
        limit.metric_type(),
    )?)?;
    let refused = ConstCounter::new(memory.refused());
    refused.encode(encoder.encode_descriptor(
        "feed_memory_refusals",
        "Feed frames (their connection closed) and KV-event batches (their gap not repaired) refused because the feeds' memory budget was spent",
        None,
        refused.metric_type(),
    )?)
}

/// Encodes the KV-event subscribers' events, what they dropped and the ranks whose
/// history is being repaired.
fn kv_feed_families(
    encoder: &mut DescriptorEncoder,
    kv: &KvFeedStats,
) -> Result<(), std::fmt::Error> {
    let (events, degraded) = kv_events(kv);
    family(
        encoder,
        "kv_feed_events",
        "KV-event subscriber events: batches applied, gaps, catch-ups, replays, replay failures, restarts, clears, disconnects",
        "event",
        events,
    )?;
    family(
        encoder,
        "kv_events_dropped",
        "KV events and batches not applied, by reason",
        "reason",
        kv.dropped()
            .into_iter()
            .map(|(reason, n)| (reason, ConstCounter::new(n))),
    )?;
    let gauge = ConstGauge::new(i64::try_from(degraded).unwrap_or(i64::MAX));
    gauge.encode(encoder.encode_descriptor(
        "kv_degraded_sources",
        "Engine ranks whose KV history is being repaired (their matches are ignored)",
        None,
        gauge.metric_type(),
    )?)
}

/// The KV-event subscribers' event counters by event, and apart from them the
/// number of degraded sources.
fn kv_events(kv: &KvFeedStats) -> (Vec<(&'static str, ConstCounter)>, u64) {
    let mut events = vec![("applied", ConstCounter::new(kv.applied()))];
    let mut degraded = 0;
    for (name, value) in kv.counters() {
        if name == "degraded_sources" {
            degraded = value;
        } else {
            events.push((name, ConstCounter::new(value)));
        }
    }
    (events, degraded)
}

/// Encodes how far behind each registered engine's KV-event feed was.
fn kv_feed_age_family(
    encoder: &mut DescriptorEncoder,
    snapshot: &RegistrySnapshot,
    indexes: &[(String, Arc<PrefixIndex>)],
) -> Result<(), std::fmt::Error> {
    family(
        encoder,
        "engine_kv_feed_age_seconds",
        "How far behind the engine's KV-event feed was when its latest live batch arrived (its most lagging rank's)",
        "engine",
        // Engines of the registry only: a subscriber stopped mid-batch as its
        // engine left can leave a source behind in the index.
        indexes.iter().flat_map(|(_, index)| {
            index
                .feed_ages()
                .into_iter()
                .filter(|(engine, _)| snapshot.get(engine.as_str()).is_some())
                .map(|(engine, age)| (engine, ConstGauge::new(age.as_secs_f64())))
        }),
    )
}

/// Encodes each model's prefix index size and evictions.
fn prefix_index_families(
    encoder: &mut DescriptorEncoder,
    indexes: &[(String, Arc<PrefixIndex>)],
) -> Result<(), std::fmt::Error> {
    let sizes: Vec<_> = indexes
        .iter()
        .map(|(model, index)| (model, index.size()))
        .collect();
    let count = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
    family(
        encoder,
        "prefix_index_nodes",
        "Blocks in the model's prefix index",
        "model",
        sizes
            .iter()
            .map(|(model, size)| (model.as_str(), count(size.nodes))),
    )?;
    family(
        encoder,
        "prefix_index_entries",
        "(block, engine) ownership entries in the model's prefix index",
        "model",
        sizes
            .iter()
            .map(|(model, size)| (model.as_str(), count(size.entries))),
    )?;
    family(
        encoder,
        "prefix_index_bytes",
        "Estimated memory of the model's prefix index",
        "model",
        sizes
            .iter()
            .map(|(model, size)| (model.as_str(), count(size.bytes))),
    )?;
    family(
        encoder,
        "prefix_index_evicted",
        "Blocks evicted from the model's prefix index to stay within its node budget",
        "model",
        indexes
            .iter()
            .map(|(model, index)| (model.as_str(), ConstCounter::new(index.evicted()))),
    )
}
