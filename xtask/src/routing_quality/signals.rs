//! The sharper signals' experiments, replayed on the benchmark's trace: how
//! `slower_tier_weight` does when engines offload to a host tier, at loading costs
//! from a tenth to all of a recompute, and what a lagging KV feed costs.

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

/// The weights compared at loading cost `cost`: the default (a host copy as good as
/// a device one), a half, and one less the cost (what the copy saves).
fn weights(cost: f64) -> Vec<f64> {
    let mut weights = vec![1.0, 0.5, 1.0 - cost];
    weights.dedup_by(|a, b| (*a - *b).abs() < 1e-9);
    weights
}

/// Runs the experiments over `trace` and prints their tables.
pub(super) fn run(binary: &Path, dir: &Path, trace: &Path) -> anyhow::Result<()> {
    let urls: Vec<String> = (0..ENGINES)
        .map(|i| format!("http://127.0.0.1:{}", i + 1))
        .collect();
    let mut tiered = Vec::new();
    for &cost in LOAD_COSTS {
        for weight in weights(cost) {
            let mut config = router_config(&urls, None, Some("cache_aware"));
            config["models"][0]["policies"]["plain"]["slower_tier_weight"] = weight.into();
            let fleet = dir.join(format!("fleet-weight-{weight}.yaml"));
            std::fs::write(&fleet, config.to_string())?;
            let json = dir.join(format!("tier-{cost}-{weight}.json"));
            let label = format!("cost {cost}, weight {weight}");
            replay(binary, &label, trace, &fleet, &json, |c| {
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
    for (delay, label) in [("0", "fresh feeds"), ("2000", "2 of 8 feeds 2 s behind")] {
        let json = dir.join(format!("lag-{delay}.json"));
        replay(binary, label, trace, &fleet, &json, |c| {
            c.args(TIMING_FLAGS)
                .args(CACHE_FLAGS)
                .args(["--policies", "cache_aware", "--lagging-feeds", "2"])
                .args(["--lagging-delay-ms", delay])
        })?;
        lagging.extend(labelled(&json, label)?);
    }
    println!("\nlagging KV feeds: cache_aware");
    print_table(&lagging);
    Ok(())
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
