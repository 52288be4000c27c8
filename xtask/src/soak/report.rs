//! The soak's final report: outcome counts, in-flight counts after the drain, RSS by
//! minute, and the pass criteria checked against them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;

use super::load::{Class, Kind};
use super::{DRAIN, RSS_GROWTH};

/// What the soak measured.
pub(crate) struct Report {
    pub(crate) minutes: u32,
    /// The router's RSS in KiB at the end of each minute.
    pub(crate) rss: Vec<u64>,
    /// The router's RSS in KiB after the drain.
    pub(crate) final_rss: Option<u64>,
    pub(crate) outcomes: Vec<(Kind, String, Class, u64)>,
    /// Clients still waiting when the drain deadline passed.
    pub(crate) stuck_clients: usize,
    /// Every engine's in-flight count after the drain, and how long it took.
    pub(crate) in_flight: BTreeMap<String, i64>,
    pub(crate) drained_in: Option<Duration>,
    /// Clean engines (no fault injected) ever held out by their breaker.
    pub(crate) ejected_clean: BTreeSet<String>,
}

/// The status of an outcome: its first word when that is a status code, else
/// `client error` or `no status`.
fn status_of(outcome: &str) -> &str {
    match outcome.split_whitespace().next() {
        Some(code) if code.parse::<u16>().is_ok() => code,
        _ if outcome.starts_with("client:") => "client error",
        _ => "no status",
    }
}

/// Request counts by status, e.g. `1200 requests: 200 x 1100, 502 x 100`.
pub(crate) fn by_status(outcomes: &[(Kind, String, Class, u64)]) -> String {
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for (kind, outcome, _, n) in outcomes {
        if *kind != Kind::Admin {
            *counts.entry(status_of(outcome)).or_default() += n;
        }
    }
    let total: u64 = counts.values().sum();
    let parts: Vec<String> = counts.iter().map(|(s, n)| format!("{s} x {n}")).collect();
    format!("{total} requests: {}", parts.join(", "))
}

/// Prints the final report and fails on any unmet criterion.
pub(crate) fn verdict(report: &Report, panicked: &[PathBuf]) -> anyhow::Result<()> {
    println!("\nOutcomes ({} min):\n", report.minutes);
    println!("| requests | outcome | class | count |");
    println!("|---|---|---|---|");
    for (kind, outcome, class, n) in &report.outcomes {
        println!("| {} | {outcome} | {} | {n} |", kind.label(), class.label());
    }
    println!("\nBy status: {}", by_status(&report.outcomes));
    let mut failures = Vec::new();
    let unexpected: u64 = report
        .outcomes
        .iter()
        .filter(|(_, _, class, _)| *class == Class::Unexpected)
        .map(|(.., n)| n)
        .sum();
    if unexpected > 0 {
        failures.push(format!("{unexpected} unexpected outcome(s)"));
    }
    if report.stuck_clients > 0 {
        failures.push(format!(
            "{} client(s) still waiting after the load stopped",
            report.stuck_clients
        ));
    }
    let in_flight: Vec<String> = report
        .in_flight
        .iter()
        .map(|(engine, n)| format!("{engine} {n}"))
        .collect();
    println!("Final in flight: {}", in_flight.join(", "));
    match report.drained_in {
        Some(took) => println!("Drained in {:.1} s", took.as_secs_f64()),
        None => failures.push(format!(
            "in-flight counts not all 0 after {} s: {}",
            DRAIN.as_secs(),
            in_flight.join(", ")
        )),
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    let minutes: Vec<String> = report
        .rss
        .iter()
        .enumerate()
        .map(|(i, kib)| format!("{}: {:.1}", i + 1, mib(*kib)))
        .collect();
    println!("RSS by minute (MiB): {}", minutes.join(", "));
    let baseline = report.rss.get(1).or(report.rss.first()).copied();
    match (baseline, report.final_rss) {
        (Some(baseline), Some(last)) => {
            println!(
                "RSS after the drain {:.1} MiB, {:.3}x minute {}",
                mib(last),
                last as f64 / baseline as f64,
                if report.rss.len() > 1 { 2 } else { 1 }
            );
            if last as f64 > baseline as f64 * RSS_GROWTH {
                failures.push(format!(
                    "RSS grew from {:.1} MiB to {:.1} MiB (over {RSS_GROWTH}x)",
                    mib(baseline),
                    mib(last)
                ));
            }
        }
        _ => failures.push("the router exited before the end".into()),
    }
    if !report.ejected_clean.is_empty() {
        failures.push(format!(
            "healthy engines held out by their breaker: {:?}",
            report.ejected_clean
        ));
    } else {
        println!("No healthy engine's breaker opened");
    }
    for path in panicked {
        failures.push(format!("a panic in {}", path.display()));
    }
    if failures.is_empty() {
        println!("\nsoak PASSED");
        return Ok(());
    }
    for failure in &failures {
        println!("FAIL: {failure}");
    }
    bail!("soak failed: {}", failures.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_counted_by_their_status() {
        assert_eq!(status_of("502 upstream_error"), "502");
        assert_eq!(status_of("200 stream cut on E1"), "200");
        assert_eq!(status_of("client: connect failed: refused"), "client error");
        assert_eq!(status_of("no status: closed"), "no status");
        let outcomes = [
            (Kind::Json, "200".to_owned(), Class::Ok, 3),
            (
                Kind::Stream,
                "200 stream cut on E1".to_owned(),
                Class::Fault,
                2,
            ),
            (
                Kind::Stream,
                "504 upstream_timeout".to_owned(),
                Class::Fault,
                1,
            ),
            (Kind::Admin, "POST /workers 201".to_owned(), Class::Ok, 9),
        ];
        assert_eq!(by_status(&outcomes), "6 requests: 200 x 5, 504 x 1");
    }
}
