//! `switchyard demo` end to end: engines, router and workload in one process.

use std::process::Command;

#[test]
fn the_demo_routes_a_multi_turn_workload_and_reports_it() {
    let output = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args([
            "demo",
            "--conversations",
            "20",
            "--turns",
            "3",
            "--concurrency",
            "8",
            "--seed",
            "3",
        ])
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("requests: 60 completed, 0 failed"),
        "{stdout}"
    );
    for line in [
        "demo-chat/short",
        "demo-pd/",
        "prompt tokens:",
        "time to first token: p50",
        "picks by reason (router metrics):",
        "cache_hit",
    ] {
        assert!(stdout.contains(line), "the report has {line}: {stdout}");
    }
    for engine in ["A1", "A2", "P1", "D1"] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(engine)),
            "picks of {engine}: {stdout}"
        );
    }
    let cached: u64 = stdout
        .lines()
        .find_map(|l| l.split("of which cached at the engines: ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a cached-token count");
    assert!(
        cached > 0,
        "later turns reuse the engines' prefix caches: {stdout}"
    );
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("[##############################] 60/60 requests")
    );
}

#[test]
fn the_demo_rejects_zero_concurrency() {
    let output = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["demo", "--concurrency", "0"])
        .output()
        .expect("the binary runs");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("--concurrency and --turns must be at least 1")
    );
}
