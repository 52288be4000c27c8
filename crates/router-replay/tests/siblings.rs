//! The siblings of a new prefix: scattered while the first one's engine has not
//! announced it, kept together when the router counts its pending pages.

use router_replay::{
    BurstWorkload, ReplaySettings, RunReport, TraceRequest, replay, siblings_on_first_engine,
};

use crate::common::{fleet, settings};

/// `cache_aware` without a load bound, so that only the prefix decides.
const UNBOUNDED: &str = "    policies: {plain: {type: cache_aware, load_bound: null}}\n";

fn siblings(extra: &str, trace: &[TraceRequest], settings: &ReplaySettings) -> f64 {
    let config = fleet(4, &format!("{UNBOUNDED}{extra}"));
    let report: RunReport = replay(&config, trace, None, settings).unwrap();
    siblings_on_first_engine(trace, &report).expect("the bursts have siblings")
}

#[test]
fn pending_pages_keep_a_new_prefixs_siblings_on_the_first_ones_engine() {
    let trace = BurstWorkload {
        requests: 600,
        requests_per_sec: 20.0,
        ..BurstWorkload::default()
    }
    .generate();
    let settings = settings();
    let scattered = siblings("", &trace, &settings);
    let together = siblings("    routed_pages: {pending_ms: 2000}\n", &trace, &settings);
    assert!(
        together >= 0.9,
        "with pending pages, {together:.2} of the siblings followed the first"
    );
    assert!(
        scattered < 0.5,
        "without them the siblings scatter: {scattered:.2} followed the first"
    );
}
