//! The modelled engine against engine-sim's own, request by request.

use std::sync::Arc;
use std::time::Duration;

use engine_sim::{EngineSpec, Served, SimEngine};
use router_config::{EngineConfig, ModelConfig, RouterConfig};

use super::{HostTier, ReplaySettings};
use crate::trace::{Segment, TraceRequest};

fn request(at_ms: u64, tokens: std::ops::Range<u32>, output_tokens: u32) -> TraceRequest {
    TraceRequest {
        at_us: at_ms * 1000,
        model: None,
        session: None,
        prompt: vec![Segment::Recorded {
            token_ids: tokens.collect(),
        }],
        output_tokens,
    }
}

/// Serves `trace` on engine-sim's engine, each request started at its arrival on a
/// paused clock.
fn served_by_engine_sim(spec: EngineSpec, trace: &[TraceRequest]) -> Vec<Served> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let engine = Arc::new(SimEngine::new(spec));
        let start = tokio::time::Instant::now();
        let tasks: Vec<_> = trace
            .iter()
            .map(|r| {
                let engine = Arc::clone(&engine);
                let (at, tokens, out) = (r.at_us, r.tokens(), u64::from(r.output_tokens));
                tokio::spawn(async move {
                    tokio::time::sleep_until(start + Duration::from_micros(at)).await;
                    engine.serve(tokens, out).await
                })
            })
            .collect();
        let mut served = Vec::new();
        for task in tasks {
            served.push(task.await.unwrap());
        }
        served
    })
}

#[test]
fn a_replayed_engine_serves_as_engine_sim_does() {
    let trace = [
        request(0, 0..160, 3),
        // Shares the first's ten pages, and waits for its prefill turn.
        request(1, 0..200, 2),
        // Waits for one of the two slots.
        request(2, 1000..1100, 1),
        request(3, 2000..2050, 4),
        request(400, 0..230, 2),
    ];
    for serial_prefill in [true, false] {
        let spec = EngineSpec {
            max_running_requests: 2,
            prefill_tokens_per_sec: 1000.0,
            decode_tokens_per_sec: 100.0,
            kv_capacity_tokens: 4096,
            page_size: 16,
            dp_size: 1,
            serial_prefill,
        };
        let config = RouterConfig::new(vec![ModelConfig::new(
            "m",
            vec![EngineConfig::new("e0", "http://127.0.0.1:1")],
        )]);
        let settings = ReplaySettings {
            engine: spec,
            ..ReplaySettings::default()
        };
        let replayed = crate::replay(&config, &trace, Some("round_robin"), &settings).unwrap();
        let served = served_by_engine_sim(spec, &trace);
        let step = spec.decode_time(1);
        for (i, (outcome, served)) in replayed.outcomes.iter().zip(&served).enumerate() {
            let at = Duration::from_micros(outcome.arrived_us);
            assert_eq!(
                (
                    outcome.cached_tokens,
                    outcome.ttft_us.map(Duration::from_micros),
                    outcome.finished_us.map(|f| Duration::from_micros(f) - at),
                ),
                (
                    served.cached_tokens,
                    Some(served.time_to_first_token + step),
                    Some(served.total),
                ),
                "request {i}, serial prefill {serial_prefill}: cached tokens, first token \
                 (one decode step after prefill, as engine-sim streams it), last token"
            );
        }
    }
}

#[test]
fn a_prefix_evicted_from_the_device_is_loaded_back_from_the_host_tier() {
    // Ten pages of device cache: the second prompt evicts the first, which the
    // host tier still holds when it comes again.
    let trace = [
        request(0, 0..160, 1),
        request(200, 1000..1160, 1),
        request(400, 0..160, 1),
    ];
    let spec = EngineSpec {
        max_running_requests: 2,
        prefill_tokens_per_sec: 1000.0,
        decode_tokens_per_sec: 100.0,
        kv_capacity_tokens: 160,
        page_size: 16,
        dp_size: 1,
        serial_prefill: false,
    };
    let config = RouterConfig::new(vec![ModelConfig::new(
        "m",
        vec![EngineConfig::new("e0", "http://127.0.0.1:1")],
    )]);
    // cache_aware keeps a prefix index, which must apply every event of both tiers
    // (a skipped one fails the replay).
    let third = |host_tier: HostTier| {
        let settings = ReplaySettings {
            engine: spec,
            host_tier,
            ..ReplaySettings::default()
        };
        let thirds: Vec<(u64, Option<u64>)> = ["round_robin", "cache_aware"]
            .into_iter()
            .map(|policy| {
                let report = crate::replay(&config, &trace, Some(policy), &settings).unwrap();
                let outcome = &report.outcomes[2];
                (outcome.cached_tokens, outcome.ttft_us)
            })
            .collect();
        assert_eq!(thirds[0], thirds[1], "one engine: the policies agree");
        thirds[0]
    };
    assert_eq!(
        third(HostTier::default()),
        (0, Some(170_000)),
        "without a host tier: prefilled again (160 ms), then one decode step"
    );
    assert_eq!(
        third(HostTier {
            pages: 100,
            load_cost: 0.5
        }),
        (160, Some(90_000)),
        "with one: loaded back at half the prefill time, and reported cached"
    );
}
