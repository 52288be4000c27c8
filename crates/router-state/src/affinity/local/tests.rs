use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::affinity::spawn_sweeper;
use crate::engine::Role;

fn scope(stage: Role) -> AffinityScope<'static> {
    AffinityScope {
        model: "m",
        bucket: "b",
        stage,
    }
}

fn id(s: &str) -> EngineId {
    EngineId::from(s)
}

fn store(max_entries: usize) -> LocalAffinityStore {
    LocalAffinityStore::new(AffinityConfig {
        idle_timeout: Duration::from_secs(60),
        max_entries,
        max_key_bytes: 32,
    })
}

#[tokio::test(start_paused = true)]
async fn the_first_binding_wins_and_replace_compares() {
    let s = store(100);
    let plain = scope(Role::Plain);
    assert_eq!(s.get(plain, "k"), Ok(None));
    assert_eq!(s.bind_if_absent(plain, "k", &id("A")), Ok(id("A")));
    assert_eq!(
        s.bind_if_absent(plain, "k", &id("B")),
        Ok(id("A")),
        "the existing binding wins"
    );
    assert_eq!(
        s.replace(plain, "k", &id("B"), &id("C")),
        Ok(id("A")),
        "expected B, found A"
    );
    assert_eq!(s.replace(plain, "k", &id("A"), &id("C")), Ok(id("C")));
    assert_eq!(s.get(plain, "k"), Ok(Some(id("C"))));
    // Scopes are independent.
    assert_eq!(s.get(scope(Role::Prefill), "k"), Ok(None));
    let other = AffinityScope {
        bucket: "b2",
        ..plain
    };
    assert_eq!(s.get(other, "k"), Ok(None));
}

#[tokio::test(start_paused = true)]
async fn idle_bindings_expire_and_the_sweeper_frees_them() {
    let s = Arc::new(store(100));
    let plain = scope(Role::Plain);
    s.bind_if_absent(plain, "kept", &id("A")).unwrap();
    s.bind_if_absent(plain, "idle", &id("A")).unwrap();
    tokio::time::advance(Duration::from_secs(40)).await;
    assert_eq!(s.get(plain, "kept"), Ok(Some(id("A"))), "use refreshes");
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(
        s.get(plain, "idle"),
        Ok(None),
        "70 s idle: gone for lookups"
    );
    assert_eq!(s.len(), 1, "the lookup dropped it");
    assert_eq!(
        s.bind_if_absent(plain, "idle", &id("B")),
        Ok(id("B")),
        "and it can be rebound"
    );

    let sweeper = spawn_sweeper(
        Arc::clone(&s) as Arc<dyn AffinityStore>,
        Duration::from_secs(10),
    );
    // Paused time: sleeping lets the clock jump from timer to timer, so the sweeper's
    // ticks at 10, 20, ... 60 s run before this task wakes at 61 s.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(s.len(), 0, "the sweeper freed both idle bindings");
    drop(sweeper);
    s.bind_if_absent(plain, "late", &id("A")).unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(s.len(), 1, "a dropped sweeper sweeps no more");
}

#[tokio::test(start_paused = true)]
async fn the_sweep_stops_at_the_first_live_binding() {
    let s = store(100);
    let plain = scope(Role::Plain);
    for k in ["a", "b", "c"] {
        s.bind_if_absent(plain, k, &id("A")).unwrap();
        tokio::time::advance(Duration::from_secs(25)).await;
    }
    // a: 75 s idle, b: 50 s, c: 25 s.
    assert_eq!(s.sweep(), 1);
    assert_eq!(s.get(plain, "b"), Ok(Some(id("A"))));
}

#[test]
fn keys_are_bounded_and_empty_keys_bind_nothing() {
    let s = store(100);
    let plain = scope(Role::Plain);
    assert_eq!(s.get(plain, ""), Err(AffinityKeyError::Empty));
    let long = "x".repeat(33);
    assert_eq!(
        s.bind_if_absent(plain, &long, &id("A")),
        Err(AffinityKeyError::TooLong { len: 33, max: 32 })
    );
    assert!(s.is_empty());
}

#[tokio::test(start_paused = true)]
async fn removing_an_engine_drops_its_bindings() {
    let s = store(100);
    let plain = scope(Role::Plain);
    for (k, e) in [("1", "A"), ("2", "B"), ("3", "A")] {
        s.bind_if_absent(plain, k, &id(e)).unwrap();
    }
    assert_eq!(s.remove_engine(&id("A")), 2);
    assert_eq!(
        (s.get(plain, "1"), s.get(plain, "2")),
        (Ok(None), Ok(Some(id("B"))))
    );
}

#[tokio::test(start_paused = true)]
async fn a_million_random_keys_never_exceed_the_bound_and_evict_the_longest_idle() {
    let bound = 4096;
    let s = store(bound);
    let plain = scope(Role::Plain);
    s.bind_if_absent(plain, "hot", &id("A")).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..1_000_000u32 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        s.bind_if_absent(plain, &format!("{state:016x}"), &id("B"))
            .unwrap();
        if i % 1000 == 0 {
            // The hot session keeps being used, so it is never the longest idle.
            assert_eq!(s.get(plain, "hot"), Ok(Some(id("A"))));
        }
    }
    assert!(
        s.len() <= bound + SHARDS,
        "{} bindings for a bound of {bound}",
        s.len()
    );
    assert!(
        s.len() >= bound - SHARDS,
        "the bound is used, not undershot"
    );
    assert_eq!(s.get(plain, "hot"), Ok(Some(id("A"))));
}
