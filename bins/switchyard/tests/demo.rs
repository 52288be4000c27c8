//! `switchyard demo` end to end: engines, router and workload in one process.

use std::process::Command;

#[test]
fn the_demo_routes_a_multi_turn_workload_and_reports_it() {
    let report = crate::common::TempFile::new("");
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
            "--compare-requests",
            "1500",
            "--report",
        ])
        .arg(&report.0)
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
        // Each later turn waits until the router has indexed the turns before it.
        "cache_hit",
    ] {
        assert!(stdout.contains(line), "the report has {line}: {stdout}");
    }
    // Which engines of a group are picked depends on timing (the prefix cache,
    // power-of-two samples); how many picks each stage made does not.
    let picks = |section: &str, prefix: &str| -> u64 {
        stdout
            .split(section)
            .nth(1)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .map(str::trim_start)
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum()
    };
    let (chat, pd) = (
        picks("picks by bucket:", "demo-chat/"),
        picks("picks by bucket:", "demo-pd/"),
    );
    assert_eq!(chat + pd, 60, "every request picked once: {stdout}");
    assert!(chat > 0 && pd > 0, "both models served: {stdout}");
    assert_eq!(picks("picks by engine:", "A"), chat, "{stdout}");
    assert_eq!(picks("picks by engine:", "P"), pd, "{stdout}");
    assert_eq!(picks("picks by engine:", "D"), pd, "{stdout}");
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
    // The policies compared: a bar each, for each metric, with its value.
    let comparison = stdout
        .split("policy comparison, replayed: 1500 requests")
        .nth(1)
        .expect("a policy comparison");
    for metric in [
        "time to first token, p50 (lower is better):",
        "prompt tokens found cached (higher is better):",
        "engine load spread, max/min (1 is even):",
    ] {
        let bars: Vec<&str> = comparison
            .split(metric)
            .nth(1)
            .unwrap_or_else(|| panic!("{metric} in {comparison}"))
            .lines()
            .skip(1)
            .take(3)
            .collect();
        for (bar, policy) in bars
            .iter()
            .zip(["round_robin", "power_of_two", "cache_aware"])
        {
            assert!(
                bar.trim_start().starts_with(policy) && bar.contains('#'),
                "{metric}: {bar}"
            );
        }
    }
    let html = std::fs::read_to_string(&report.0).expect("the HTML report");
    assert!(
        html.contains("requests: 60 completed") && html.matches("<svg").count() == 4,
        "{html}"
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
