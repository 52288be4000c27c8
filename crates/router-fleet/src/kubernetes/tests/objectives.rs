//! The InferenceObjectives the fake API server serves, told to a sink.

use super::pools::pool_settings;
use super::*;

/// The tables an objective sink was told, in order, and a signal of each.
#[derive(Debug, Default)]
struct Told {
    /// Every table told, the first first.
    tables: Mutex<Vec<ObjectiveTable>>,
    /// Notified of each table told.
    changed: Notify,
}

impl Told {
    /// Waits until the last table told is `expected`, after `what` happened; no
    /// table was told twice in a row.
    async fn until(&self, expected: &ObjectiveTable, what: &str) {
        let wait = async {
            loop {
                let notified = self.changed.notified();
                if self.tables.lock().last() == Some(expected) {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(GUARD, wait).await.is_err() {
            panic!(
                "{what}: told {:?}, expected {expected:?}",
                self.tables.lock().last()
            );
        }
        let tables = self.tables.lock();
        assert!(
            tables.windows(2).all(|pair| pair[0] != pair[1]),
            "{what}: a table told twice in a row: {tables:?}"
        );
    }

    /// How many tables were told.
    fn count(&self) -> usize {
        self.tables.lock().len()
    }
}

/// A sink recording what it is told.
fn objective_sink() -> (Arc<Told>, ObjectiveSink) {
    let told = Arc::new(Told::default());
    let recorder = Arc::clone(&told);
    let sink: ObjectiveSink = Arc::new(move |table| {
        recorder.tables.lock().push(table);
        recorder.changed.notify_waiters();
    });
    (told, sink)
}

/// Discovery of pools `qwen3-pool` (model `m`) and `llama-pool` (model `n`),
/// telling the objectives naming them to a sink; what it is told.
fn discover_objectives(url: &str, relist: Duration) -> (Arc<Told>, DiscoveryHandle) {
    let (told, sink) = objective_sink();
    let mut settings = KubernetesSettings {
        objectives: Some(sink),
        ..pool_settings(url, relist)
    };
    settings.pools.push(InferencePoolRef {
        model: "n".into(),
        name: "llama-pool".into(),
    });
    let (_, discovery) = discover_with(&fleet(), settings);
    (told, discovery)
}

/// An InferenceObjective's spec: pool `pool`, and `priority` unless it is null.
fn objective_spec(pool: &str, priority: Value) -> Value {
    let mut spec = json!({"poolRef": {"name": pool}});
    if !priority.is_null() {
        spec["priority"] = priority;
    }
    spec
}

/// Models `m` (with `m`'s objectives) and `n` (with `n`'s).
fn objective_table(m: &[(&str, i64)], n: &[(&str, i64)]) -> ObjectiveTable {
    let objectives = |entries: &[(&str, i64)]| {
        entries
            .iter()
            .map(|(name, priority)| ((*name).to_owned(), *priority))
            .collect()
    };
    BTreeMap::from([
        ("m".to_owned(), objectives(m)),
        ("n".to_owned(), objectives(n)),
    ])
}

/// Waits until `lists` counts more than `than`.
async fn until_listed(lists: &AtomicUsize, than: usize) {
    let wait = async {
        while lists.load(Ordering::SeqCst) <= than {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(GUARD, wait)
        .await
        .expect("listed again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objectives_naming_a_pool_give_its_model_their_priorities_and_changes_are_watched() {
    let (api, url, server) = fake_api().await;
    let defaults = json!({"poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "qwen3-pool"}, "priority": 10});
    api.put_objective("premium", defaults, false);
    api.put_objective("standard", objective_spec("qwen3-pool", Value::Null), false);
    api.put_objective("batch", objective_spec("qwen3-pool", json!(-5)), false);
    api.put_objective("elsewhere", objective_spec("other-pool", json!(3)), false);
    let service = json!({"poolRef": {"kind": "Service", "name": "qwen3-pool"}, "priority": 7});
    api.put_objective("service", service, false);
    let (told, _discovery) = discover_objectives(&url, Duration::from_secs(3600));
    told.until(
        &objective_table(&[("batch", -5), ("premium", 10), ("standard", 0)], &[]),
        "listed",
    )
    .await;
    assert_eq!(told.count(), 1, "told once");

    // Through the watch: a new priority, a deleted objective.
    api.put_objective("premium", objective_spec("qwen3-pool", json!(20)), false);
    told.until(
        &objective_table(&[("batch", -5), ("premium", 20), ("standard", 0)], &[]),
        "premium's priority changed",
    )
    .await;
    api.delete_objective("batch");
    told.until(
        &objective_table(&[("premium", 20), ("standard", 0)], &[]),
        "batch deleted",
    )
    .await;

    // Another pool's objective changes: listed again, nothing told.
    let lists = api.objective_lists.load(Ordering::SeqCst);
    api.put_objective("elsewhere", objective_spec("other-pool", json!(4)), false);
    until_listed(&api.objective_lists, lists).await;
    api.put_objective("chat", objective_spec("llama-pool", json!(1)), false);
    told.until(
        &objective_table(&[("premium", 20), ("standard", 0)], &[("chat", 1)]),
        "chat created",
    )
    .await;
    assert_eq!(told.count(), 4, "told each change once");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_objective_change_the_watch_missed_is_seen_at_the_relist() {
    let (api, url, server) = fake_api().await;
    api.put_objective("premium", objective_spec("qwen3-pool", json!(1)), false);
    let (told, _discovery) = discover_objectives(&url, Duration::from_millis(300));
    told.until(&objective_table(&[("premium", 1)], &[]), "listed")
        .await;
    let lists = api.objective_lists.load(Ordering::SeqCst);
    api.put_objective("premium", objective_spec("qwen3-pool", json!(2)), true);
    api.put_objective("chat", objective_spec("llama-pool", json!(3)), true);
    told.until(
        &objective_table(&[("premium", 2)], &[("chat", 3)]),
        "changed silently",
    )
    .await;
    assert!(
        api.objective_lists.load(Ordering::SeqCst) > lists,
        "listed again"
    );
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_objectives_served_gives_every_model_none_until_they_are() {
    let (api, url, server) = fake_api().await;
    api.objectives_refused.store(404, Ordering::SeqCst);
    api.put_objective("premium", objective_spec("qwen3-pool", json!(1)), false);
    let (told, _discovery) = discover_objectives(&url, Duration::from_millis(300));
    told.until(&objective_table(&[], &[]), "not served").await;
    // Installed later: read at the relist.
    api.objectives_refused.store(0, Ordering::SeqCst);
    told.until(&objective_table(&[("premium", 1)], &[]), "served")
        .await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objectives_that_cannot_be_listed_stay_as_last_told() {
    let (api, url, server) = fake_api().await;
    api.put_objective("premium", objective_spec("qwen3-pool", json!(1)), false);
    let (told, _discovery) = discover_objectives(&url, Duration::from_secs(3600));
    let first = objective_table(&[("premium", 1)], &[]);
    told.until(&first, "listed").await;
    // Access is denied, then an objective changes: the lists fail, and nothing is
    // told.
    api.objectives_refused.store(403, Ordering::SeqCst);
    let lists = api.objective_lists.load(Ordering::SeqCst);
    api.put_objective("premium", objective_spec("qwen3-pool", json!(2)), false);
    until_listed(&api.objective_lists, lists + 1).await;
    assert_eq!(told.tables.lock().clone(), [first], "nothing told");
    // Allowed again: the change is seen after the backoff.
    api.objectives_refused.store(0, Ordering::SeqCst);
    told.until(&objective_table(&[("premium", 2)], &[]), "allowed")
        .await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_objective_is_ignored_and_the_others_stay() {
    let (api, url, server) = fake_api().await;
    api.put_objective("premium", objective_spec("qwen3-pool", json!(10)), false);
    api.put_objective("chat", objective_spec("llama-pool", json!(-1)), false);
    for (name, spec) in [
        ("high", objective_spec("qwen3-pool", json!("high"))),
        ("fractional", objective_spec("qwen3-pool", json!(1.5))),
        ("huge", objective_spec("qwen3-pool", json!(u64::MAX))),
        ("unpooled", json!({"priority": 1})),
        (
            "unnamed-pool",
            json!({"poolRef": {"kind": "InferencePool"}}),
        ),
        (
            &"o".repeat(objective::MAX_OBJECTIVE_NAME + 1),
            objective_spec("qwen3-pool", json!(1)),
        ),
    ] {
        api.put_objective(name, spec, false);
    }
    let (told, _discovery) = discover_objectives(&url, Duration::from_secs(3600));
    told.until(
        &objective_table(&[("premium", 10)], &[("chat", -1)]),
        "listed",
    )
    .await;
    // Mended, it counts; broken, it no longer does.
    api.put_objective("high", objective_spec("qwen3-pool", json!(5)), false);
    told.until(
        &objective_table(&[("high", 5), ("premium", 10)], &[("chat", -1)]),
        "high mended",
    )
    .await;
    api.put_objective("premium", objective_spec("qwen3-pool", json!("1")), false);
    told.until(
        &objective_table(&[("high", 5)], &[("chat", -1)]),
        "premium broken",
    )
    .await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_keeps_its_first_objectives_by_name_read_a_page_at_a_time() {
    let (api, url, server) = fake_api().await;
    let count = objective::MAX_OBJECTIVES_PER_MODEL + 6;
    for n in 0..count {
        api.put_objective(
            &format!("o{n:05}"),
            objective_spec("qwen3-pool", json!(n)),
            false,
        );
    }
    let (told, _discovery) = discover_objectives(&url, Duration::from_secs(3600));
    let kept: Vec<(String, i64)> = (0..objective::MAX_OBJECTIVES_PER_MODEL)
        .map(|n| (format!("o{n:05}"), i64::try_from(n).unwrap()))
        .collect();
    let kept: Vec<(&str, i64)> = kept.iter().map(|(name, p)| (name.as_str(), *p)).collect();
    told.until(&objective_table(&kept, &[]), "listed").await;
    let pages = count.div_ceil(usize::try_from(PAGE).unwrap());
    assert!(
        api.objective_lists.load(Ordering::SeqCst) >= pages,
        "read in {pages} pages"
    );
    server.abort();
}
