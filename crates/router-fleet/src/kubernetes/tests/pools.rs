//! Pods named by an InferencePool the fake API server serves.

use super::*;

/// Discovery of pool `qwen3-pool`'s pods as model `m`'s, and no selector.
pub(super) fn pool_settings(url: &str, relist: Duration) -> KubernetesSettings {
    KubernetesSettings {
        selectors: Vec::new(),
        pools: vec![InferencePoolRef {
            model: "m".into(),
            name: "qwen3-pool".into(),
        }],
        ..settings(url, relist)
    }
}

/// An InferencePool's spec: pods with `labels`, engines on `port`.
fn pool_spec(labels: &Value, port: u64) -> Value {
    json!({
        "selector": {"matchLabels": labels},
        "targetPorts": [{"number": port}],
        "endpointPickerRef": {"name": "switchyard", "port": {"number": 9002}, "failureMode": "FailClose"},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_pods_are_plain_engines_at_its_target_port() {
    let (api, url, server) = fake_api().await;
    let a = json!({"app": "sglang", "pool": "a"});
    api.put_pool("qwen3-pool", pool_spec(&a, 7), false);
    api.put_pool(
        "another-pool",
        pool_spec(&json!({"app": "sglang"}), 9),
        false,
    );
    api.put_in("p0", "127.0.0.1", &a);
    api.put_in("p1", "127.0.0.2", &json!({"app": "sglang", "pool": "b"}));
    api.put("p2", "127.0.0.3", true, false, false);
    let fleet = fleet();
    let (changed, _discovery) =
        discover_with(&fleet, pool_settings(&url, Duration::from_secs(3600)));
    until(&fleet, &changed, &["llm/p0@http://127.0.0.1:7"]).await;
    let spec = fleet.spec(&"llm/p0".into()).expect("p0's engine");
    assert_eq!(
        (spec.model.as_str(), spec.role, spec.source),
        ("m", Some(Role::Plain), Source::Kubernetes)
    );
    // A pod that joins the pool later, through the pods' watch; one that leaves it.
    api.put_in("p3", "127.0.0.4", &a);
    until(
        &fleet,
        &changed,
        &["llm/p0@http://127.0.0.1:7", "llm/p3@http://127.0.0.4:7"],
    )
    .await;
    api.delete("p0", false);
    until(&fleet, &changed, &["llm/p3@http://127.0.0.4:7"]).await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_new_selector_or_port_moves_its_engines() {
    let (api, url, server) = fake_api().await;
    let a = json!({"app": "sglang", "pool": "a"});
    let b = json!({"app": "sglang", "pool": "b"});
    api.put_pool("qwen3-pool", pool_spec(&a, 7), false);
    api.put_in("p0", "127.0.0.1", &a);
    api.put_in("p1", "127.0.0.2", &b);
    let fleet = fleet();
    let (changed, _discovery) =
        discover_with(&fleet, pool_settings(&url, Duration::from_secs(3600)));
    until(&fleet, &changed, &["llm/p0@http://127.0.0.1:7"]).await;
    // Through the pool's watch: another selector, then another port.
    api.put_pool("qwen3-pool", pool_spec(&b, 7), false);
    until(&fleet, &changed, &["llm/p1@http://127.0.0.2:7"]).await;
    api.put_pool("qwen3-pool", pool_spec(&b, 9), false);
    until(&fleet, &changed, &["llm/p1@http://127.0.0.2:9"]).await;
    // The old selector's pods are followed no more.
    api.put_in("p2", "127.0.0.3", &a);
    api.put_in("p3", "127.0.0.4", &b);
    until(
        &fleet,
        &changed,
        &["llm/p1@http://127.0.0.2:9", "llm/p3@http://127.0.0.4:9"],
    )
    .await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_change_the_watch_missed_is_seen_at_the_relist() {
    let (api, url, server) = fake_api().await;
    let a = json!({"app": "sglang", "pool": "a"});
    let b = json!({"app": "sglang", "pool": "b"});
    api.put_pool("qwen3-pool", pool_spec(&a, 7), false);
    api.put_in("p0", "127.0.0.1", &a);
    api.put_in("p1", "127.0.0.2", &b);
    let fleet = fleet();
    let (changed, _discovery) =
        discover_with(&fleet, pool_settings(&url, Duration::from_millis(300)));
    until(&fleet, &changed, &["llm/p0@http://127.0.0.1:7"]).await;
    let lists = api.pool_lists.load(Ordering::SeqCst);
    api.put_pool("qwen3-pool", pool_spec(&b, 9), true);
    until(&fleet, &changed, &["llm/p1@http://127.0.0.2:9"]).await;
    assert!(
        api.pool_lists.load(Ordering::SeqCst) > lists,
        "the pool was listed again"
    );
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_deleted_or_malformed_pool_names_no_engines() {
    let (api, url, server) = fake_api().await;
    let a = json!({"app": "sglang", "pool": "a"});
    api.put_in("p0", "127.0.0.1", &a);
    let fleet = fleet();
    let (changed, _discovery) =
        discover_with(&fleet, pool_settings(&url, Duration::from_secs(3600)));
    // Missing at first: read, and no engine; its creation is watched for.
    let guard = tokio::time::timeout(GUARD, async {
        while api.pool_lists.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    });
    guard.await.expect("the pool is read");
    assert_eq!(engines(&fleet), BTreeSet::new());
    let good = pool_spec(&a, 7);
    let joined = ["llm/p0@http://127.0.0.1:7"];
    api.put_pool("qwen3-pool", good.clone(), false);
    until(&fleet, &changed, &joined).await;
    let many: serde_json::Map<String, Value> =
        (0..65).map(|n| (format!("l{n}"), json!("v"))).collect();
    for malformed in [
        json!({"targetPorts": [{"number": 7}]}),
        json!({"selector": {"matchLabels": {}}, "targetPorts": [{"number": 7}]}),
        json!({"selector": {"matchLabels": a}}),
        json!({"selector": {"matchLabels": a}, "targetPorts": []}),
        pool_spec(&a, 0),
        pool_spec(&a, 70_000),
        pool_spec(&json!(many), 7),
        pool_spec(&json!({"app": "sglang,pool=a"}), 7),
        json!("not an object"),
    ] {
        api.put_pool("qwen3-pool", malformed.clone(), false);
        until_after(
            &fleet,
            &changed,
            &[],
            &format!("a pool of spec {malformed}"),
        )
        .await;
        api.put_pool("qwen3-pool", good.clone(), false);
        until(&fleet, &changed, &joined).await;
    }
    // Deleted: its engines leave; made again: they come back.
    api.delete_pool("qwen3-pool");
    until(&fleet, &changed, &[]).await;
    api.put_pool("qwen3-pool", good, false);
    until(&fleet, &changed, &joined).await;
    server.abort();
}

#[test]
fn a_pod_a_selector_and_a_pool_both_select_joins_for_the_selector() {
    let selectors = settings("http://unused", Duration::from_secs(1)).selectors;
    let view = PodView {
        address: Some("10.0.0.1".into()),
        version: None,
    };
    let pods = BTreeMap::from([("p0".to_owned(), view.clone())]);
    let pool = |port| PoolPods {
        generation: 1,
        selector: Some(PodSelector {
            port,
            ..selectors[0].clone()
        }),
        pods: BTreeMap::from([
            ("p0".to_owned(), view.clone()),
            ("p1".to_owned(), view.clone()),
        ]),
    };
    let observed = Observed {
        pods: vec![pods],
        pools: vec![
            pool(7),
            pool(8),
            PoolPods {
                generation: 3,
                selector: None,
                pods: BTreeMap::new(),
            },
        ],
    };
    let urls: Vec<(String, String)> = desired("llm", &selectors, &observed)
        .into_iter()
        .map(|(id, spec)| (id.as_str().to_owned(), spec.url))
        .collect();
    assert_eq!(
        urls,
        [
            ("llm/p0".to_owned(), "http://10.0.0.1:9".to_owned()),
            ("llm/p1".to_owned(), "http://10.0.0.1:7".to_owned()),
        ]
    );
    // A listing of a replaced selector changes nothing.
    let mut observed = observed;
    let stale = Slot::Pool {
        index: 0,
        generation: 0,
        selector: selectors[0].clone(),
    };
    observed.listed(&stale, BTreeMap::new());
    assert!(observed.pods_mut(&stale).is_none());
    assert_eq!(observed.pools[0].pods.len(), 2);
    assert_eq!(observed.pools[0].selector.as_ref().map(|s| s.port), Some(7));
}
