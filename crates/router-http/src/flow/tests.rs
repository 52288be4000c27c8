use std::sync::atomic::{AtomicUsize, Ordering};

use http::{HeaderMap, HeaderValue};
use router_config::FlowConfig;

use super::*;

/// No model's objectives are read from the cluster.
static NOT_FOLLOWED: std::sync::LazyLock<ClusterObjectives> =
    std::sync::LazyLock::new(ClusterObjectives::default);

fn flow(json: serde_json::Value) -> Arc<ModelFlow> {
    let config: FlowConfig = serde_json::from_value(json).unwrap();
    ModelFlow::new(&config).expect("a section that is not the default")
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.insert(*name, HeaderValue::from_str(value).unwrap());
    }
    headers
}

fn full() -> SelectError {
    SelectError::AtCapacity {
        attempts: Vec::new(),
    }
}

#[test]
fn the_default_section_builds_nothing() {
    assert!(ModelFlow::new(&FlowConfig::default()).is_none());
}

#[test]
fn the_header_priority_wins_and_is_forwarded_only_to_a_body_without_one() {
    let flow = flow(
        serde_json::json!({"priority": {"header": "x-priority", "bands": [10, 1], "forward": true}}),
    );
    let class = flow
        .classify(
            &headers(&[("x-priority", "12")]),
            Some(0),
            (&NOT_FOLLOWED, "m"),
        )
        .unwrap();
    assert_eq!((class.band, class.forward_priority), (0, None));
    let class = flow
        .classify(&headers(&[("x-priority", "5")]), None, (&NOT_FOLLOWED, "m"))
        .unwrap();
    assert_eq!((class.band, class.forward_priority), (1, Some(5)));
    let class = flow
        .classify(&HeaderMap::new(), Some(3), (&NOT_FOLLOWED, "m"))
        .unwrap();
    assert_eq!((class.band, class.forward_priority), (1, None));
    assert_eq!(
        flow.classify(&HeaderMap::new(), None, (&NOT_FOLLOWED, "m"))
            .unwrap()
            .band,
        2
    );
    let bad = flow
        .classify(
            &headers(&[("x-priority", "high")]),
            None,
            (&NOT_FOLLOWED, "m"),
        )
        .unwrap_err();
    assert_eq!(
        (bad.status().as_u16(), bad.code()),
        (400, "invalid_priority")
    );
}

#[test]
fn the_clusters_inference_objectives_name_priorities_and_an_unknown_name_is_none() {
    let flow = flow(serde_json::json!({"priority": {
        "header": "x-gateway-inference-objective",
        "bands": [10, 0],
        "objectives": {"pinned": 10},
    }}));
    let cluster = ClusterObjectives::default();
    cluster.replace([(
        "m".to_owned(),
        [
            ("chat".to_owned(), 10),
            ("batch".to_owned(), -10),
            ("pinned".to_owned(), -10),
        ]
        .into_iter()
        .collect(),
    )]);
    let band = |model: &str, objective: &str| {
        flow.classify(
            &headers(&[("x-gateway-inference-objective", objective)]),
            None,
            (&cluster, model),
        )
        .map(|class| class.band)
    };
    assert_eq!(band("m", "chat").unwrap(), 0);
    assert_eq!(band("m", "batch").unwrap(), 2);
    assert_eq!(
        band("m", "pinned").unwrap(),
        0,
        "the configuration's name wins"
    );
    assert_eq!(
        band("m", "unknown-yet").unwrap(),
        1,
        "a name the cluster does not know is no priority"
    );
    assert_eq!(
        band("m", "100").unwrap(),
        1,
        "an integer is a name like any other: no client picks its own priority"
    );
    let other = band("other", "chat").unwrap_err();
    assert_eq!(
        (other.status().as_u16(), other.code()),
        (400, "invalid_priority"),
        "a model not followed knows only its own names and integers"
    );
    // The body's priority orders nothing there: no header, an unknown name or an
    // objective, the band is the header's alone (the body still reaches the engine).
    let with_body = |pairs: &[(&'static str, &str)]| {
        flow.classify(&headers(pairs), Some(1000), (&cluster, "m"))
            .unwrap()
            .band
    };
    assert_eq!(with_body(&[]), 1);
    assert_eq!(
        with_body(&[("x-gateway-inference-objective", "made-up")]),
        1
    );
    assert_eq!(with_body(&[("x-gateway-inference-objective", "batch")]), 2);
    assert_eq!(
        flow.classify(&HeaderMap::new(), Some(1000), (&cluster, "other"))
            .unwrap()
            .band,
        0,
        "a model not followed takes the body's"
    );
    // Followed with no objective yet: every name is no priority.
    cluster.replace([("m".to_owned(), std::collections::BTreeMap::new())]);
    assert_eq!(band("m", "chat").unwrap(), 1);
}

#[test]
fn a_gateways_inference_objective_names_its_priority() {
    let flow = flow(serde_json::json!({"priority": {
        "header": "x-gateway-inference-objective",
        "bands": [10, 0],
        "objectives": {"chat": 10, "batch": -10},
    }}));
    let band = |objective: &str| {
        flow.classify(
            &headers(&[("x-gateway-inference-objective", objective)]),
            None,
            (&NOT_FOLLOWED, "m"),
        )
        .map(|class| class.band)
    };
    assert_eq!(band("chat").unwrap(), 0);
    assert_eq!(band("batch").unwrap(), 2);
    assert_eq!(band("3").unwrap(), 1, "an integer is still a priority");
    assert_eq!(
        flow.classify(&HeaderMap::new(), None, (&NOT_FOLLOWED, "m"))
            .unwrap()
            .band,
        1
    );
    let unknown = band("unlisted").unwrap_err();
    assert_eq!(
        (unknown.status().as_u16(), unknown.code()),
        (400, "invalid_priority")
    );
    assert!(
        unknown.message().contains("flow.priority.objectives"),
        "{unknown:?}"
    );
}

#[test]
fn a_tenant_comes_from_its_header_or_a_digest_of_its_key() {
    let by_header = flow(serde_json::json!({"tenants": {"header": "x-tenant"}}));
    let class = by_header
        .classify(
            &headers(&[("x-tenant", "team-a")]),
            None,
            (&NOT_FOLLOWED, "m"),
        )
        .unwrap();
    assert_eq!(&*class.tenant, "team-a");
    assert_eq!(
        &*by_header
            .classify(&HeaderMap::new(), None, (&NOT_FOLLOWED, "m"))
            .unwrap()
            .tenant,
        ANONYMOUS
    );
    let long = "x".repeat(MAX_TENANT_BYTES + 1);
    for bad in ["a b", "a,b", long.as_str()] {
        let error = by_header
            .classify(&headers(&[("x-tenant", bad)]), None, (&NOT_FOLLOWED, "m"))
            .unwrap_err();
        assert_eq!(error.code(), "invalid_tenant", "{bad:?}");
    }
    let by_key = flow(serde_json::json!({"tenants": {"api_key": true}}));
    let one = by_key
        .classify(
            &headers(&[("authorization", "Bearer sk-1")]),
            None,
            (&NOT_FOLLOWED, "m"),
        )
        .unwrap();
    let again = by_key
        .classify(
            &headers(&[("authorization", "Bearer sk-1")]),
            None,
            (&NOT_FOLLOWED, "m"),
        )
        .unwrap();
    let other = by_key
        .classify(
            &headers(&[("authorization", "Bearer sk-2")]),
            None,
            (&NOT_FOLLOWED, "m"),
        )
        .unwrap();
    assert_eq!(one.tenant, again.tenant);
    assert_ne!(one.tenant, other.tenant);
    assert!(
        one.tenant.starts_with("key-") && one.tenant.len() == 20,
        "{}",
        one.tenant
    );
    assert!(!one.tenant.contains("sk-1"));
}

#[test]
fn metrics_name_only_configured_tenants() {
    let flow = flow(
        serde_json::json!({"tenants": {"header": "x-tenant", "weights": {"a": 2}, "max_inflight": {"b": 1}}}),
    );
    for (tenant, label) in [
        ("a", "a"),
        ("b", "b"),
        (ANONYMOUS, ANONYMOUS),
        ("zed", "other"),
    ] {
        assert_eq!(&*flow.tenant_label(&Arc::from(tenant)), label);
    }
}

#[test]
fn a_tenant_at_its_cap_is_refused_with_429_while_others_pass() {
    let flow =
        flow(serde_json::json!({"tenants": {"header": "x-tenant", "max_inflight": {"a": 1}}}));
    let class = |t: &str| {
        flow.classify(&headers(&[("x-tenant", t)]), None, (&NOT_FOLLOWED, "m"))
            .unwrap()
    };
    let held = flow.hold_tenant(&class("a")).unwrap();
    let refused = flow.hold_tenant(&class("a")).unwrap_err();
    assert_eq!(
        (refused.status().as_u16(), refused.code()),
        (429, "tenant_over_cap")
    );
    assert!(flow.hold_tenant(&class("b")).unwrap().is_some());
    drop(held);
    assert!(flow.hold_tenant(&class("a")).is_ok());
}

#[tokio::test(start_paused = true)]
async fn without_a_queue_a_full_fleet_is_refused_at_once() {
    let flow = flow(serde_json::json!({"tenants": {"header": "x-tenant"}}));
    let class = flow
        .classify(&HeaderMap::new(), None, (&NOT_FOLLOWED, "m"))
        .unwrap();
    let tries = AtomicUsize::new(0);
    let refused = flow
        .select(
            &class,
            || 0,
            || async {
                tries.fetch_add(1, Ordering::SeqCst);
                Err(full())
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(
        refused,
        Refusal::Select(SelectError::AtCapacity { .. })
    ));
    assert_eq!(tries.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_tries_again_on_each_capacity_event_until_its_deadline() {
    let flow = flow(serde_json::json!({"queue": {"max_wait_ms": 1000}}));
    let room = Arc::clone(flow.room().unwrap());
    let class = flow
        .classify(&HeaderMap::new(), None, (&NOT_FOLLOWED, "m"))
        .unwrap();
    let tries = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn({
        let (flow, tries) = (Arc::clone(&flow), Arc::clone(&tries));
        async move {
            flow.select(
                &class,
                || 0,
                || {
                    tries.fetch_add(1, Ordering::SeqCst);
                    async { Err::<Selection, _>(full()) }
                },
            )
            .await
        }
    });
    while tries.load(Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        room.depth().iter().sum::<usize>(),
        1,
        "it waits in the queue"
    );
    room.capacity_freed();
    while tries.load(Ordering::SeqCst) < 3 {
        tokio::task::yield_now().await;
    }
    let Err(Refusal::Timeout { waited, .. }) = task.await.unwrap() else {
        panic!("the deadline passes");
    };
    assert_eq!(waited, Duration::from_millis(1000));
    assert_eq!(
        tries.load(Ordering::SeqCst),
        3,
        "one at once, one on entering, one per event"
    );
    assert!(room.is_empty(), "a request past its deadline leaves");
}

// A prefill/decode attempt that reserves the prefill engine and then finds no decode
// slot drops its reservation undispatched: that must not count as capacity freed, or
// every failed attempt would start the next one at once, forever.
#[tokio::test(start_paused = true)]
async fn an_attempt_that_drops_its_own_reservation_does_not_wake_the_queue() {
    let flow = flow(serde_json::json!({"queue": {"max_wait_ms": 1000}}));
    let room = Arc::clone(flow.room().unwrap());
    let table = Arc::new(router_state::EngineReportedLoadTable::default());
    table.on_capacity(Some(Box::new({
        let room = Arc::clone(&room);
        move || room.capacity_freed()
    })));
    let prefill = router_state::EngineId::new("P");
    let class = flow
        .classify(&HeaderMap::new(), None, (&NOT_FOLLOWED, "m"))
        .unwrap();
    let tries = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn({
        let (flow, tries, table) = (Arc::clone(&flow), Arc::clone(&tries), Arc::clone(&table));
        async move {
            flow.select(
                &class,
                || 0,
                || {
                    let n = tries.fetch_add(1, Ordering::SeqCst);
                    assert!(n < 50, "failed attempts wake the queue again and again");
                    drop(
                        table
                            .try_reserve(&prefill, 8)
                            .expect("the prefill engine is free"),
                    );
                    async { Err::<Selection, _>(full()) }
                },
            )
            .await
        }
    });
    let Err(Refusal::Timeout { .. }) = task.await.unwrap() else {
        panic!("the deadline passes");
    };
    assert_eq!(
        tries.load(Ordering::SeqCst),
        2,
        "one at once, one on entering, none after"
    );
    table.on_capacity(None);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once() {
    let flow = flow(serde_json::json!({"queue": {"max_wait_ms": 1000, "max_queued": 1}}));
    let class = flow
        .classify(&HeaderMap::new(), None, (&NOT_FOLLOWED, "m"))
        .unwrap();
    let waiting = tokio::spawn({
        let (flow, class) = (Arc::clone(&flow), class.clone());
        async move {
            flow.select(&class, || 0, || async { Err::<Selection, _>(full()) })
                .await
        }
    });
    while flow.room().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    let tries = AtomicUsize::new(0);
    let refused = flow
        .select(
            &class,
            || 0,
            || async {
                tries.fetch_add(1, Ordering::SeqCst);
                Err::<Selection, _>(full())
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(refused, Refusal::Full { .. }), "{refused:?}");
    assert_eq!(
        tries.load(Ordering::SeqCst),
        0,
        "others wait: it does not try first"
    );
    waiting.abort();
}

#[tokio::test(start_paused = true)]
async fn a_failure_other_than_capacity_is_not_waited_out() {
    let flow = flow(serde_json::json!({"queue": {"max_wait_ms": 1000}}));
    let class = flow
        .classify(&HeaderMap::new(), None, (&NOT_FOLLOWED, "m"))
        .unwrap();
    let tries = AtomicUsize::new(0);
    let started = tokio::time::Instant::now();
    let refused = flow
        .select(
            &class,
            || 0,
            || {
                let first = tries.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    Err::<Selection, _>(if first {
                        full()
                    } else {
                        SelectError::Unavailable {
                            stage: router_state::Role::Plain,
                            attempts: Vec::new(),
                        }
                    })
                }
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(refused, Refusal::Select(SelectError::Unavailable { .. })),
        "{refused:?}"
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(flow.room().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_explanation_says_where_the_request_would_wait_and_why() {
    let flow = flow(serde_json::json!({
        "queue": {"max_wait_ms": 1000, "max_queued": 1},
        "tenants": {"header": "x-tenant", "max_inflight": {"a": 1}},
    }));
    let class = |t: &str| {
        flow.classify(&headers(&[("x-tenant", t)]), None, (&NOT_FOLLOWED, "m"))
            .unwrap()
    };
    let explained = |t: &str, selected: Result<Selection, SelectError>| {
        let answer = flow.explain(&class(t), &selected);
        answer["outcome"].as_str().unwrap().to_owned() + ": " + answer["why"].as_str().unwrap()
    };
    assert!(explained("b", Err(full())).starts_with("queued: every fitting bucket"));
    let held = flow.hold_tenant(&class("a")).unwrap();
    assert!(explained("a", Err(full())).starts_with("refused: the tenant"));
    drop(held);
    let waiting = tokio::spawn({
        let (flow, class) = (Arc::clone(&flow), class("b"));
        async move {
            flow.select(&class, || 0, || async { Err::<Selection, _>(full()) })
                .await
        }
    });
    while flow.room().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    let answer = flow.explain(&class("b"), &Err(full()));
    assert_eq!(answer["outcome"], "refused", "{answer}");
    assert_eq!(
        answer["queue_depth"],
        serde_json::json!([1]),
        "one band: no boundaries configured"
    );
    waiting.abort();
}
