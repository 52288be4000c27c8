use std::time::Duration;

use http::HeaderValue;
use router_fleet::{Change, EngineSpec, HealthPolicy};
use router_state::Role;
use router_state::affinity::{AffinityConfig, LocalAffinityStore};
use router_upstream::{Upstream, UpstreamTimeouts};

use super::*;

fn metrics() -> (Metrics, Arc<Fleet>) {
    let upstream = Upstream::new(UpstreamTimeouts {
        connect: Duration::from_secs(1),
        first_byte: Duration::from_secs(1),
        pool_idle: Duration::from_secs(4),
    });
    let fleet = Arc::new(
        Fleet::new(upstream, Arc::default(), HealthPolicy::default())
            .with_feed_memory_bytes(64 << 20),
    );
    let affinity: Arc<dyn AffinityStore> =
        Arc::new(LocalAffinityStore::new(AffinityConfig::default()));
    let routing = Arc::new(Routing::new(
        std::collections::HashMap::new(),
        router_buckets::DefaultPolicies::default(),
        router_policy::PolicyHandles::new(Arc::default()),
    ));
    (
        Metrics::new(&fleet, Some(affinity), &routing, IndexerMetrics::default()),
        fleet,
    )
}

#[tokio::test]
async fn encodes_counters_histograms_and_the_collectors_families() {
    let (metrics, fleet) = metrics();
    // A port nothing listens on: the engine joins with its declared role, unhealthy.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    fleet
        .apply(Change::Add(
            EngineSpec::new("A1", url.as_str(), "m").with_role(Some(Role::Plain)),
        ))
        .await
        .unwrap();
    metrics
        .requests
        .get_or_create(&RequestLabels {
            model: Arc::from("m"),
            outcome: "ok",
            code: "ok",
        })
        .inc();
    metrics
        .upstream_latency
        .get_or_create(&StageLabels { stage: "plain" })
        .observe(0.004);
    let text = metrics.encode(Format::OpenMetrics);
    for expected in [
        "switchyard_requests_total{model=\"m\",outcome=\"ok\",code=\"ok\"} 1",
        "switchyard_upstream_latency_seconds_bucket{le=\"0.004\",stage=\"plain\"} 1",
        "switchyard_engine_in_flight{engine=\"A1\"} 0",
        "switchyard_engine_healthy{engine=\"A1\"} 0",
        "# TYPE switchyard_load_feed_messages counter",
        "switchyard_load_feed_messages_total{outcome=\"applied\"} 0",
        "switchyard_affinity_bindings 0",
        "switchyard_kv_degraded_sources 0",
        "switchyard_feed_memory_bytes 0",
        "switchyard_feed_memory_limit_bytes 67108864",
        "switchyard_feed_memory_refusals_total 0",
    ] {
        assert!(text.contains(expected), "{expected} in:\n{text}");
    }
    assert!(text.ends_with("# EOF\n") && text.matches("# EOF").count() == 1);
    let prometheus = metrics.encode(Format::Prometheus);
    assert!(!prometheus.contains("# EOF"), "{prometheus}");
    assert!(
        prometheus.contains("# TYPE switchyard_load_feed_messages_total counter\n"),
        "{prometheus}"
    );
    assert!(
        prometheus.contains("switchyard_engine_in_flight{engine=\"A1\"} 0"),
        "the samples are the same: {prometheus}"
    );
}

/// A collector that blocks on the runtime, which only a thread that runs none of its
/// tasks may do.
#[derive(Debug)]
struct BlocksOnTheRuntime;

impl prometheus_client::collector::Collector for BlocksOnTheRuntime {
    fn encode(
        &self,
        _: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        // Panics on a thread of the runtime's tasks.
        tokio::runtime::Handle::current().block_on(tokio::task::yield_now());
        Ok(())
    }
}

#[tokio::test]
async fn the_exposition_is_rendered_off_the_serving_threads() {
    let (mut metrics, _fleet) = metrics();
    metrics
        .registry
        .register_collector(Box::new(BlocksOnTheRuntime));
    let text = Arc::new(metrics).render(Format::Prometheus).await;
    assert!(text.contains("switchyard_affinity_bindings 0\n"), "{text}");
}

#[test]
fn openmetrics_is_served_only_to_scrapers_that_ask_for_it() {
    let format = |accept: Option<&str>| {
        Format::negotiate(accept.map(|a| HeaderValue::from_str(a).unwrap()).as_ref())
    };
    assert_eq!(format(None), Format::Prometheus, "no Accept");
    assert_eq!(format(Some("*/*")), Format::Prometheus, "curl");
    assert_eq!(
        format(Some("text/plain;version=0.0.4;q=1,*/*;q=0.1")),
        Format::Prometheus
    );
    assert_eq!(
        format(Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )),
        Format::OpenMetrics,
        "the header Prometheus sends"
    );
    assert_eq!(
        format(Some("Application/OpenMetrics-Text")),
        Format::OpenMetrics
    );
    assert_eq!(
        format(Some("application/openmetrics-text;q=0.2, text/plain;q=0.5")),
        Format::Prometheus,
        "the higher quality wins"
    );
    assert_eq!(
        format(Some("application/openmetrics-text;q=0")),
        Format::Prometheus,
        "q=0 refuses"
    );
    assert_eq!(
        format(Some("application/openmetrics-text;Q=0, text/plain")),
        Format::Prometheus,
        "parameter names are case-insensitive"
    );
    assert_eq!(
        format(Some("*/*, application/openmetrics-text;q=0.1")),
        Format::Prometheus,
        "*/* stands for Prometheus text"
    );
    assert_eq!(
        format(Some("text/*;q=0.2, application/openmetrics-text ; q = 0.5")),
        Format::OpenMetrics
    );
    assert_eq!(
        format(Some("application/openmetrics-text;q=abc")),
        Format::Prometheus,
        "an unreadable quality refuses"
    );
    assert_eq!(
        Format::Prometheus.content_type(),
        "text/plain; version=0.0.4; charset=utf-8"
    );
}

#[test]
fn prometheus_text_names_families_as_the_format_does() {
    let openmetrics = "\
# HELP a_requests Requests.
# TYPE a_requests counter
a_requests_total{x=\"1\"} 2
a_requests_total{x=\"#2\"} 3
a_requests_total{x=\"3\"} 4
# HELP a_size Size.
# TYPE a_size gauge
# UNIT a_size bytes
a_size 3
# HELP a_build Build.
# TYPE a_build info
a_build_info{version=\"1\"} 1
# HELP a_mystery Mystery.
# TYPE a_mystery unknown
a_mystery 4
# HELP a_latency Latency.
# TYPE a_latency histogram
a_latency_sum 0.5
a_latency_count 1
a_latency_bucket{le=\"+Inf\"} 1
# EOF
";
    assert_eq!(
        exposition::to_prometheus_text(openmetrics),
        "\
# HELP a_requests_total Requests.
# TYPE a_requests_total counter
a_requests_total{x=\"1\"} 2
a_requests_total{x=\"#2\"} 3
a_requests_total{x=\"3\"} 4
# HELP a_size Size.
# TYPE a_size gauge
a_size 3
# HELP a_build_info Build.
# TYPE a_build_info gauge
a_build_info{version=\"1\"} 1
# HELP a_mystery Mystery.
# TYPE a_mystery untyped
a_mystery 4
# HELP a_latency Latency.
# TYPE a_latency histogram
a_latency_sum 0.5
a_latency_count 1
a_latency_bucket{le=\"+Inf\"} 1
"
    );
}

#[test]
fn a_forgotten_engines_pick_series_go_and_stay_gone() {
    let (metrics, _fleet) = metrics();
    let pick = |engine: &str, reason: &'static str| PickLabels {
        model: Arc::from("m"),
        bucket: Arc::from("b"),
        stage: "plain",
        engine: Arc::from(engine),
        reason,
    };
    for (engine, reason) in [
        ("A1", "round_robin"),
        ("A1", "least_load"),
        ("B1", "round_robin"),
    ] {
        metrics.picks.count(&pick(engine, reason), || true);
    }
    metrics.picks.count(&pick("A1", "round_robin"), || true);
    let series = |engine: &str| {
        let label = format!("engine=\"{engine}\"");
        let text = metrics.encode(Format::Prometheus);
        text.lines()
            .filter(|l| l.starts_with("switchyard_picks_total") && l.contains(&label))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(series("A1").len(), 2);
    metrics.picks.forget("A1");
    assert!(series("A1").is_empty());
    assert_eq!(series("B1").len(), 1, "other engines keep theirs");
    // A pick that ends after its engine left does not bring the series back.
    metrics.picks.count(&pick("A1", "round_robin"), || false);
    assert!(series("A1").is_empty());
    // An engine that joins again under the id counts from zero.
    metrics.picks.count(&pick("A1", "round_robin"), || true);
    assert_eq!(series("A1").len(), 1);
    assert!(series("A1")[0].ends_with(" 1"), "{:?}", series("A1"));
}
