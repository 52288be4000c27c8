//! Bucket configuration: parsing, every validation error with its path, and building.

use std::sync::Arc;

use router_buckets::{
    BucketConfig, BucketGroups, CATCH_ALL_BUCKET, DefaultPolicies, Membership, ModelRoster,
    build_resolver,
};
use router_policy::{PolicyConfig, PolicyHandles};
use router_state::Role;

fn roster_pd() -> ModelRoster {
    ModelRoster::new(
        [
            ("P1", Role::Prefill),
            ("P2", Role::Prefill),
            ("D1", Role::Decode),
        ]
        .map(|(id, r)| (id.into(), r)),
    )
}

fn roster_plain() -> ModelRoster {
    ModelRoster::new([("A1", Role::Plain), ("A2", Role::Plain)].map(|(id, r)| (id.into(), r)))
}

fn parse(json: &str) -> Result<Vec<BucketConfig>, String> {
    serde_json::from_str(json).map_err(|e| e.to_string())
}

fn build(json: &str, roster: &ModelRoster) -> Result<router_buckets::BucketResolver, String> {
    let configs = parse(json)?;
    let handles = PolicyHandles::new(Arc::default());
    build_resolver(
        Some(&configs),
        roster,
        &DefaultPolicies::default(),
        &handles,
    )
    .map_err(|e| e.to_string())
}

const PD_SHORT: &str = r#"[{
    "id": "short-context", "rank": 10, "limits": {"min": 0, "max": 4096}, "max_context_tokens": 8192,
    "groups": {"pd": {
        "prefill": {"engine_ids": ["P1"], "policy": {"type": "round_robin", "admission": {"max_running_requests": 64}}},
        "decode": {"engine_ids": ["D1"], "policy": {"type": "power_of_two"}}}}
}]"#;

#[test]
fn builds_the_documented_pd_bucket() {
    let resolver = build(PD_SHORT, &roster_pd()).unwrap();
    let bucket = &resolver.buckets()[0];
    assert_eq!(
        (bucket.id(), bucket.rank(), bucket.capacity()),
        ("short-context", 10, Some(4096))
    );
    let BucketGroups::Pd { prefill, decode } = bucket.groups() else {
        panic!("a PD bucket")
    };
    assert_eq!(
        prefill.membership(),
        &Membership::Only(["P1".into()].into())
    );
    assert!(format!("{:?}", prefill.policy()).starts_with("RoundRobinPolicy"));
    assert!(format!("{:?}", decode.policy()).starts_with("PowerOfTwoPolicy"));
}

#[test]
fn absent_buckets_build_one_catch_all_bucket_of_the_models_kind() {
    let handles = PolicyHandles::new(Arc::default());
    let defaults = DefaultPolicies::uniform(
        serde_json::from_str::<PolicyConfig>(r#"{"type": "load_based"}"#).unwrap(),
    );
    let plain = build_resolver(None, &roster_plain(), &defaults, &handles).unwrap();
    assert_eq!(plain.buckets().len(), 1);
    let bucket = &plain.buckets()[0];
    assert_eq!((bucket.id(), bucket.capacity()), (CATCH_ALL_BUCKET, None));
    let BucketGroups::Plain(group) = bucket.groups() else {
        panic!("plain")
    };
    assert_eq!(group.membership(), &Membership::All);
    assert!(
        format!("{:?}", group.policy()).starts_with("LeastLoadPolicy"),
        "the default policy applies"
    );
    let pd = build_resolver(None, &roster_pd(), &defaults, &handles).unwrap();
    assert!(matches!(pd.buckets()[0].groups(), BucketGroups::Pd { .. }));
}

#[test]
fn an_empty_engine_list_means_no_engines() {
    let resolver = build(
        r#"[{"id": "b", "groups": {"plain": {"engine_ids": []}}}]"#,
        &roster_plain(),
    )
    .unwrap();
    let BucketGroups::Plain(group) = resolver.buckets()[0].groups() else {
        panic!("plain")
    };
    assert_eq!(group.membership(), &Membership::Only(Default::default()));
}

#[test]
fn worker_ids_is_accepted_as_the_peer_routers_name_for_engine_ids() {
    let parsed = |key: &str| {
        parse(&format!(
            r#"[{{"id": "b", "groups": {{"plain": {{"{key}": ["A1"]}}}}}}]"#
        ))
        .unwrap()
    };
    assert_eq!(parsed("worker_ids"), parsed("engine_ids"));
    assert_eq!(
        parsed("worker_ids")[0]
            .groups
            .plain
            .as_ref()
            .unwrap()
            .engine_ids,
        Some(vec!["A1".to_owned()])
    );
}

#[test]
fn parse_errors_name_the_problem() {
    let cases = [
        (
            r#"[{"id": "b", "groups": {"plain": {}}, "weight": 2}]"#,
            "unknown field `weight`",
        ),
        (
            r#"[{"id": "b", "groups": {"plain": {"members": []}}}]"#,
            "unknown field `members`",
        ),
        (
            r#"[{"id": "b", "groups": {"pd": {"prefill": {}}}}]"#,
            "missing field `decode`",
        ),
        (
            r#"[{"id": "b", "groups": {"mixed": {}}}]"#,
            "unknown field `mixed`, expected `plain` or `pd`",
        ),
        (
            r#"[{"id": "b", "limits": {"min": 1, "upper": 3}, "groups": {"plain": {}}}]"#,
            "unknown field `upper`",
        ),
        (r#"[{"id": "b"}]"#, "missing field `groups`"),
        (
            r#"[{"id": "b", "groups": {"plain": {"policy": {"type": "fused_score"}}}}]"#,
            "policy type `fused_score` was removed",
        ),
        (
            r#"[{"id": "b", "groups": {"plain": {"policy": {"type": "power_of_two", "stable_pair": true}}}}]"#,
            "option `stable_pair` was removed",
        ),
    ];
    for (json, expected) in cases {
        let err = parse(json).unwrap_err();
        assert!(err.contains(expected), "{json}: {err}");
    }
}

#[test]
fn validation_errors_name_their_path() {
    let plain = |body: &str| format!(r#"[{{"id": "b", {body}}}]"#);
    let cases: Vec<(String, ModelRoster, &str)> = vec![
        (
            "[]".into(),
            roster_plain(),
            "buckets: must list at least one bucket; omit it for one catch-all bucket",
        ),
        (
            r#"[{"id": "", "groups": {"plain": {}}}]"#.into(),
            roster_plain(),
            "buckets[0].id: must not be empty",
        ),
        (
            r#"[{"id": "x", "groups": {"plain": {}}}, {"id": "x", "groups": {"plain": {}}}]"#
                .into(),
            roster_plain(),
            "buckets[1].id: duplicate bucket id \"x\" (also buckets[0])",
        ),
        (
            plain(r#""limits": {"min": 10, "max": 5}, "groups": {"plain": {}}"#),
            roster_plain(),
            "buckets[0].limits: min (10) is above max (5)",
        ),
        (
            plain(r#""limits": {"min": 100}, "max_context_tokens": 50, "groups": {"plain": {}}"#),
            roster_plain(),
            "buckets[0].max_context_tokens: 50 is below limits.min (100), so no request fits",
        ),
        (
            plain(r#""slo": {}, "groups": {"plain": {}}"#),
            roster_plain(),
            "buckets[0].slo: set ttft_ms, tpot_ms or both",
        ),
        (
            plain(r#""slo": {"ttft_ms": 500, "tpot_ms": 0}, "groups": {"plain": {}}"#),
            roster_plain(),
            "buckets[0].slo: tpot_ms must be 1 to 3600000",
        ),
        (
            plain(r#""max_context_tokens": 0, "groups": {"plain": {}}"#),
            roster_plain(),
            "buckets[0].max_context_tokens: 0 is below limits.min (0), so no request fits",
        ),
        (
            plain(r#""groups": {"plain": {"engine_ids": ["A1", "A9"]}}"#),
            roster_plain(),
            "buckets[0].groups.plain.engine_ids[1]: unknown engine \"A9\"",
        ),
        (
            plain(r#""groups": {"plain": {"engine_ids": ["A1", "A1"]}}"#),
            roster_plain(),
            "buckets[0].groups.plain.engine_ids[1]: engine \"A1\" is listed twice",
        ),
        (
            plain(r#""groups": {"plain": {"engine_ids": [""]}}"#),
            roster_plain(),
            "buckets[0].groups.plain.engine_ids[0]: engine id must not be empty",
        ),
        (
            plain(
                r#""groups": {"pd": {"prefill": {"engine_ids": ["P1"]}, "decode": {"engine_ids": ["P2"]}}}"#,
            ),
            roster_pd(),
            "buckets[0].groups.pd.decode.engine_ids[0]: engine \"P2\" is a prefill engine, but this group picks decode engines",
        ),
        (
            plain(r#""groups": {}"#),
            roster_plain(),
            "buckets[0].groups: set plain or pd",
        ),
        (
            plain(r#""groups": {"plain": {}, "pd": {"prefill": {}, "decode": {}}}"#),
            roster_plain(),
            "buckets[0].groups: set either plain or pd, not both: a bucket is plain or prefill/decode",
        ),
        (
            plain(r#""groups": {"plain": {}}"#),
            roster_pd(),
            "buckets[0].groups.plain: the model is served by prefill/decode engines; use groups.pd with prefill and decode groups",
        ),
        (
            plain(r#""groups": {"pd": {"prefill": {}, "decode": {}}}"#),
            roster_plain(),
            "buckets[0].groups.pd: the model is served by plain engines; use groups.plain",
        ),
        (
            plain(
                r#""groups": {"pd": {"prefill": {}, "decode": {"policy": {"type": "random", "admission": {"max_kv_tokens": 0}}}}}"#,
            ),
            roster_pd(),
            "buckets[0].groups.pd.decode.policy: admission.max_kv_tokens must be at least 1: a cap of 0 admits nothing",
        ),
    ];
    for (json, roster, expected) in cases {
        assert_eq!(build(&json, &roster).unwrap_err(), expected, "{json}");
    }
}

#[test]
fn round_trips_through_serde_and_publishes_a_schema() {
    let configs = parse(PD_SHORT).unwrap();
    let back: Vec<BucketConfig> =
        serde_json::from_str(&serde_json::to_string(&configs).unwrap()).unwrap();
    assert_eq!(configs, back);
    assert!(configs[0].groups.pd.is_some() && configs[0].groups.plain.is_none());
    let schema = serde_json::to_string(&schemars::schema_for!(BucketConfig)).unwrap();
    for field in [
        "max_context_tokens",
        "engine_ids",
        "prefill",
        "decode",
        "rank",
        "power_of_two",
    ] {
        assert!(schema.contains(field), "schema mentions {field}");
    }
}

#[test]
fn engines_whose_role_is_not_known_yet_are_accepted_in_any_group() {
    let roster = ModelRoster::default().with_unknown_roles(["X1".into(), "X2".into()]);
    assert!(roster.contains("X1") && roster.role_of("X1").is_none());
    assert_eq!(roster.mode(), None);
    let json = r#"[{"id": "b", "groups": {"pd": {"prefill": {"engine_ids": ["X1"]}, "decode": {"engine_ids": ["X2"]}}}}]"#;
    assert!(build(json, &roster).is_ok());
    let err = build(
        r#"[{"id": "b", "groups": {"plain": {"engine_ids": ["X3"]}}}]"#,
        &roster,
    )
    .unwrap_err();
    assert_eq!(
        err,
        "buckets[0].groups.plain.engine_ids[0]: unknown engine \"X3\""
    );
}
