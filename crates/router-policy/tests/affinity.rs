//! SessionAwarePolicy and StickyPolicy: reuse, binding after admission, conflicts,
//! keyless requests, fallbacks and configuration.

use crate::common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{engines, runtime, table};
use proptest::prelude::*;
use router_policy::{
    AdmissionLimits, AffinityBackend, PickError, PickReason, PickRequest, Policy, PolicyConfig,
    PolicyConfigError, PolicyHandles, RequestFacts, SessionAwarePolicy,
};
use router_state::affinity::{
    AffinityConfig, AffinityScope, AffinityStore, Deadline, LocalAffinityStore, StoreFuture,
    rendezvous,
};
use router_state::{Engine, EngineId, EngineReportedLoadTable, Role};
use tokio::time::Instant;

fn store() -> Arc<LocalAffinityStore> {
    Arc::new(LocalAffinityStore::new(AffinityConfig::default()))
}

fn build(
    json: &str,
    store: &Arc<LocalAffinityStore>,
    load: &Arc<EngineReportedLoadTable>,
) -> Arc<dyn Policy> {
    build_with(json, AffinityBackend::Store(Arc::clone(store) as _), load)
}

fn build_with(
    json: &str,
    backend: AffinityBackend,
    load: &Arc<EngineReportedLoadTable>,
) -> Arc<dyn Policy> {
    let config: PolicyConfig = serde_json::from_str(json).expect("a policy");
    let handles = PolicyHandles::new(Arc::clone(load)).with_affinity(Some(backend));
    config.build(Role::Plain, &handles).expect("built")
}

fn scope() -> AffinityScope<'static> {
    AffinityScope {
        model: "m",
        bucket: "b",
        stage: Role::Plain,
    }
}

fn session(key: &str) -> PickRequest<'_> {
    PickRequest::new(
        RequestFacts::new("m", 100).with_session_key(Some(key)),
        Role::Plain,
        "b",
    )
}

fn pick(
    policy: &dyn Policy,
    engines: &[Arc<Engine>],
    request: &PickRequest<'_>,
) -> Result<(String, PickReason), PickError> {
    runtime()
        .block_on(policy.pick(engines, request))
        .map(|p| (p.engine.id().to_string(), p.reason))
}

#[test]
fn a_session_is_bound_after_its_first_pick_and_reused() {
    let fleet = engines(4);
    let load = table(&fleet);
    let store = store();
    let policy = build(r#"{"type": "session_aware", "seed": 3}"#, &store, &load);
    let (first, reason) = pick(policy.as_ref(), &fleet, &session("s1")).unwrap();
    assert_eq!(reason, PickReason::AffinityAssigned);
    assert_eq!(
        store.get(scope(), "s1"),
        Ok(Some(EngineId::from(first.as_str())))
    );
    for _ in 0..10 {
        assert_eq!(
            pick(policy.as_ref(), &fleet, &session("s1")).unwrap(),
            (first.clone(), PickReason::AffinityBound)
        );
    }
}

#[test]
fn a_rejected_binding_fails_the_pick_and_is_kept() {
    let fleet = engines(3);
    let load = table(&fleet);
    let store = store();
    store
        .bind_if_absent(scope(), "s", &EngineId::from("e1"))
        .unwrap();
    let policy = build(
        r#"{"type": "session_aware", "admission": {"max_inflight_requests": 1}}"#,
        &store,
        &load,
    );
    let _busy = load.acquire(fleet[1].id());
    match pick(policy.as_ref(), &fleet, &session("s")) {
        Err(PickError::AdmissionRejected { rejection, .. }) => {
            assert_eq!(rejection.engine.as_str(), "e1");
        }
        other => panic!("expected the bound engine's rejection, got {other:?}"),
    }
    assert_eq!(
        store.get(scope(), "s"),
        Ok(Some(EngineId::from("e1"))),
        "kept"
    );
}

#[test]
fn a_binding_outside_the_candidates_is_replaced() {
    let fleet = engines(3);
    let load = table(&fleet);
    let store = store();
    store
        .bind_if_absent(scope(), "s", &EngineId::from("gone"))
        .unwrap();
    let policy = build(r#"{"type": "sticky"}"#, &store, &load);
    let request = PickRequest::new(
        RequestFacts::new("m", 100).with_routing_key(Some("s")),
        Role::Plain,
        "b",
    );
    let (engine, reason) = pick(policy.as_ref(), &fleet, &request).unwrap();
    assert_eq!(reason, PickReason::AffinityAssigned);
    assert_eq!(
        store.get(scope(), "s"),
        Ok(Some(EngineId::from(engine.as_str())))
    );
}

#[test]
fn keyless_and_empty_keys_use_the_fallback_and_bind_nothing() {
    let fleet = engines(3);
    let load = table(&fleet);
    let store = store();
    let policy = build(
        r#"{"type": "sticky", "fallback": "round_robin"}"#,
        &store,
        &load,
    );
    let mut seen = Vec::new();
    for key in [None, Some(""), None] {
        let request = PickRequest::new(
            RequestFacts::new("m", 100).with_routing_key(key),
            Role::Plain,
            "b",
        );
        let (engine, reason) = pick(policy.as_ref(), &fleet, &request).unwrap();
        assert_eq!(reason, PickReason::RoundRobin);
        seen.push(engine);
    }
    assert_eq!(seen, ["e0", "e1", "e2"], "keyless requests rotate");
    assert!(store.is_empty());
    // A session key does not bind a sticky policy, nor a routing key a session one.
    let session_policy = build(r#"{"type": "session_aware"}"#, &store, &load);
    let request = PickRequest::new(
        RequestFacts::new("m", 100).with_routing_key(Some("r")),
        Role::Plain,
        "b",
    );
    pick(session_policy.as_ref(), &fleet, &request).unwrap();
    assert!(store.is_empty());
}

#[test]
fn every_sticky_fallback_builds_and_an_unknown_one_is_named() {
    let fleet = engines(2);
    let load = table(&fleet);
    let store = store();
    for fallback in ["round_robin", "random", "power_of_two", "load_based"] {
        let json = format!(r#"{{"type": "sticky", "fallback": "{fallback}"}}"#);
        let policy = build(&json, &store, &load);
        assert!(
            pick(policy.as_ref(), &fleet, &session("x")).is_ok(),
            "{fallback}"
        );
    }
    let err = serde_json::from_str::<PolicyConfig>(r#"{"type": "sticky", "fallback": "fastest"}"#)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("unknown variant `fastest`"), "{err}");
    let config: PolicyConfig = serde_json::from_str(r#"{"type": "session_aware"}"#).unwrap();
    let err = config
        .build(Role::Plain, &PolicyHandles::new(load))
        .unwrap_err();
    assert!(
        matches!(err, PolicyConfigError::MissingState { .. }),
        "{err}"
    );
}

#[test]
fn sixty_four_racing_first_requests_of_one_session_end_on_one_engine() {
    let fleet = engines(8);
    let load = table(&fleet);
    let store = store();
    let policy = build(r#"{"type": "session_aware"}"#, &store, &load);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .expect("a runtime");
    let chosen: BTreeSet<String> = rt.block_on(async {
        let barrier = Arc::new(tokio::sync::Barrier::new(64));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (policy, fleet, barrier) =
                    (Arc::clone(&policy), fleet.clone(), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    let request = session("racing");
                    policy
                        .pick(&fleet, &request)
                        .await
                        .map(|p| p.engine.id().to_string())
                })
            })
            .collect();
        let mut chosen = BTreeSet::new();
        for task in tasks {
            chosen.insert(task.await.expect("joined").expect("picked"));
        }
        chosen
    });
    assert_eq!(
        chosen.len(),
        1,
        "every racer ended on one engine: {chosen:?}"
    );
    let bound = store.get(scope(), "racing").unwrap().expect("bound");
    assert_eq!(chosen.first().map(String::as_str), Some(bound.as_str()));
}

/// One step of a random workload against a session policy.
#[derive(Debug, Clone)]
struct Step {
    key: Option<u8>,
    /// Which of the six engines are candidates.
    candidates: u8,
    /// In-flight requests to add to one engine before the pick.
    busy: (usize, u8),
}

fn step() -> impl Strategy<Value = Step> {
    (proptest::option::of(0u8..4), 1u8..64, (0usize..6, 0u8..3)).prop_map(
        |(key, candidates, busy)| Step {
            key,
            candidates,
            busy,
        },
    )
}

proptest! {
    #[test]
    fn bindings_follow_admission_and_stay_within_the_candidates(
        steps in proptest::collection::vec(step(), 1..40),
        sticky in any::<bool>(),
    ) {
        let fleet = engines(6);
        let load = table(&fleet);
        let store = store();
        let json = if sticky {
            r#"{"type": "sticky", "fallback": "random", "seed": 1, "admission": {"max_inflight_requests": 2}}"#
        } else {
            r#"{"type": "session_aware", "seed": 1, "admission": {"max_inflight_requests": 2}}"#
        };
        let policy = build(json, &store, &load);
        let mut held = Vec::new();
        for step in steps {
            for _ in 0..step.busy.1 {
                held.push(load.acquire(fleet[step.busy.0].id()));
            }
            let candidates: Vec<Arc<Engine>> = fleet
                .iter()
                .enumerate()
                .filter(|(i, _)| step.candidates & (1 << i) != 0)
                .map(|(_, e)| Arc::clone(e))
                .collect();
            let key = step.key.map(|k| format!("k{k}"));
            let facts = RequestFacts::new("m", 100);
            let facts = if sticky {
                facts.with_routing_key(key.as_deref())
            } else {
                facts.with_session_key(key.as_deref())
            };
            let request = PickRequest::new(facts, Role::Plain, "b");
            let bindings = store.len();
            let before = key.as_deref().map(|k| store.get(scope(), k).unwrap());
            let result = runtime().block_on(policy.pick(&candidates, &request));
            let after = key.as_deref().map(|k| store.get(scope(), k).unwrap());
            match result {
                Ok(pick) => {
                    prop_assert!(
                        candidates.iter().any(|c| Arc::ptr_eq(c, &pick.engine)),
                        "the pick is one of the candidates' own Arcs"
                    );
                    let in_flight = load.in_flight(pick.engine.id());
                    prop_assert!(in_flight < 2, "an engine at its cap ({in_flight}) was returned");
                    if let Some(after) = after {
                        prop_assert_eq!(after.as_ref(), Some(pick.engine.id()), "the key is bound to the pick");
                    }
                }
                Err(e) => {
                    prop_assert!(e.advances_to_next_bucket(), "{}", e);
                    prop_assert_eq!(before, after, "a failed pick binds nothing");
                }
            }
            if key.is_none() {
                prop_assert_eq!(store.len(), bindings, "keyless picks bind nothing");
            }
        }
    }
}

/// A fallback that, while it picks, lets a "concurrent request" bind the key first.
#[derive(Debug)]
struct RacedFallback {
    store: Arc<LocalAffinityStore>,
    winner: &'static str,
}

impl Policy for RacedFallback {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Engine>],
        _: &'a PickRequest<'a>,
    ) -> router_policy::BoxFuture<'a, Result<router_policy::Pick, PickError>> {
        self.store
            .bind_if_absent(scope(), "s", &EngineId::from(self.winner))
            .expect("a valid key");
        let last = Arc::clone(engines.last().expect("candidates"));
        Box::pin(std::future::ready(Ok(router_policy::Pick::new(
            last,
            PickReason::Random,
        ))))
    }
}

#[test]
fn a_concurrent_winner_is_checked_before_it_is_returned() {
    let fleet = engines(3);
    let load = table(&fleet);
    let raced = |winner: &'static str| {
        let store = store();
        let fallback = Arc::new(RacedFallback {
            store: Arc::clone(&store),
            winner,
        });
        let caps = AdmissionLimits {
            max_inflight_requests: Some(1),
            ..AdmissionLimits::default()
        };
        let policy = SessionAwarePolicy::new(
            AffinityBackend::Store(Arc::clone(&store) as _),
            Arc::clone(&load),
            Arc::new(caps),
            fallback,
        );
        (store, policy)
    };
    // The winner is a candidate and admitted: every racer ends on it.
    let (store, policy) = raced("e0");
    assert_eq!(
        pick(&policy, &fleet, &session("s")).unwrap(),
        ("e0".to_owned(), PickReason::AffinityBound)
    );
    assert_eq!(store.get(scope(), "s"), Ok(Some(EngineId::from("e0"))));
    // The winner is at its cap: it is rejected, never returned, and stays bound.
    let (store, policy) = raced("e0");
    let busy = load.acquire(fleet[0].id());
    let err = pick(&policy, &fleet, &session("s")).unwrap_err();
    assert!(matches!(err, PickError::AdmissionRejected { .. }), "{err}");
    assert_eq!(store.get(scope(), "s"), Ok(Some(EngineId::from("e0"))));
    drop(busy);
    // The winner is not a candidate: it is replaced by this request's engine.
    let (store, policy) = raced("elsewhere");
    assert_eq!(
        pick(&policy, &fleet, &session("s")).unwrap(),
        ("e2".to_owned(), PickReason::AffinityAssigned)
    );
    assert_eq!(store.get(scope(), "s"), Ok(Some(EngineId::from("e2"))));
}

/// Local bindings behind a store that hands out a new deadline each time one is
/// asked for, and records the deadline each operation was given.
#[derive(Debug)]
struct DeadlineStore {
    bindings: LocalAffinityStore,
    handed: Mutex<Vec<Deadline>>,
    given: Mutex<Vec<(&'static str, Deadline)>>,
}

impl DeadlineStore {
    fn given(&self, operation: &'static str, deadline: Deadline) {
        self.given.lock().unwrap().push((operation, deadline));
    }
}

impl AffinityStore for DeadlineStore {
    fn deadline(&self) -> Deadline {
        let mut handed = self.handed.lock().unwrap();
        let hours = u64::try_from(handed.len()).unwrap() + 1;
        let deadline = Deadline::at(Instant::now() + Duration::from_secs(3600 * hours));
        handed.push(deadline);
        deadline
    }

    fn get<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        deadline: Deadline,
    ) -> StoreFuture<'a, Option<EngineId>> {
        self.given("get", deadline);
        AffinityStore::get(&self.bindings, scope, key, deadline)
    }

    fn peek<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        deadline: Deadline,
    ) -> StoreFuture<'a, Option<EngineId>> {
        self.given("peek", deadline);
        AffinityStore::peek(&self.bindings, scope, key, deadline)
    }

    fn bind_if_absent<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        engine: &'a EngineId,
        deadline: Deadline,
    ) -> StoreFuture<'a, EngineId> {
        self.given("bind_if_absent", deadline);
        AffinityStore::bind_if_absent(&self.bindings, scope, key, engine, deadline)
    }

    fn replace<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        expected: &'a EngineId,
        engine: &'a EngineId,
        deadline: Deadline,
    ) -> StoreFuture<'a, EngineId> {
        self.given("replace", deadline);
        AffinityStore::replace(&self.bindings, scope, key, expected, engine, deadline)
    }

    fn remove_engine(&self, engine: &EngineId) -> usize {
        self.bindings.remove_engine(engine)
    }

    fn sweep(&self) -> usize {
        self.bindings.sweep()
    }

    fn len(&self) -> usize {
        self.bindings.len()
    }
}

#[test]
fn the_store_calls_of_one_pick_share_one_deadline() {
    let fleet = engines(3);
    let load = table(&fleet);
    let store = Arc::new(DeadlineStore {
        bindings: LocalAffinityStore::new(AffinityConfig::default()),
        handed: Mutex::new(Vec::new()),
        given: Mutex::new(Vec::new()),
    });
    let policy = build_with(
        r#"{"type": "session_aware"}"#,
        AffinityBackend::Store(Arc::clone(&store) as _),
        &load,
    );
    let (first, _) = pick(policy.as_ref(), &fleet, &session("s")).unwrap();
    // The bound engine leaves the candidates: the next pick rebinds.
    let others: Vec<_> = fleet
        .iter()
        .filter(|e| e.id().as_str() != first)
        .cloned()
        .collect();
    let (second, reason) = pick(policy.as_ref(), &others, &session("s")).unwrap();
    assert_eq!(reason, PickReason::AffinityAssigned);
    assert_ne!(second, first);
    let handed = store.handed.lock().unwrap().clone();
    assert_eq!(handed.len(), 2, "one deadline a pick");
    assert_eq!(
        *store.given.lock().unwrap(),
        [
            ("get", handed[0]),
            ("bind_if_absent", handed[0]),
            ("get", handed[1]),
            ("replace", handed[1]),
        ]
    );
}

#[test]
fn rendezvous_sends_a_key_to_its_first_admitted_engine_on_every_replica() {
    let fleet = engines(4);
    let load = table(&fleet);
    let json = r#"{"type": "sticky", "admission": {"max_inflight_requests": 1}}"#;
    let replicas = [
        build_with(json, AffinityBackend::Rendezvous, &load),
        build_with(json, AffinityBackend::Rendezvous, &load),
    ];
    let keyed = |key: &'static str| {
        PickRequest::new(
            RequestFacts::new("m", 100).with_routing_key(Some(key)),
            Role::Plain,
            "b",
        )
    };
    for key in ["a", "b", "c", "d", "e", "f"] {
        let order = rendezvous::order(key, &fleet, |e| e.id());
        for policy in &replicas {
            assert_eq!(
                pick(policy.as_ref(), &fleet, &keyed(key)).unwrap(),
                (order[0].id().to_string(), PickReason::AffinityRendezvous),
                "{key}"
            );
        }
        // The first engine at its cap: the next in the key's order, on every replica.
        let busy = load.acquire(order[0].id());
        for policy in &replicas {
            assert_eq!(
                pick(policy.as_ref(), &fleet, &keyed(key)).unwrap().0,
                order[1].id().to_string(),
                "{key}"
            );
        }
        // Every engine at its cap: the pick fails, so the bucket loop moves on.
        let rest: Vec<_> = order[1..].iter().map(|e| load.acquire(e.id())).collect();
        let err = pick(replicas[0].as_ref(), &fleet, &keyed(key)).unwrap_err();
        assert!(matches!(err, PickError::AdmissionRejected { .. }), "{err}");
        drop((busy, rest));
        // Without the first engine (it left), the key goes where its order says next.
        let without: Vec<_> = fleet
            .iter()
            .filter(|e| e.id() != order[0].id())
            .cloned()
            .collect();
        assert_eq!(
            pick(replicas[1].as_ref(), &without, &keyed(key)).unwrap().0,
            order[1].id().to_string()
        );
    }
    let keyless = PickRequest::new(RequestFacts::new("m", 100), Role::Plain, "b");
    assert_eq!(
        pick(replicas[0].as_ref(), &fleet, &keyless).unwrap().1,
        PickReason::RoundRobin,
        "a keyless request uses the fallback"
    );
}
