use super::*;
use crate::report::{Outcome, RunReport};
use crate::workload::SharedPrefixWorkload;
use engine_sim::EngineSpec;
use router_config::{EngineConfig, ModelConfig};

/// A streamed answer served: `uncached` of `prompt` tokens prefilled, then `output`
/// tokens, as an engine prefilling 20,000 tokens a second and decoding 100 would
/// give them, behind 5 ms no token explains.
fn answer(prompt: u64, uncached: u64, output: u64) -> Outcome {
    let ttft_us = 5_000 + uncached * 50;
    Outcome {
        arrived_us: 0,
        prompt_tokens: prompt,
        output_tokens: output,
        engine: Some(0),
        reason: None,
        rejected: false,
        failed: false,
        ttft_us: Some(ttft_us),
        finished_us: Some(ttft_us + (output - 1) * 10_000),
        cached_tokens: prompt - uncached,
    }
}

fn recorded(outcomes: Vec<Outcome>, streamed: bool) -> Recorded {
    let n = outcomes.len();
    Recorded {
        trace: Vec::new(),
        happened: RunReport::new(outcomes, vec!["e0".into()]),
        page_tokens: Some(16),
        not_replayable: 0,
        without_pages: 0,
        without_output: 0,
        streamed: vec![streamed; n],
    }
}

#[test]
fn the_engines_speeds_and_the_delay_no_token_explains_are_recovered() {
    let outcomes = (0..40)
        .map(|i| answer(4_096, 100 * (i + 1), 2 + i % 5))
        .collect();
    let fitted = calibrate(&recorded(outcomes, true)).expect("a fit");
    assert_eq!(fitted.answers, 40);
    assert!(
        (fitted.prefill_tokens_per_sec - 20_000.0).abs() < 1.0,
        "{fitted:?}"
    );
    assert!(
        fitted.intercept.abs_diff(Duration::from_millis(5)) < Duration::from_micros(10),
        "{fitted:?}"
    );
    assert!(
        (fitted.decode_tokens_per_sec.expect("paced") - 100.0).abs() < 0.01,
        "{fitted:?}"
    );
    assert!(fitted.ttft_error < 1e-6, "{fitted:?}");
}

#[test]
fn answers_that_cannot_tell_a_speed_are_refused_by_name() {
    let answers = |n: u64, uncached: fn(u64) -> u64| {
        (0..n)
            .map(|i| answer(4_096, uncached(i), 1))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        calibrate(&recorded(answers(40, |i| 100 * (i + 1)), false)),
        Err(CalibrationError::TooFew(0)),
        "an answer not streamed has no first token"
    );
    assert_eq!(
        calibrate(&recorded(answers(9, |i| 100 * (i + 1)), true)),
        Err(CalibrationError::TooFew(9))
    );
    assert_eq!(
        calibrate(&recorded(answers(20, |_| 512), true)),
        Err(CalibrationError::NoSpread(512))
    );
    let mut falling = answers(20, |i| 100 * (i + 1));
    for (i, outcome) in falling.iter_mut().enumerate() {
        outcome.ttft_us = Some(100_000 - i as u64 * 1_000);
        outcome.finished_us = outcome.ttft_us;
    }
    assert_eq!(
        calibrate(&recorded(falling, true)),
        Err(CalibrationError::NoSlope)
    );
    let fitted = calibrate(&recorded(answers(20, |i| 100 * (i + 1)), true)).expect("a fit");
    assert_eq!(
        fitted.decode_tokens_per_sec, None,
        "one-token answers tell no pace"
    );
}

/// A replay of known engines, read as records, calibrated: the fit recovers the
/// engines, the KV capacity is found again, and the calibrated replay reproduces the
/// recorded TTFT.
#[test]
fn a_replay_read_as_records_is_calibrated_back_to_its_engines() {
    let config = RouterConfig::new(vec![ModelConfig::new(
        "m",
        (0..2)
            .map(|i| EngineConfig::new(format!("e{i}"), format!("http://e{i}.test")))
            .collect(),
    )]);
    let trace = SharedPrefixWorkload {
        requests: 300,
        requests_per_sec: 5.0,
        ..Default::default()
    }
    .generate();
    let truth = ReplaySettings {
        engine: EngineSpec {
            prefill_tokens_per_sec: 8_000.0,
            decode_tokens_per_sec: 50.0,
            kv_capacity_tokens: 1 << 14,
            ..EngineSpec::default()
        },
        first_token_delay: Duration::from_millis(7),
        ..ReplaySettings::default()
    };
    let happened = crate::replay(&config, &trace, None, &truth).expect("a replay");
    let oracle = oracle_cached_tokens(&trace, 16);
    let recorded_summary = happened.summary("recorded", oracle);
    let records = Recorded {
        streamed: vec![true; trace.len()],
        trace: trace.clone(),
        happened,
        page_tokens: Some(16),
        not_replayable: 0,
        without_pages: 0,
        without_output: 0,
    };
    let fitted = calibrate(&records).expect("a fit");
    let within = |got: f64, want: f64, share: f64| (got - want).abs() <= want * share;
    assert!(
        within(fitted.prefill_tokens_per_sec, 8_000.0, 0.05),
        "{fitted:?}"
    );
    assert!(
        within(fitted.decode_tokens_per_sec.expect("paced"), 50.0, 0.05),
        "{fitted:?}"
    );
    let untouched = ReplaySettings::default();
    let calibrated = fitted.apply(&untouched);
    assert!(
        within(calibrated.first_token_delay.as_secs_f64(), 0.007, 0.3),
        "a decode step of the model's own is not delay: {calibrated:?}"
    );
    let (capacity, share) =
        fit_capacity(&config, &trace, &calibrated, recorded_summary.cached_share).expect("replays");
    assert_eq!(capacity, 1 << 14, "share {share} of {recorded_summary:?}");
    let mut calibrated = calibrated;
    calibrated.engine.kv_capacity_tokens = capacity;
    let replayed = crate::replay(&config, &trace, None, &calibrated)
        .expect("a replay")
        .summary("calibrated", oracle);
    assert!(
        within(replayed.ttft_p50_ms, recorded_summary.ttft_p50_ms, 0.15),
        "{replayed:?} against {recorded_summary:?}"
    );
    assert!((replayed.cached_share - recorded_summary.cached_share).abs() <= 0.02);
    let uncalibrated = crate::replay(&config, &trace, None, &untouched)
        .expect("a replay")
        .summary("as given", oracle);
    assert!(
        !within(uncalibrated.ttft_p50_ms, recorded_summary.ttft_p50_ms, 0.15),
        "the default engines do not already agree: {uncalibrated:?}"
    );
}
