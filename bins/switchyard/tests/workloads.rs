//! `switchyard workload --shape`, `replay --closed-loop` and engines without KV events
//! as an operator runs them, and what they refuse.

use std::process::{Command, Output};

use crate::common::TempFile;

const ENGINES: &[&str] = &[
    "--slots",
    "16",
    "--prefill-tokens-per-sec",
    "20000",
    "--serial-prefill",
    "--decode-tokens-per-sec",
    "100",
    "--kv-capacity-tokens",
    "65536",
];

const FLEET: &str = "models:\n  - id: m\n    engines:\n      - {id: a, url: 'http://127.0.0.1:1', role: plain}\n      - {id: b, url: 'http://127.0.0.1:2', role: plain}\n      - {id: c, url: 'http://127.0.0.1:3', role: plain}\n";

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn switchyard(args: &[&str]) -> Output {
    let out = run(&[args, ENGINES].concat());
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The summaries a replay wrote as JSON.
fn summaries(json: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap()
}

#[test]
fn every_shape_is_generated_at_a_share_of_capacity_and_replays_open_and_closed() {
    let config = TempFile::new(FLEET);
    let trace = TempFile::new("");
    let [config, trace] = [&config, &trace].map(|f| f.0.to_str().unwrap().to_owned());
    // Documents shorter than by default, for a debug build's speed.
    for (shape, knobs, prefix) in [
        ("bursts", &["--burst-size", "8-16"][..], "\"burst-"),
        ("agents", &["--subagent-share", "0.3"][..], "\"tools-"),
        (
            "documents",
            &["--document-tokens", "2000-6000"][..],
            "\"doc-",
        ),
    ] {
        let generated = switchyard(
            &[
                &[
                    "workload",
                    "--shape",
                    shape,
                    "--out",
                    &trace,
                    "--requests",
                    "300",
                    "--load",
                    "1.2",
                    "--config",
                    &config,
                ][..],
                knobs,
            ]
            .concat(),
        );
        let said = String::from_utf8_lossy(&generated.stderr);
        assert!(
            said.contains("capacity under round_robin"),
            "{shape}: {said}"
        );
        let text = std::fs::read_to_string(&trace).unwrap();
        assert_eq!(text.lines().count(), 300, "{shape}");
        assert!(text.contains(prefix), "{shape}");
        let replay = |extra: &[&str]| {
            let out = switchyard(
                &[
                    &[
                        "replay",
                        "--trace",
                        &trace,
                        "--config",
                        &config,
                        "--policies",
                        "round_robin,cache_aware",
                    ][..],
                    extra,
                ]
                .concat(),
            );
            String::from_utf8(out.stdout).unwrap()
        };
        for table in [replay(&[]), replay(&["--closed-loop", "24"])] {
            let lines: Vec<&str> = table.lines().collect();
            assert_eq!(lines.len(), 3, "{shape}: {table}");
            assert!(
                lines[1].starts_with("round_robin") && lines[1].contains(" 300 "),
                "{shape}: {table}"
            );
        }
        assert_eq!(
            replay(&["--closed-loop", "24"]),
            replay(&["--closed-loop", "24"]),
            "{shape}: a closed loop prints the same bytes every time"
        );
    }
}

#[test]
fn engines_without_kv_events_cost_cache_aware_its_hits_and_round_robin_nothing() {
    // The router estimates no engine from its own routing: it knows what it hears.
    let config = TempFile::new(&format!("{FLEET}    routed_pages: {{estimate: none}}\n"));
    let trace = TempFile::new("");
    let json = TempFile::new("");
    let [config, trace, json] = [&config, &trace, &json].map(|f| f.0.to_str().unwrap().to_owned());
    switchyard(&[
        "workload",
        "--out",
        &trace,
        "--requests",
        "600",
        "--engines",
        "3",
    ]);
    let replay = |extra: &[&str]| {
        switchyard(
            &[
                &[
                    "replay",
                    "--trace",
                    &trace,
                    "--config",
                    &config,
                    "--policies",
                    "round_robin,cache_aware",
                    "--json",
                    &json,
                ][..],
                extra,
            ]
            .concat(),
        );
        summaries(&json)
    };
    let heard = replay(&[]);
    let deaf = replay(&["--no-kv-events"]);
    let one = replay(&["--silent-kv-engines", "1"]);
    assert_eq!(heard[0], deaf[0], "round robin reads no KV events");
    let cached = |s: &serde_json::Value| s[1]["cached_share"].as_f64().unwrap();
    assert!(
        cached(&deaf) + 0.1 < cached(&heard),
        "{} vs {}",
        cached(&deaf),
        cached(&heard)
    );
    let hits = |s: &serde_json::Value| {
        s[1]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r[0] == "cache_hit")
            .map_or(0, |r| r[1].as_u64().unwrap())
    };
    assert_eq!(hits(&deaf), 0, "{deaf}");
    assert!(hits(&heard) > hits(&one) && hits(&one) > 0);
}

#[test]
fn bad_values_are_refused_with_the_flag_and_its_bounds() {
    let config = TempFile::new(FLEET);
    let trace = TempFile::new(
        "{\"at_us\": 0, \"prompt\": [{\"id\": \"a\", \"tokens\": 20}], \"output_tokens\": 1}\n",
    );
    let [config, trace] = [&config, &trace].map(|f| f.0.to_str().unwrap().to_owned());
    let workload = ["workload", "--out", "/nonexistent/x"];
    let replay = ["replay", "--trace", &trace, "--config", &config];
    let drive = [
        "drive",
        "--trace",
        &trace,
        "--url",
        "http://127.0.0.1:1",
        "--model",
        "m",
    ];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            cat(&workload, &["--shape", "circles"]),
            "possible values: conversations, bursts, agents, documents",
        ),
        (
            cat(&workload, &["--popularity", "pareto"]),
            "possible values: zipf, uniform",
        ),
        (
            cat(
                &workload,
                &["--shape", "documents", "--burst-size", "16-64"],
            ),
            "--burst-size is a knob of --shape bursts",
        ),
        (
            cat(&workload, &["--shape", "agents", "--think-ms", "10"]),
            "--think-ms is a knob of --shape conversations or bursts",
        ),
        (
            cat(&workload, &["--documents", "10"]),
            "--documents is a knob of --shape documents",
        ),
        (
            cat(&workload, &["--shape", "bursts", "--burst-size", "64-16"]),
            "64 is above 16: a range is LO-HI",
        ),
        (
            cat(&workload, &["--shape", "bursts", "--burst-size", "0-16"]),
            "'--burst-size <LO-HI>': must lie within 1-4096",
        ),
        (
            cat(&workload, &["--shape", "bursts", "--burst-size", "many"]),
            "\"many\" is not a whole number",
        ),
        (
            cat(&workload, &["--shape", "bursts", "--burst-share", "0"]),
            "'--burst-share <BURST_SHARE>': must be above 0 and at most 1",
        ),
        (
            cat(&workload, &["--shape", "bursts", "--burst-window-ms=-1"]),
            "must be a number from 0 to 60000",
        ),
        (
            cat(&workload, &["--shape", "agents", "--subagent-share", "NaN"]),
            "must be a number from 0 to 1",
        ),
        (
            cat(&workload, &["--shape", "agents", "--agent-turns", "1-65"]),
            "must lie within 1-64",
        ),
        (
            cat(&workload, &["--shape", "documents", "--documents", "0"]),
            "0 is not in 1..=100000",
        ),
        (
            cat(
                &workload,
                &[
                    "--shape",
                    "documents",
                    "--document-tokens",
                    "1048576",
                    "--question-tokens",
                    "100",
                ],
            ),
            "a prompt would be 1048676 tokens, above a trace's 1048576",
        ),
        (
            cat(&replay, &["--closed-loop", "0"]),
            "0 is not in 1..=65536",
        ),
        (
            cat(&replay, &["--closed-loop", "65537"]),
            "65537 is not in 1..=65536",
        ),
        (
            cat(&replay, &["--no-kv-events", "--silent-kv-engines", "1"]),
            "'--no-kv-events' cannot be used with '--silent-kv-engines",
        ),
        (
            cat(&replay, &["--silent-kv-engines", "4"]),
            "4 engines without KV events, but the configuration has 3 engines",
        ),
        (
            cat(&drive, &["--closed-loop", "0"]),
            "0 is not in 1..=65536",
        ),
        (
            cat(&drive, &["--closed-loop", "4", "--max-in-flight", "4"]),
            "'--closed-loop <N>' cannot be used with '--max-in-flight",
        ),
    ];
    for (args, expected) in cases {
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// `head`, then `args`.
fn cat<'a>(head: &[&'a str], args: &[&'a str]) -> Vec<&'a str> {
    [head, args].concat()
}
