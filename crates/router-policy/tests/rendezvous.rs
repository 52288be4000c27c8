//! Rendezvous affinity over large candidate sets: a key's engine is a function of the
//! key and the candidate set alone (replicas that share nothing agree), and an
//! engine leaving or joining moves only the keys it loses or gains.

use crate::common;

use std::sync::Arc;

use common::{runtime, table};
use proptest::prelude::*;
use router_policy::{
    AffinityBackend, PickRequest, Policy, PolicyConfig, PolicyHandles, RequestFacts,
};
use router_state::affinity::rendezvous;
use router_state::test_util::fleet;
use router_state::{Engine, EngineReportedLoadTable, Role};

fn policy(kind: &str, load: &Arc<EngineReportedLoadTable>) -> Arc<dyn Policy> {
    let json = format!(r#"{{"type": "{kind}", "admission": {{"max_inflight_requests": 1}}}}"#);
    let config: PolicyConfig = serde_json::from_str(&json).expect("a policy");
    let handles =
        PolicyHandles::new(Arc::clone(load)).with_affinity(Some(AffinityBackend::Rendezvous));
    config.build(Role::Plain, &handles).expect("built")
}

/// The engine `policy` picks for `key` among `engines`.
fn pick(policy: &dyn Policy, engines: &[Arc<Engine>], kind: &str, key: &str) -> String {
    let facts = RequestFacts::new("m", 100);
    let facts = match kind {
        "session_aware" => facts.with_session_key(Some(key)),
        _ => facts.with_routing_key(Some(key)),
    };
    let request = PickRequest::new(facts, Role::Plain, "b");
    runtime()
        .block_on(policy.pick(engines, &request))
        .expect("admitted")
        .engine
        .id()
        .to_string()
}

fn kind() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("session_aware"), Just("sticky")]
}

fn keys() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec("[a-z0-9-]{1,40}", 1..48)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn replicas_that_share_nothing_pick_alike(
        kind in kind(),
        n in 1usize..1100,
        keys in keys(),
        rotate in 0usize..1100,
    ) {
        // Two replicas: their own engines, load tables and policies; the second is
        // given the candidates in another order.
        let ours = fleet("m", Role::Plain, "e", n);
        let mut theirs = fleet("m", Role::Plain, "e", n);
        theirs.rotate_left(rotate % n);
        let (a, b) = (policy(kind, &table(&ours)), policy(kind, &table(&theirs)));
        for key in &keys {
            let picked = pick(a.as_ref(), &ours, kind, key);
            prop_assert_eq!(&picked, &pick(b.as_ref(), &theirs, kind, key));
            // Both are the head of the key's rendezvous order.
            let order = rendezvous::order(key, &ours, |e| e.id());
            prop_assert_eq!(&picked, order[0].id().as_str());
        }
    }

    #[test]
    fn an_engine_leaving_moves_only_its_own_keys_and_one_joining_takes_only_keys(
        kind in kind(),
        n in 3usize..1100,
        gone in 0usize..1100,
        capped in 0usize..1100,
        keys in keys(),
    ) {
        let all = fleet("m", Role::Plain, "e", n);
        let gone = all[gone % n].id().clone();
        let rest: Vec<Arc<Engine>> = all.iter().filter(|e| *e.id() != gone).cloned().collect();
        let load = table(&all);
        let policy = policy(kind, &load);
        // One engine at its admission cap while the set changes: its keys go to their
        // next engine in both sets.
        let _busy = load.acquire(all[capped % n].id());
        for key in &keys {
            let before = pick(policy.as_ref(), &all, kind, key);
            let after = pick(policy.as_ref(), &rest, kind, key);
            if before != gone.as_str() {
                prop_assert_eq!(&after, &before, "a key of an engine that stayed moved");
            } else {
                // The key goes where its order says next, the cap still applying.
                let next = rendezvous::order(key, &rest, |e| e.id())
                    .into_iter()
                    .find(|e| e.id() != all[capped % n].id())
                    .expect("an engine is left");
                prop_assert_eq!(&after, next.id().as_str());
            }
            // Joining is the same change the other way: a key that moves, moves to
            // the engine that joined.
            if after != before {
                prop_assert_eq!(&before, gone.as_str());
            }
        }
    }
}
