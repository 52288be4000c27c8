//! `switchyard demo` end to end: the binary routes a workload and prints its report.

use std::process::Command;

#[test]
fn the_demo_routes_every_request_and_reports_buckets_engines_and_latency() {
    let output = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args([
            "demo",
            "--requests",
            "300",
            "--concurrency",
            "24",
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
        stdout.contains("requests: 300 completed, 0 failed"),
        "{stdout}"
    );
    for line in [
        "demo-chat/short",
        "demo-chat/long",
        "demo-pd/short",
        "demo-pd/long",
        "time to first token: p50",
    ] {
        assert!(stdout.contains(line), "report lists {line}: {stdout}");
    }
    for engine in ["A1", "A2", "A3", "A4", "P1", "P2", "D1", "D2"] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(engine)),
            "report counts engine {engine}: {stdout}"
        );
    }
}

#[test]
fn the_demo_rejects_zero_concurrency() {
    let output = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["demo", "--concurrency", "0"])
        .output()
        .expect("the binary runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--concurrency must be at least 1"));
}
