//! Shadow policies: picks beside a group's own on a sampled share, counted, changing
//! nothing shared.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use router_buckets::{
    BucketConfig, BucketGroups, BucketResolver, DefaultPolicies, ModelRoster, ShadowTotals,
    build_resolver,
};
use router_policy::{
    BoxFuture, CacheLookup, CacheQueryError, CacheSource, Explanation, Observation, PolicyHandles,
    PrefixHits, PrefixMemo, RequestFacts,
};
use router_state::{EngineId, EngineReportedLoadTable, Role};

use crate::common::{registry, runtime};

/// A prefix source that says engine `A2` holds the first four 16-token blocks of
/// every prompt, and counts how it is asked.
#[derive(Debug, Default)]
struct A2Holds {
    lookups: AtomicUsize,
    dry_lookups: AtomicUsize,
    routed: AtomicUsize,
}

impl CacheSource for A2Holds {
    fn lookup<'a>(
        &'a self,
        _namespace: Option<&'a str>,
        token_ids: &'a [u32],
        dry_run: bool,
    ) -> BoxFuture<'a, Result<CacheLookup, CacheQueryError>> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        if dry_run {
            self.dry_lookups.fetch_add(1, Ordering::Relaxed);
        }
        let hits = PrefixHits::new(token_ids.len() / 16, 16, vec![(EngineId::from("A2"), 4)]);
        Box::pin(std::future::ready(Ok(CacheLookup::Answered(hits))))
    }

    fn routed(&self, _: Option<&str>, _: &[u32], _: &EngineId, _: usize) {
        self.routed.fetch_add(1, Ordering::Relaxed);
    }
}

fn resolver(json: &str, handles: &PolicyHandles) -> Result<BucketResolver, String> {
    let configs: Vec<BucketConfig> = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let roster =
        ModelRoster::new([("A1", Role::Plain), ("A2", Role::Plain)].map(|(id, r)| (id.into(), r)));
    build_resolver(
        Some(&configs),
        &roster,
        &DefaultPolicies::default(),
        handles,
    )
    .map_err(|e| e.to_string())
}

fn totals(resolver: &BucketResolver) -> ShadowTotals {
    let BucketGroups::Plain(group) = resolver.buckets()[0].groups() else {
        panic!("a plain bucket");
    };
    group.shadow().expect("a shadow").stats().totals()
}

/// Selects `n` requests of 64 tokens, each with its own prefix memo and a recording
/// explanation; returns each request's live engine and observations.
fn select(resolver: &BucketResolver, n: usize) -> Vec<(String, Vec<Observation>)> {
    let engines = registry(&[("A1", Role::Plain), ("A2", Role::Plain)]);
    let tokens: Vec<u32> = (0..64).collect();
    runtime().block_on(async {
        let mut picks = Vec::new();
        for _ in 0..n {
            let memo = PrefixMemo::new();
            let explanation = Explanation::recording();
            let facts = RequestFacts::new("m", 64)
                .with_token_ids(Some(&tokens))
                .with_prefix_memo(Some(&memo))
                .with_explanation(Some(&explanation));
            let selection = resolver
                .select(&engines.snapshot(), &facts)
                .await
                .expect("a pick");
            let engine = selection.pick.engines.iter().next().expect("one engine");
            picks.push((
                engine.engine.id().as_str().to_owned(),
                explanation.observations(),
            ));
        }
        picks
    })
}

#[test]
fn a_shadow_of_the_same_rotation_agrees_on_every_pick() {
    let handles = PolicyHandles::new(Arc::new(EngineReportedLoadTable::default()));
    let resolver = resolver(
        r#"[{"id": "b", "groups": {"plain": {
            "policy": {"type": "round_robin"},
            "shadow": {"policy": {"type": "round_robin"}, "every": 1}}}}]"#,
        &handles,
    )
    .expect("valid");
    let live: Vec<String> = select(&resolver, 4).into_iter().map(|(e, _)| e).collect();
    assert_eq!(live, ["A1", "A2", "A1", "A2"]);
    assert_eq!(
        totals(&resolver),
        ShadowTotals {
            agreed: 4,
            disagreed: 0,
            none: 0,
            cached_tokens: 0,
            live_cached_tokens: 0,
        },
        "its own rotation moves on, as a dry run's would not"
    );
}

#[test]
fn a_shadow_samples_a_share_of_picks_not_every_nth() {
    let handles = PolicyHandles::new(Arc::new(EngineReportedLoadTable::default()));
    let resolver = resolver(
        r#"[{"id": "b", "groups": {"plain": {
            "policy": {"type": "round_robin"},
            "shadow": {"policy": {"type": "round_robin"}, "every": 2}}}}]"#,
        &handles,
    )
    .expect("valid");
    let picks = select(&resolver, 400);
    let shadowed: Vec<&str> = picks
        .iter()
        .filter(|(_, seen)| seen.iter().any(|o| matches!(o, Observation::Shadow { .. })))
        .map(|(live, _)| live.as_str())
        .collect();
    assert!(
        (160..=240).contains(&shadowed.len()),
        "about one in two: {}",
        shadowed.len()
    );
    assert_eq!(totals(&resolver).picks(), shadowed.len() as u64);
    let on_a1 = shadowed.iter().filter(|e| **e == "A1").count();
    assert!(
        on_a1 > 0 && on_a1 < shadowed.len(),
        "every second pick would all be A1's: {on_a1} of {}",
        shadowed.len()
    );
}

#[test]
fn a_shadow_counts_what_each_pick_holds_and_changes_nothing_shared() {
    let source = Arc::new(A2Holds::default());
    let handles = PolicyHandles::new(Arc::new(EngineReportedLoadTable::default()))
        .with_prefix_source(Some(Arc::clone(&source) as Arc<dyn CacheSource>));
    let resolver = resolver(
        r#"[{"id": "b", "groups": {"plain": {
            "policy": {"type": "round_robin"},
            "shadow": {"policy": {"type": "cache_aware", "min_matched_tokens": 16}, "every": 1}}}}]"#,
        &handles,
    )
    .expect("valid");
    let picks = select(&resolver, 4);
    let live: Vec<&str> = picks.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(live, ["A1", "A2", "A1", "A2"], "the live picks are its own");
    assert_eq!(
        totals(&resolver),
        ShadowTotals {
            agreed: 2,
            disagreed: 2,
            none: 0,
            cached_tokens: 4 * 64,
            live_cached_tokens: 2 * 64,
        },
        "the shadow picks A2, which holds the prompt's 64 tokens, every time"
    );
    assert_eq!(
        (
            source.lookups.load(Ordering::Relaxed),
            source.dry_lookups.load(Ordering::Relaxed),
            source.routed.load(Ordering::Relaxed)
        ),
        (4, 4, 0),
        "the shadow's lookups leave the source as it was, and it is told of no routing"
    );
    let shadows: Vec<Option<&Observation>> = picks
        .iter()
        .map(|(_, seen)| {
            seen.iter()
                .find(|o| matches!(o, Observation::Shadow { .. }))
        })
        .collect();
    assert_eq!(
        shadows[0],
        Some(&Observation::Shadow {
            bucket: "b".into(),
            stage: Role::Plain,
            policy: "cache_aware",
            engine: Some(EngineId::from("A2")),
            agreed: false,
            cached_tokens: 64,
            live_cached_tokens: 0,
        }),
        "a recorded request carries its shadow's pick"
    );
    assert!(matches!(
        shadows[1],
        Some(Observation::Shadow { agreed: true, .. })
    ));
}

#[test]
fn a_shadow_is_validated_at_its_path() {
    let handles = PolicyHandles::new(Arc::new(EngineReportedLoadTable::default()));
    let error = |shadow: &str| {
        resolver(
            &format!(r#"[{{"id": "b", "groups": {{"plain": {{"shadow": {shadow}}}}}}}]"#),
            &handles,
        )
        .expect_err("refused")
    };
    let every = error(r#"{"policy": {"type": "random"}, "every": 0}"#);
    assert!(
        every.contains("buckets[0].groups.plain.shadow.every") && every.contains("between 1"),
        "{every}"
    );
    let policy = error(r#"{"policy": {"type": "cache_aware"}}"#);
    assert!(
        policy.contains("buckets[0].groups.plain.shadow.policy"),
        "{policy}"
    );
    let unknown = error(r#"{"policy": {"type": "random"}, "share": 0.5}"#);
    assert!(unknown.contains("share"), "{unknown}");
}

#[test]
fn a_shadow_sees_the_engines_as_the_group_did_before_its_pick_is_reserved() {
    let handles = PolicyHandles::new(Arc::new(EngineReportedLoadTable::default()));
    let resolver = resolver(
        r#"[{"id": "b", "groups": {"plain": {
            "policy": {"type": "round_robin", "admission": {"max_inflight_requests": 1}},
            "shadow": {"policy": {"type": "load_based"}, "every": 1}}}}]"#,
        &handles,
    )
    .expect("valid");
    let engines = registry(&[("A1", Role::Plain), ("A2", Role::Plain)]);
    let selection = runtime().block_on(async {
        resolver
            .select(&engines.snapshot(), &RequestFacts::new("m", 64))
            .await
            .expect("a pick")
    });
    let live = selection.pick.engines.iter().next().expect("one engine");
    assert_eq!(live.engine.id().as_str(), "A1");
    assert_eq!(
        totals(&resolver).agreed,
        1,
        "both engines idle to the shadow too: the least loaded is A1, not the A2 a reserved A1 would leave"
    );
}
