//! The sharper signals' experiments, replayed on the benchmark's trace: how
//! `slower_tier_weight` does when engines offload to a host tier, at loading costs
//! from a tenth to all of a recompute; what a lagging KV feed costs; and buckets by
//! prompt length whose short bucket has a time-to-first-token target, against
//! spilling by an admission cap.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use super::{
    CACHE_FLAGS, ENGINES, SLOTS, TIMING_FLAGS, print_table, read_summaries, router_config,
    run_binary,
};

/// The benchmark's engines with half the device cache, so pages leave the device
/// often, and a host tier of 65,536 pages (a million tokens, 32 times the device's).
const TIERED_CACHE_FLAGS: &[&str] = &[
    "--kv-capacity-tokens",
    "32768",
    "--host-tier-pages",
    "65536",
];
/// Loading a host page back, as a share of prefilling it.
const LOAD_COSTS: &[f64] = &[0.1, 0.5, 1.0];

/// The weights compared: the default (a host copy as good as a device one) and
/// lower ones.
const WEIGHTS: &[f64] = &[1.0, 0.75, 0.5, 0.0];

/// Runs the experiments over `trace` and prints their tables.
pub(super) fn run(binary: &Path, dir: &Path, trace: &Path) -> anyhow::Result<()> {
    let urls: Vec<String> = (0..ENGINES)
        .map(|i| format!("http://127.0.0.1:{}", i + 1))
        .collect();
    let mut weighted = Vec::new();
    for &weight in WEIGHTS {
        let mut config = router_config(&urls, None, Some("cache_aware"));
        config["models"][0]["policies"]["plain"]["slower_tier_weight"] = weight.into();
        let fleet = dir.join(format!("fleet-weight-{weight}.yaml"));
        std::fs::write(&fleet, config.to_string())?;
        weighted.push((weight, fleet));
    }
    let mut tiered = Vec::new();
    for &cost in LOAD_COSTS {
        for (weight, fleet) in &weighted {
            let json = dir.join(format!("tier-{cost}-{weight}.json"));
            let label = format!("cost {cost}, weight {weight}");
            replay(binary, &label, trace, fleet, &json, |c| {
                c.args(TIMING_FLAGS)
                    .args(TIERED_CACHE_FLAGS)
                    .args(["--host-load-cost", &cost.to_string()])
            })?;
            tiered.extend(labelled(&json, &label)?);
        }
    }
    println!("\nhost tier: cache_aware by loading cost and slower_tier_weight");
    print_table(&tiered);

    let fleet = dir.join("fleet.yaml");
    let mut lagging = Vec::new();
    for (lag, label) in [
        (None, "fresh feeds"),
        (Some("2000"), "2 of 8 feeds 2 s behind"),
    ] {
        let json = dir.join(format!("lag-{}.json", lag.unwrap_or("0")));
        replay(binary, label, trace, &fleet, &json, |c| {
            c.args(TIMING_FLAGS)
                .args(CACHE_FLAGS)
                .args(["--policies", "cache_aware"]);
            if let Some(delay) = lag {
                c.args(["--lagging-feeds", "2", "--lagging-delay-ms", delay]);
            }
            c
        })?;
        lagging.extend(labelled(&json, label)?);
    }
    println!("\nlagging KV feeds: cache_aware");
    print_table(&lagging);

    let mut buckets = Vec::new();
    for (label, short) in SHORT_BUCKETS {
        let mut config = router_config(&urls, None, None);
        config["models"][0]["buckets"] = length_buckets(&short);
        let name = label.replace([' ', ','], "-");
        let fleet = dir.join(format!("fleet-{name}.yaml"));
        std::fs::write(&fleet, config.to_string())?;
        let json = dir.join(format!("buckets-{name}.json"));
        replay(binary, label, trace, &fleet, &json, |c| {
            c.args(TIMING_FLAGS).args(CACHE_FLAGS)
        })?;
        buckets.extend(labelled(&json, label)?);
    }
    println!("\nbuckets by length: prompts up to 3,000 tokens on 4 engines, the rest on 4");
    print_table(&buckets);
    Ok(())
}

/// What the short bucket has: nothing, an admission cap on waiting requests, or a
/// time-to-first-token target.
enum Short {
    Nothing,
    MaxWaiting(u64),
    TtftMs(u64),
}

/// The short bucket's settings compared.
const SHORT_BUCKETS: [(&str, Short); 6] = [
    ("short: nothing", Short::Nothing),
    ("short: max 2 waiting", Short::MaxWaiting(2)),
    ("short: max 4 waiting", Short::MaxWaiting(4)),
    ("short: ttft_ms 100", Short::TtftMs(100)),
    ("short: ttft_ms 200", Short::TtftMs(200)),
    ("short: ttft_ms 500", Short::TtftMs(500)),
];

/// Two cache-aware buckets: `short` (prompts up to 3,000 tokens, engines e0-e3, with
/// `short`'s cap or target) and `long` (every prompt, e4-e7).
fn length_buckets(short: &Short) -> Value {
    let mut policy = serde_json::json!({"type": "cache_aware"});
    if let Short::MaxWaiting(cap) = short {
        policy["admission"] = serde_json::json!({"max_waiting_requests": cap});
    }
    let ids =
        |range: std::ops::Range<usize>| -> Vec<String> { range.map(|i| format!("e{i}")).collect() };
    let mut first = serde_json::json!({
        "id": "short",
        "limits": {"max": 3000},
        "groups": {"plain": {"engine_ids": ids(0..4), "policy": policy}},
    });
    if let Short::TtftMs(ttft) = short {
        first["slo"] = serde_json::json!({"ttft_ms": ttft});
    }
    serde_json::json!([
        first,
        {"id": "long", "groups": {"plain": {"engine_ids": ids(4..8), "policy": {"type": "cache_aware"}}}},
    ])
}

fn replay(
    binary: &Path,
    label: &str,
    trace: &Path,
    fleet: &Path,
    json: &Path,
    flags: impl FnOnce(&mut Command) -> &mut Command,
) -> anyhow::Result<()> {
    let mut command = Command::new(binary);
    command
        .args(["replay", "--trace"])
        .arg(trace)
        .arg("--config")
        .arg(fleet)
        .args(["--slots", SLOTS])
        .arg("--json")
        .arg(json)
        .stdout(Stdio::null());
    run_binary(&format!("replay: {label}"), flags(&mut command))
}

/// The summaries in `json`, each named `label` in place of its policy.
fn labelled(json: &Path, label: &str) -> anyhow::Result<Vec<Value>> {
    let mut summaries = read_summaries(json)?;
    for summary in &mut summaries {
        summary["policy"] = label.into();
    }
    Ok(summaries)
}
