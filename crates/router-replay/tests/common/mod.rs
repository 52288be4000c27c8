//! What the tests share: a fleet configuration and the engines it is modelled as.

use engine_sim::EngineSpec;
use router_config::RouterConfig;
use router_replay::ReplaySettings;

/// A configuration of `engines` plain engines of model `m`, with `extra` YAML for the
/// model appended (its buckets, say).
pub(crate) fn fleet(engines: usize, extra: &str) -> RouterConfig {
    let mut yaml = String::from("models:\n  - id: m\n    block_size: 16\n    engines:\n");
    for i in 0..engines {
        yaml.push_str(&format!(
            "      - {{id: e{i}, url: 'http://127.0.0.1:{}', role: plain}}\n",
            i + 1
        ));
    }
    yaml.push_str(extra);
    RouterConfig::from_yaml(&yaml).expect("a valid configuration")
}

/// Engines with shared prefill, small caches and slow decode: routing shows.
pub(crate) fn settings() -> ReplaySettings {
    ReplaySettings {
        engine: EngineSpec {
            max_running_requests: 16,
            prefill_tokens_per_sec: 20_000.0,
            decode_tokens_per_sec: 100.0,
            kv_capacity_tokens: 32_768,
            page_size: 16,
            dp_size: 1,
            serial_prefill: true,
        },
        ..ReplaySettings::default()
    }
}
