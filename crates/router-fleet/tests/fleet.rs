//! The fleet against simulated engines over real sockets: engines join and leave
//! through `apply`, observers hear every change, and dispatch failures open breakers.

use std::sync::Arc;
use std::time::Duration;

use engine_sim::{RunningEngine, SimConfig};
use parking_lot::Mutex;
use router_fleet::{
    Change, Dispatched, EngineSpec, Fleet, FleetError, FleetEvent, HealthPolicy, Source,
};
use router_state::{EngineId, NameError, RegistryError, Role};
use router_upstream::{EngineUrlError, Upstream, UpstreamTimeouts};

async fn sim() -> RunningEngine {
    engine_sim::start(SimConfig::for_tests())
        .await
        .expect("the engine starts")
}

/// A fleet whose breaker opens after two failed dispatches, and the events it saw.
fn fleet() -> (Fleet, Arc<Mutex<Vec<String>>>) {
    let upstream = Upstream::new(UpstreamTimeouts {
        connect: Duration::from_secs(2),
        first_byte: Duration::from_secs(5),
        pool_idle: Duration::from_secs(4),
    });
    let health = HealthPolicy {
        breaker_failures: 2,
        ..HealthPolicy::default()
    };
    let fleet = Fleet::new(upstream, Arc::default(), health);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    fleet.on_change(move |event| {
        log.lock().push(match event {
            FleetEvent::Added(e) => format!("added {} {}", e.id(), e.role()),
            FleetEvent::Removed(e) => format!("removed {}", e.id()),
            _ => "other".to_owned(),
        });
    });
    (fleet, seen)
}

#[tokio::test]
async fn an_engine_joins_with_its_introspected_role_and_leaves() {
    let engine = sim().await;
    let (fleet, seen) = fleet();
    let added = fleet
        .apply(Change::Upsert(EngineSpec::new("A1", engine.url(), "m")))
        .await
        .unwrap();
    assert_eq!(
        (added.role(), added.is_healthy()),
        (Role::Plain, true),
        "the role comes from /server_info"
    );
    let snapshot = fleet.snapshot();
    assert!(Arc::ptr_eq(snapshot.get("A1").unwrap(), &added));
    assert_eq!(fleet.load().in_flight(&EngineId::from("A1")), 0);
    let origin = fleet.origin(&added).unwrap();
    assert_eq!(origin.to_string(), engine.url());
    let removed = fleet
        .apply(Change::Remove("A1".into(), Source::Config))
        .await
        .unwrap();
    assert_eq!(removed.id().as_str(), "A1");
    assert!(fleet.snapshot().is_empty());
    assert_eq!(*seen.lock(), ["added A1 plain", "removed A1"]);
    assert_eq!(
        fleet
            .apply(Change::Remove("A1".into(), Source::Config))
            .await
            .unwrap_err(),
        FleetError::Registry(RegistryError::UnknownEngine { id: "A1".into() })
    );
}

#[tokio::test]
async fn an_upsert_of_a_known_id_replaces_the_engine() {
    let (first, second) = (sim().await, sim().await);
    let (fleet, seen) = fleet();
    fleet
        .apply(Change::Upsert(EngineSpec::new("A1", first.url(), "m")))
        .await
        .unwrap();
    let replaced = fleet
        .apply(Change::Upsert(
            EngineSpec::new("A1", second.url(), "m").with_role(Some(Role::Plain)),
        ))
        .await
        .unwrap();
    assert_eq!(replaced.url(), second.url());
    assert_eq!(fleet.snapshot().len(), 1);
    assert_eq!(
        *seen.lock(),
        ["added A1 plain", "removed A1", "added A1 plain"]
    );
}

#[tokio::test]
async fn an_unchanged_upsert_is_a_no_op_and_a_failed_replace_keeps_the_engine() {
    let engine = sim().await;
    let (fleet, seen) = fleet();
    let spec = EngineSpec::new("A1", engine.url(), "m");
    let first = fleet.apply(Change::Upsert(spec.clone())).await.unwrap();
    let _busy = fleet.load().acquire(first.id());
    let again = fleet.apply(Change::Upsert(spec)).await.unwrap();
    assert!(Arc::ptr_eq(&first, &again), "the same engine, untouched");
    assert_eq!(
        fleet.load().in_flight(first.id()),
        1,
        "its in-flight count is kept"
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let failed = fleet
        .apply(Change::Upsert(EngineSpec::new("A1", url.as_str(), "m")))
        .await
        .unwrap_err();
    assert_eq!(failed, FleetError::UnknownRole { reachable: false });
    let kept = fleet.snapshot();
    assert!(
        Arc::ptr_eq(kept.get("A1").unwrap(), &first),
        "nothing changed"
    );
    assert_eq!(fleet.load().in_flight(first.id()), 1);
    assert_eq!(*seen.lock(), ["added A1 plain"]);
}

#[tokio::test]
async fn an_add_of_a_taken_id_is_refused_even_when_two_race() {
    let engine = sim().await;
    let (fleet, seen) = fleet();
    let spec = || EngineSpec::new("A1", engine.url(), "m");
    let (a, b) = tokio::join!(
        fleet.apply(Change::Add(spec())),
        fleet.apply(Change::Add(spec()))
    );
    let duplicate = FleetError::Registry(RegistryError::DuplicateId { id: "A1".into() });
    match (a, b) {
        (Ok(_), Err(e)) | (Err(e), Ok(_)) => assert_eq!(e, duplicate),
        other => panic!("exactly one add wins: {other:?}"),
    }
    assert_eq!(
        fleet.apply(Change::Add(spec())).await.unwrap_err(),
        duplicate,
        "refused before the engine is contacted"
    );
    assert_eq!(*seen.lock(), ["added A1 plain"]);
}

#[tokio::test]
async fn a_source_replaces_and_removes_only_its_own_engines() {
    let (first, second) = (sim().await, sim().await);
    let (fleet, seen) = fleet();
    fleet
        .apply(Change::Upsert(EngineSpec::new("A1", first.url(), "m")))
        .await
        .unwrap();
    let pod = EngineSpec::new("A1", second.url(), "m").with_source(Source::Kubernetes);
    let configured = FleetError::Owned {
        id: "A1".into(),
        owner: Source::Config,
    };
    assert_eq!(
        fleet.apply(Change::Upsert(pod.clone())).await.unwrap_err(),
        configured
    );
    assert_eq!(
        configured.to_string(),
        "engine A1 comes from the configuration file, which alone may replace or remove it"
    );
    for source in [Source::Kubernetes, Source::Admin] {
        let remove = Change::Remove("A1".into(), source);
        assert_eq!(fleet.apply(remove).await.unwrap_err(), configured);
    }
    assert_eq!(fleet.snapshot().get("A1").unwrap().url(), first.url());
    assert_eq!(fleet.spec(&"A1".into()).unwrap().source, Source::Config);
    // Once its source removed it, the id is free for another.
    fleet
        .apply(Change::Remove("A1".into(), Source::Config))
        .await
        .unwrap();
    fleet.apply(Change::Upsert(pod)).await.unwrap();
    assert_eq!(
        fleet
            .apply(Change::Upsert(EngineSpec::new("A1", first.url(), "m")))
            .await
            .unwrap_err(),
        FleetError::Owned {
            id: "A1".into(),
            owner: Source::Kubernetes
        }
    );
    assert_eq!(fleet.snapshot().get("A1").unwrap().url(), second.url());
    assert_eq!(
        *seen.lock(),
        ["added A1 plain", "removed A1", "added A1 plain"]
    );
}

#[tokio::test]
async fn of_two_sources_upserting_one_id_at_once_one_wins() {
    let engine = sim().await;
    let (fleet, seen) = fleet();
    let spec = EngineSpec::new("A1", engine.url(), "m");
    let (a, b) = tokio::join!(
        fleet.apply(Change::Upsert(spec.clone())),
        fleet.apply(Change::Upsert(spec.with_source(Source::Kubernetes)))
    );
    match (a, b) {
        (Ok(won), Err(FleetError::Owned { owner, .. }))
        | (Err(FleetError::Owned { owner, .. }), Ok(won)) => {
            assert_eq!(fleet.spec(won.id()).unwrap().source, owner);
        }
        other => panic!("exactly one source wins: {other:?}"),
    }
    assert_eq!(*seen.lock(), ["added A1 plain"]);
}

#[tokio::test]
async fn changes_that_cannot_apply_change_nothing() {
    let (fleet, seen) = fleet();
    assert_eq!(
        fleet
            .apply(Change::Upsert(EngineSpec::new("A1", "ftp://e:1", "m")))
            .await
            .unwrap_err(),
        FleetError::Url(EngineUrlError::NotHttp)
    );
    assert_eq!(
        fleet
            .apply(Change::Upsert(EngineSpec::new("", "http://e:1", "m")))
            .await
            .unwrap_err(),
        FleetError::Name {
            field: "id",
            error: NameError::Empty
        }
    );
    let forged = fleet
        .apply(Change::Add(EngineSpec::new(
            "E1",
            "http://e:1",
            "m\"} 1\nswitchyard_engine_healthy{engine=\"E1\"} 0",
        )))
        .await
        .unwrap_err();
    assert_eq!(
        forged,
        FleetError::Name {
            field: "model",
            error: NameError::Character('"')
        },
        "a name that would forge metric lines is refused"
    );
    let mut ranks = EngineSpec::new("A2", "http://e:1", "m");
    ranks.dp_size = Some(4_000_000_000);
    assert_eq!(
        fleet
            .apply(Change::Add(ranks))
            .await
            .unwrap_err()
            .to_string(),
        "dp_size 4000000000 is not between 1 and 1024"
    );
    // A port nothing listens on: the engine never answers, and declares no role.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let unreachable = fleet
        .apply(Change::Upsert(EngineSpec::new("A1", url.as_str(), "m")))
        .await
        .unwrap_err();
    assert_eq!(unreachable, FleetError::UnknownRole { reachable: false });
    assert_eq!(
        unreachable.to_string(),
        "the engine is unreachable, so its role is unknown; set `role`"
    );
    let declared = fleet
        .apply(Change::Upsert(
            EngineSpec::new("A1", url.as_str(), "m").with_role(Some(Role::Decode)),
        ))
        .await
        .unwrap();
    assert!(
        !declared.is_healthy(),
        "an unreachable engine with a declared role joins unhealthy"
    );
    assert!(fleet.snapshot().get("A1").is_some());
    assert_eq!(*seen.lock(), ["added A1 decode"]);
}

/// An engine whose `/server_info` says `info`, to every request, until dropped.
async fn engine_saying(info: serde_json::Value) -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let body = info.to_string();
    let server = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = Vec::new();
            let mut buf = [0_u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            drop(socket.write_all(answer.as_bytes()).await);
        }
    });
    (url, server)
}

#[tokio::test]
async fn an_engine_claiming_too_many_ranks_is_refused() {
    let (url, server) =
        engine_saying(serde_json::json!({"disaggregation_mode": "null", "dp_size": 5000})).await;
    let (fleet, seen) = fleet();
    let refused = fleet
        .apply(Change::Add(EngineSpec::new("A1", url.as_str(), "m")))
        .await
        .unwrap_err();
    server.abort();
    assert_eq!(
        refused.to_string(),
        "dp_size 5000 (from /server_info) is not between 1 and 1024"
    );
    assert!(fleet.snapshot().is_empty());
    assert!(seen.lock().is_empty());
}

#[tokio::test]
async fn consecutive_unanswered_dispatches_open_the_breaker_of_at_most_half_a_pool() {
    let engine = sim().await;
    let (fleet, _) = fleet();
    for id in ["A1", "A2"] {
        fleet
            .apply(Change::Upsert(EngineSpec::new(id, engine.url(), "m")))
            .await
            .unwrap();
    }
    let (a1, a2) = (EngineId::from("A1"), EngineId::from("A2"));
    fleet.record_dispatch(&a1, Dispatched::Unanswered);
    assert!(fleet.snapshot().get("A1").unwrap().is_healthy());
    fleet.record_dispatch(&a1, Dispatched::Unanswered);
    assert!(fleet.breaker(&a1).unwrap().is_open());
    assert!(
        !fleet.snapshot().get("A1").unwrap().is_healthy(),
        "an open breaker takes the engine out of candidate sets"
    );
    for _ in 0..4 {
        fleet.record_dispatch(&a2, Dispatched::Unanswered);
    }
    assert!(
        fleet.snapshot().get("A2").unwrap().is_healthy(),
        "the other half of the pool stays in"
    );
    assert_eq!(fleet.breakers_held_closed(), 2);
}

/// What a test engine's `/v1/models` lists, and whether it fails to answer.
#[derive(Default)]
struct Listing {
    adapters: Mutex<Vec<String>>,
    failing: std::sync::atomic::AtomicBool,
}

/// A plain engine whose `/v1/models` lists `listing`'s adapters as they are at
/// each request (a 429 while it is failing), until dropped.
async fn engine_listing(listing: Arc<Listing>) -> (String, tokio::task::JoinHandle<()>) {
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::get;
    async fn models(
        State(listing): State<Arc<Listing>>,
    ) -> Result<axum::Json<serde_json::Value>, StatusCode> {
        if listing.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StatusCode::TOO_MANY_REQUESTS);
        }
        let mut cards = vec![serde_json::json!({"id": "m", "parent": null})];
        cards.extend(
            listing
                .adapters
                .lock()
                .iter()
                .map(|a| serde_json::json!({"id": a, "parent": "m"})),
        );
        Ok(axum::Json(serde_json::json!({"data": cards})))
    }
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/server_info",
            get(|| async { axum::Json(serde_json::json!({"disaggregation_mode": "null"})) }),
        )
        .route("/v1/models", get(models))
        .with_state(listing);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, server)
}

#[tokio::test]
async fn adapters_an_engine_loads_or_unloads_are_seen_at_its_next_probe() {
    let listing = Arc::new(Listing::default());
    *listing.adapters.lock() = vec!["sql".into()];
    let (url, server) = engine_listing(Arc::clone(&listing)).await;
    let (fleet, seen) = fleet();
    fleet
        .apply(Change::Upsert(EngineSpec::new("A1", url.as_str(), "m")))
        .await
        .unwrap();
    let adapters = || -> Vec<String> {
        let snapshot = fleet.snapshot();
        let engine = snapshot.get("A1").unwrap();
        engine.adapters().iter().map(|a| a.to_string()).collect()
    };
    assert_eq!(adapters(), ["sql"]);
    *listing.adapters.lock() = vec!["chat".into(), "summaries".into()];
    fleet.probe_all().await;
    assert_eq!(adapters(), ["chat", "summaries"], "loaded and unloaded");
    // An answer that cannot be read (here a 429: busy, not without adapters) keeps
    // what was known.
    listing
        .failing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    *listing.adapters.lock() = Vec::new();
    fleet.probe_all().await;
    assert_eq!(adapters(), ["chat", "summaries"]);
    // Read on demand too (an engine's 404 for an adapter it listed).
    listing
        .failing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let engine = Arc::clone(fleet.snapshot().get("A1").unwrap());
    fleet.refresh_adapters(&engine).await;
    assert!(adapters().is_empty());
    assert!(fleet.snapshot().get("A1").unwrap().is_healthy());
    assert_eq!(
        *seen.lock(),
        ["added A1 plain"],
        "the same engine throughout"
    );
    server.abort();
}

/// What a test engine says of itself, and whether it answers probes.
struct Saying {
    info: Mutex<serde_json::Value>,
    healthy: std::sync::atomic::AtomicBool,
}

/// An engine serving `saying`'s `/server_info` and `/health` as they are at each
/// request, until dropped.
async fn engine_with(saying: Arc<Saying>) -> (String, tokio::task::JoinHandle<()>) {
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/health",
            get(|State(saying): State<Arc<Saying>>| async move {
                if saying.healthy.load(std::sync::atomic::Ordering::SeqCst) {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                }
            }),
        )
        .route(
            "/server_info",
            get(|State(saying): State<Arc<Saying>>| async move {
                axum::Json(saying.info.lock().clone())
            }),
        )
        .with_state(saying);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, server)
}

#[tokio::test]
async fn what_the_kv_hand_over_needs_is_read_at_joining_and_again_after_a_failed_probe() {
    let saying = Arc::new(Saying {
        info: Mutex::new(serde_json::json!({
            "disaggregation_mode": "decode", "disaggregation_transfer_backend": "nixl",
            "page_size": 16, "tp_size": 4, "pp_size": 1, "kv_cache_dtype": "auto"
        })),
        healthy: true.into(),
    });
    let (url, server) = engine_with(Arc::clone(&saying)).await;
    let (fleet, _) = fleet();
    let added = fleet
        .apply(Change::Upsert(EngineSpec::new("D1", url.as_str(), "m")))
        .await
        .unwrap();
    let expected = router_state::PdProfile {
        transfer_backend: Some("nixl".into()),
        page_size: Some(16),
        kv_cache_dtype: Some("auto".into()),
        attention_tp_size: Some(4),
        pp_size: Some(1),
    };
    assert_eq!(added.pd_profile(), &expected);
    // The engine restarts with another page size: one probe fails, the next passes.
    saying.info.lock()["page_size"] = 32.into();
    saying
        .healthy
        .store(false, std::sync::atomic::Ordering::SeqCst);
    fleet.probe_all().await;
    saying
        .healthy
        .store(true, std::sync::atomic::Ordering::SeqCst);
    fleet.probe_all().await;
    let snapshot = fleet.snapshot();
    assert_eq!(
        snapshot.get("D1").unwrap().pd_profile().page_size,
        Some(32),
        "read again once it answers probes"
    );
    server.abort();
}
