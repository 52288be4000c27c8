//! Replays through the real selection code: deterministic, policy by policy.

use router_replay::{
    ReplayError, ReplaySettings, SettingsError, SharedPrefixWorkload, Summary,
    oracle_cached_tokens, replay, seeded, table, with_policy,
};

use crate::common::{fleet, settings};

fn summaries(policies: &[&str], trace: &[router_replay::TraceRequest]) -> Vec<Summary> {
    let config = fleet(4, "");
    let oracle = oracle_cached_tokens(trace, 16);
    policies
        .iter()
        .map(|p| {
            replay(&config, trace, Some(p), &settings())
                .unwrap()
                .summary(p, oracle)
        })
        .collect()
}

#[test]
fn the_same_inputs_give_the_same_bytes() {
    let trace = SharedPrefixWorkload {
        requests: 1000,
        requests_per_sec: 40.0,
        ..SharedPrefixWorkload::default()
    }
    .generate();
    let policies = ["random", "power_of_two", "cache_aware", "session_aware"];
    let first = summaries(&policies, &trace);
    let second = summaries(&policies, &trace);
    assert_eq!(table(&first), table(&second));
    assert_eq!(
        serde_json::to_string(&first).unwrap(),
        serde_json::to_string(&second).unwrap()
    );
    for s in &first {
        assert_eq!((s.requests, s.rejected), (1000, 0), "{}", s.policy);
        assert!(
            s.ttft_p50_ms > 0.0 && s.ttft_p99_ms >= s.ttft_p50_ms,
            "{s:?}"
        );
        assert!(s.of_oracle <= 1.0, "nothing beats the oracle: {s:?}");
    }
}

#[test]
fn cache_aware_routing_finds_more_cached_tokens_than_round_robin() {
    let trace = SharedPrefixWorkload {
        requests: 1000,
        requests_per_sec: 40.0,
        ..SharedPrefixWorkload::default()
    }
    .generate();
    let [round_robin, cache_aware] = summaries(&["round_robin", "cache_aware"], &trace)
        .try_into()
        .unwrap();
    assert!(
        cache_aware.cached_share > round_robin.cached_share + 0.1,
        "{cache_aware:?} against {round_robin:?}"
    );
    assert!(
        cache_aware
            .reasons
            .iter()
            .any(|(reason, n)| reason == "cache_hit" && *n > 0),
        "{:?}",
        cache_aware.reasons
    );
}

#[test]
fn admission_rejections_are_counted_not_served() {
    let config = fleet(
        1,
        "    policies: {plain: {type: round_robin, admission: {max_running_requests: 2}}}\n",
    );
    let trace = SharedPrefixWorkload {
        requests: 200,
        requests_per_sec: 1000.0,
        ..SharedPrefixWorkload::default()
    }
    .generate();
    let summary = replay(&config, &trace, None, &settings())
        .unwrap()
        .summary("config", 0);
    assert!(summary.rejected > 0, "{summary:?}");
    let served: u64 = summary.reasons.iter().map(|(_, n)| n).sum();
    assert_eq!(served + summary.rejected, 200);
}

#[test]
fn a_policy_swap_keeps_each_groups_admission_caps() {
    let config = fleet(
        2,
        "    buckets:\n      - id: all\n        groups: {plain: {policy: {type: cache_aware, admission: {max_waiting_requests: 3}}}}\n",
    );
    let swapped = with_policy(&config, "power_of_two").unwrap();
    let bucket = &swapped.models[0].buckets.as_ref().unwrap()[0];
    let policy = bucket
        .groups
        .plain
        .as_ref()
        .unwrap()
        .policy
        .as_ref()
        .unwrap();
    assert_eq!(policy.type_name(), "power_of_two");
    assert_eq!(policy.admission().max_waiting_requests, Some(3));
    let plain = swapped.policies.plain.as_ref().unwrap();
    assert_eq!(plain.type_name(), "power_of_two");
    let error = with_policy(&config, "fastest").unwrap_err().to_string();
    assert!(error.contains("fastest"), "{error}");
}

#[test]
fn seeding_gives_unseeded_random_policies_the_seed_and_keeps_a_configured_one() {
    let config = fleet(
        2,
        "    buckets:\n      - id: a\n        limits: {max: 100}\n        groups: {plain: {policy: {type: power_of_two}}}\n      - id: b\n        groups: {plain: {policy: {type: random, seed: 5}}}\n",
    );
    let seeded = seeded(&config, 42);
    let seed = |i: usize| {
        let group = seeded.models[0].buckets.as_ref().unwrap()[i]
            .groups
            .plain
            .clone()
            .unwrap();
        serde_json::to_value(group.policy.unwrap()).unwrap()["seed"].clone()
    };
    assert_eq!((seed(0), seed(1)), (42.into(), 5.into()));
}

/// A prefill/decode pair: the prefill engine prefills and gives the request back, the
/// decode engine takes its KV cache and generates, each with its own slots.
#[test]
fn a_prefill_decode_pair_prefills_on_one_engine_and_generates_on_the_other() {
    let config = router_config::RouterConfig::from_yaml(
        "models:\n  - id: m\n    engines:\n      - {id: P, url: 'http://127.0.0.1:1', role: prefill}\n      - {id: D, url: 'http://127.0.0.1:2', role: decode}\n",
    )
    .unwrap();
    // The same ten-page prompt twice, a microsecond apart, three tokens each.
    let trace = router_replay::read_trace(
        &b"{\"at_us\": 0, \"prompt\": [{\"id\": \"doc\", \"tokens\": 160}], \"output_tokens\": 3}\n\
           {\"at_us\": 1, \"prompt\": [{\"id\": \"doc\", \"tokens\": 160}], \"output_tokens\": 3}\n"[..],
    )
    .unwrap();
    // One slot a rank, a millisecond a prompt token, ten a generated one.
    let mut settings = settings();
    settings.engine.max_running_requests = 1;
    settings.engine.serial_prefill = false;
    settings.engine.prefill_tokens_per_sec = 1_000.0;
    settings.engine.decode_tokens_per_sec = 100.0;
    let report = replay(&config, &trace, None, &settings).unwrap();
    assert_eq!(report.engines(), ["P"], "outcomes name the prefill engine");
    let seen: Vec<_> = report
        .outcomes()
        .iter()
        .map(|o| (o.engine, o.ttft_us, o.finished_us, o.cached_tokens))
        .collect();
    assert_eq!(
        seen,
        [
            // Prefilled on P by 160 ms, its first token on D 10 ms later.
            (Some(0), Some(170_000), Some(190_000), 0),
            // P's slot is free at 160 ms and the prompt cached there: prefilled at
            // once, it waits for D's one slot until 190 ms.
            (Some(0), Some(199_999), Some(220_000), 160),
        ]
    );
}

/// The router counts both legs of a pair in flight until the answer ends: a prefill
/// engine capped at one request in flight takes no second request while the first
/// is still decoding elsewhere.
#[test]
fn a_pairs_prefill_engine_counts_its_request_until_the_answer_ends() {
    let config = router_config::RouterConfig::from_yaml(
        "models:\n  - id: m\n    engines:\n      - {id: P, url: 'http://127.0.0.1:1', role: prefill}\n      - {id: D, url: 'http://127.0.0.1:2', role: decode}\n    buckets:\n      - id: all\n        groups: {pd: {prefill: {policy: {type: round_robin, admission: {max_inflight_requests: 1}}}, decode: {}}}\n",
    )
    .unwrap();
    // The second arrives at 100 ms: the first was prefilled at 16 ms and decodes
    // until 216 ms.
    let trace = router_replay::read_trace(
        &b"{\"at_us\": 0, \"prompt\": [{\"id\": \"a\", \"tokens\": 16}], \"output_tokens\": 20}\n\
           {\"at_us\": 100000, \"prompt\": [{\"id\": \"b\", \"tokens\": 16}], \"output_tokens\": 20}\n"[..],
    )
    .unwrap();
    let mut settings = settings();
    settings.engine.serial_prefill = false;
    settings.engine.prefill_tokens_per_sec = 1_000.0;
    settings.engine.decode_tokens_per_sec = 100.0;
    let report = replay(&config, &trace, None, &settings).unwrap();
    let seen: Vec<_> = report
        .outcomes()
        .iter()
        .map(|o| (o.rejected, o.ttft_us, o.finished_us))
        .collect();
    assert_eq!(
        seen,
        [(false, Some(26_000), Some(216_000)), (true, None, None)],
        "the prefill engine still counts the first request at 100 ms"
    );
}

#[test]
fn an_error_says_what_it_carries_once() {
    // The binary prints an error with its chain of sources: what a message already
    // says is no source too.
    let config = fleet(2, "");
    let trace = SharedPrefixWorkload {
        requests: 1,
        ..SharedPrefixWorkload::default()
    }
    .generate();
    let mut slotless = settings();
    slotless.engine.max_running_requests = 0;
    for error in [
        replay(&config, &trace, Some("fastest"), &settings()).unwrap_err(),
        replay(&config, &trace, None, &slotless).unwrap_err(),
    ] {
        assert!(std::error::Error::source(&error).is_none(), "{error}");
    }
    let slotless = replay(&config, &trace, None, &slotless).unwrap_err();
    assert_eq!(
        slotless.to_string(),
        "configuration: engine slots must be 1 to 65536"
    );
    assert!(matches!(
        slotless,
        ReplayError::Settings(SettingsError::Slots)
    ));
}

#[test]
fn engines_without_kv_events_give_cache_aware_no_hits_and_round_robin_no_change() {
    let trace = SharedPrefixWorkload {
        requests: 1000,
        requests_per_sec: 40.0,
        ..SharedPrefixWorkload::default()
    }
    .generate();
    // The router estimates no engine from its routing: it knows only what it hears.
    let config = fleet(4, "    routed_pages: {estimate: none}\n");
    let oracle = oracle_cached_tokens(&trace, 16);
    let run_with = |config: &router_config::RouterConfig, policy: &str, silent: usize| {
        let settings = ReplaySettings {
            silent_kv_engines: silent,
            ..settings()
        };
        replay(config, &trace, Some(policy), &settings).unwrap()
    };
    let run = |policy: &str, silent: usize| run_with(&config, policy, silent);
    let hits_on = |report: &router_replay::RunReport, engines: std::ops::Range<usize>| {
        report
            .outcomes()
            .iter()
            .filter(|o| {
                o.reason.as_deref() == Some("cache_hit")
                    && o.engine.is_some_and(|e| engines.contains(&e))
            })
            .count()
    };
    let heard = run("cache_aware", 0);
    let half = run("cache_aware", 2);
    let deaf = run("cache_aware", 4);
    assert!(hits_on(&heard, 0..2) > 0 && hits_on(&heard, 2..4) > 0);
    assert_eq!(hits_on(&half, 0..2), 0, "no hit on a silent engine");
    assert!(hits_on(&half, 2..4) > 0);
    assert_eq!(
        hits_on(&deaf, 0..4),
        0,
        "an index that hears nothing finds nothing"
    );
    let share = |report: &router_replay::RunReport| report.summary("", oracle).cached_share;
    assert!(
        share(&deaf) + 0.1 < share(&heard),
        "the engines still cache, but the router cannot aim at them: {} vs {}",
        share(&deaf),
        share(&heard)
    );
    // By default the silent engines are estimated from what the router sent them.
    let estimated = run_with(&fleet(4, ""), "cache_aware", 4);
    assert!(hits_on(&estimated, 0..4) > 0);
    assert!(
        share(&estimated) >= 0.8 * share(&heard),
        "estimated from routing alone, {} of the cached share with events, {}",
        share(&estimated),
        share(&heard)
    );
    let round_robin = |silent| table(&[run("round_robin", silent).summary("round_robin", oracle)]);
    assert_eq!(
        round_robin(0),
        round_robin(4),
        "round robin reads no KV events"
    );
    let error = replay(
        &config,
        &trace,
        None,
        &ReplaySettings {
            silent_kv_engines: 5,
            ..settings()
        },
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "configuration: 5 engines without KV events, but the configuration has 4 engines"
    );
}
