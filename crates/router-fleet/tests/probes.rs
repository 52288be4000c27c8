//! Health probes of a large fleet: spread over the interval, a bounded number out at
//! once, against one local engine standing in for many (each engine id its own
//! member, all at one URL).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use router_fleet::{Change, EngineSpec, Fleet, HealthPolicy, MIN_PROBES_AT_ONCE};
use router_upstream::{Upstream, UpstreamTimeouts};
use tokio::time::Instant;

/// What the engine saw of its probes.
#[derive(Default)]
struct Probes {
    arrivals: Mutex<Vec<Instant>>,
    out: AtomicUsize,
    most_out: AtomicUsize,
    /// Told of each arrival.
    arrived: tokio::sync::Notify,
}

/// A plain engine that answers each probe after `hold`, recording it, until dropped.
async fn engine(probes: Arc<Probes>, hold: Duration) -> (String, tokio::task::JoinHandle<()>) {
    use axum::routing::get;
    let health = move || {
        let probes = Arc::clone(&probes);
        async move {
            probes.arrivals.lock().push(Instant::now());
            probes.arrived.notify_waiters();
            let out = probes.out.fetch_add(1, Ordering::SeqCst) + 1;
            probes.most_out.fetch_max(out, Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            probes.out.fetch_sub(1, Ordering::SeqCst);
            "ok"
        }
    };
    let app = axum::Router::new()
        .route("/health", get(health))
        .route(
            "/server_info",
            get(|| async { axum::Json(serde_json::json!({"disaggregation_mode": "null"})) }),
        )
        .route(
            "/v1/models",
            get(|| async { axum::Json(serde_json::json!({"data": [{"id": "m"}]})) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, server)
}

/// A fleet of `n` engines at `url`.
async fn fleet(n: usize, url: &str) -> Fleet {
    let upstream = Upstream::new(UpstreamTimeouts {
        connect: Duration::from_secs(5),
        first_byte: Duration::from_secs(20),
        pool_idle: Duration::from_secs(4),
    });
    let fleet = Fleet::new(upstream, Arc::default(), HealthPolicy::default());
    for i in 0..n {
        fleet
            .apply(Change::Upsert(EngineSpec::new(
                format!("E{i:03}"),
                url,
                "m",
            )))
            .await
            .unwrap();
    }
    fleet
}

// Eight engines probed over 400 ms: the k-th probe arrives no sooner than k * 50 ms
// after the round starts (all at once, every one would arrive at its start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_of_probes_is_spread_over_its_interval() {
    let probes = Arc::new(Probes::default());
    let (url, server) = engine(Arc::clone(&probes), Duration::ZERO).await;
    let fleet = fleet(8, &url).await;
    probes.arrivals.lock().clear();
    let start = Instant::now();
    fleet.probe_spread(Duration::from_millis(400)).await;
    let mut arrivals = probes.arrivals.lock().clone();
    arrivals.sort();
    assert_eq!(arrivals.len(), 8, "every engine probed once");
    for (k, at) in arrivals.iter().enumerate() {
        let offset = Duration::from_millis(50) * u32::try_from(k).unwrap();
        assert!(
            *at >= start + offset,
            "probe {k} arrived {:?} after the start, before its {offset:?}",
            at.duration_since(start)
        );
    }
    server.abort();
}

// Forty engines that each hold their probe: no more than the bound are out at once,
// and every engine is still probed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_the_bound_of_probes_is_out_at_once() {
    let probes = Arc::new(Probes::default());
    let (url, server) = engine(Arc::clone(&probes), Duration::from_millis(200)).await;
    let fleet = fleet(MIN_PROBES_AT_ONCE + 8, &url).await;
    probes.arrivals.lock().clear();
    probes.most_out.store(0, Ordering::SeqCst);
    fleet.probe_all().await;
    assert_eq!(probes.arrivals.lock().len(), MIN_PROBES_AT_ONCE + 8);
    let most = probes.most_out.load(Ordering::SeqCst);
    assert!(
        (1..=MIN_PROBES_AT_ONCE).contains(&most),
        "{most} probes out at once"
    );
    server.abort();
}

// Twice the floor of engines gone dark (first in id order) and eight that answer, in
// a round spread over 100 ms with a probe timeout of a minute: the dark engines'
// probes, each holding its place for the whole timeout, must not hold back the
// others'. With the places fixed at the floor, the eight would wait a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_that_never_answer_do_not_hold_back_the_probes_of_the_others() {
    let (dark_probes, healthy_probes) = (Arc::new(Probes::default()), Arc::new(Probes::default()));
    // An hour: past the probe timeout, so a dark engine's probe never passes.
    let (dark_url, dark_server) = engine(Arc::clone(&dark_probes), Duration::from_secs(3600)).await;
    let (url, server) = engine(Arc::clone(&healthy_probes), Duration::ZERO).await;
    let upstream = Upstream::new(UpstreamTimeouts {
        connect: Duration::from_secs(60),
        first_byte: Duration::from_secs(60),
        pool_idle: Duration::from_secs(60),
    });
    let policy = HealthPolicy {
        probe_timeout: Duration::from_secs(60),
        ..HealthPolicy::default()
    };
    let fleet = Arc::new(Fleet::new(upstream, Arc::default(), policy));
    let dark = 2 * MIN_PROBES_AT_ONCE;
    let members = (0..dark)
        .map(|i| (format!("D{i:03}"), &dark_url))
        .chain((0..8).map(|i| (format!("E{i:03}"), &url)));
    for (id, url) in members {
        fleet
            .apply(Change::Upsert(EngineSpec::new(id, url, "m")))
            .await
            .unwrap();
    }
    healthy_probes.arrivals.lock().clear();
    let round = tokio::spawn({
        let fleet = Arc::clone(&fleet);
        async move { fleet.probe_spread(Duration::from_millis(100)).await }
    });
    let healthy_probed = async {
        loop {
            let arrival = healthy_probes.arrived.notified();
            if healthy_probes.arrivals.lock().len() == 8 {
                break;
            }
            arrival.await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), healthy_probed)
        .await
        .expect("the answering engines are probed while the dark ones' probes are out");
    round.abort();
    server.abort();
    dark_server.abort();
}

#[test]
fn a_spread_round_lets_out_what_its_timeouts_need() {
    let second = Duration::from_secs(1);
    assert_eq!(
        router_fleet::probes_at_once(8, second, second),
        8,
        "one an engine at most"
    );
    assert_eq!(
        router_fleet::probes_at_once(1_000, second / 100, second),
        MIN_PROBES_AT_ONCE
    );
    // A thousand engines over one second, each probe allowed two: 2,001 would be
    // started within a timeout, so every engine may be out at once.
    assert_eq!(
        router_fleet::probes_at_once(1_000, 2 * second, second),
        1_000
    );
    assert_eq!(
        router_fleet::probes_at_once(1_000, second / 10, second),
        101
    );
    assert_eq!(
        router_fleet::probes_at_once(1_000, second, Duration::ZERO),
        MIN_PROBES_AT_ONCE
    );
    assert_eq!(router_fleet::probes_at_once(0, second, second), 1);
}
