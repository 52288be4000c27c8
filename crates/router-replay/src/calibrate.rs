//! The engine model fitted to what decision records say happened, so that a replay of
//! recorded traffic reproduces its times before it is trusted with another
//! configuration.
//!
//! From the streamed answers served (whose first byte is their first token):
//!
//! - **prefill speed and first-token delay**: a least-squares line through each
//!   answer's time to first token against its uncached prompt tokens (prompt less the
//!   cached tokens its engine reported). The slope is the time a token takes to
//!   prefill; the intercept, less the decode step the engine model puts before a first
//!   token, is time the model does not hold (the router, HTTP, the engine's front
//!   end), and becomes the replay's
//!   [`first_token_delay`](crate::ReplaySettings::first_token_delay). Queueing counts
//!   as prefill here: records of a fleet under light load fit best.
//! - **decode pace**: the median, over answers of at least two output tokens, of the
//!   time from the first token to the last over the tokens after the first.
//! - **KV capacity** ([`fit_capacity`]): the smallest per-rank capacity, a power of
//!   two, whose replay finds as much of the prompts cached as the engines reported.

use std::time::Duration;

use router_config::RouterConfig;

use crate::error::ReplayError;
use crate::records::Recorded;
use crate::report::oracle_cached_tokens;
use crate::sim::{MAX_FIRST_TOKEN_DELAY, MAX_RATE, MIN_RATE, ReplaySettings};
use crate::trace::TraceRequest;

/// Fewest streamed answers a calibration reads.
pub const MIN_CALIBRATION_ANSWERS: usize = 10;

/// What [`calibrate`] fitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// Streamed answers served that the fit read.
    pub answers: usize,
    /// Uncached prompt tokens prefilled a second.
    pub prefill_tokens_per_sec: f64,
    /// The fitted line's intercept: time to first token no prompt token explains.
    pub intercept: Duration,
    /// Output tokens a second, when some answer had two or more.
    pub decode_tokens_per_sec: Option<f64>,
    /// The fit's error: the median, over the answers read, of how far the line's time
    /// to first token is from the recorded one, as a share of the recorded one.
    pub ttft_error: f64,
}

impl Calibration {
    /// `settings` with the fitted prefill speed, decode pace (when fitted) and
    /// first-token delay: the intercept less the decode step the engine model puts
    /// before a first token.
    pub fn apply(&self, settings: &ReplaySettings) -> ReplaySettings {
        let mut fitted = *settings;
        fitted.engine.prefill_tokens_per_sec = self.prefill_tokens_per_sec;
        if let Some(decode) = self.decode_tokens_per_sec {
            fitted.engine.decode_tokens_per_sec = decode;
        }
        fitted.first_token_delay = self
            .intercept
            .saturating_sub(fitted.engine.decode_time(1))
            .min(MAX_FIRST_TOKEN_DELAY);
        fitted
    }
}

/// Why records could not be calibrated from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CalibrationError {
    /// Too few streamed answers.
    #[error(
        "{0} streamed answers served with a first token: calibration needs at least {MIN_CALIBRATION_ANSWERS} (only a streamed answer's first byte is its first token)"
    )]
    TooFew(usize),
    /// Every answer had as many uncached tokens.
    #[error(
        "every streamed answer had {0} uncached prompt tokens: prefill speed cannot be told from them"
    )]
    NoSpread(u64),
    /// Longer uncached prompts did not take longer.
    #[error(
        "the first token came no later for longer uncached prompts: prefill speed cannot be fitted (a fleet too loaded, or answers too few)"
    )]
    NoSlope,
}

/// Fits prefill speed, decode pace and first-token delay to `recorded` (see the
/// module documentation).
///
/// # Errors
/// See [`CalibrationError`].
pub fn calibrate(recorded: &Recorded) -> Result<Calibration, CalibrationError> {
    // (uncached prompt tokens, seconds to first token, seconds a later token)
    let mut answers: Vec<(f64, f64, Option<f64>)> = Vec::new();
    for (i, outcome) in recorded.happened.outcomes().iter().enumerate() {
        let (Some(ttft), Some(finished), true) = (
            outcome.ttft_us,
            outcome.finished_us,
            recorded.streamed.get(i).copied().unwrap_or(false),
        ) else {
            continue;
        };
        if outcome.rejected || outcome.failed {
            continue;
        }
        let uncached = outcome.prompt_tokens.saturating_sub(outcome.cached_tokens);
        let first = outcome.arrived_us.saturating_add(ttft);
        let pace = (outcome.output_tokens >= 2).then(|| {
            finished.saturating_sub(first) as f64 / 1e6 / (outcome.output_tokens - 1) as f64
        });
        answers.push((uncached as f64, ttft as f64 / 1e6, pace));
    }
    if answers.len() < MIN_CALIBRATION_ANSWERS {
        return Err(CalibrationError::TooFew(answers.len()));
    }
    let n = answers.len() as f64;
    let mean_x = answers.iter().map(|a| a.0).sum::<f64>() / n;
    let mean_y = answers.iter().map(|a| a.1).sum::<f64>() / n;
    let var_x = answers.iter().map(|a| (a.0 - mean_x).powi(2)).sum::<f64>();
    if var_x == 0.0 {
        return Err(CalibrationError::NoSpread(mean_x as u64));
    }
    let cov = answers
        .iter()
        .map(|a| (a.0 - mean_x) * (a.1 - mean_y))
        .sum::<f64>();
    let per_token = cov / var_x;
    if per_token.is_nan() || per_token <= 0.0 {
        return Err(CalibrationError::NoSlope);
    }
    let prefill = (1.0 / per_token).clamp(MIN_RATE, MAX_RATE);
    let intercept = (mean_y - mean_x / prefill).max(0.0);
    let mut errors: Vec<f64> = answers
        .iter()
        .filter(|a| a.1 > 0.0)
        .map(|a| ((intercept + a.0 / prefill) - a.1).abs() / a.1)
        .collect();
    let mut paces: Vec<f64> = answers.iter().filter_map(|a| a.2).collect();
    let decode = median(&mut paces)
        .filter(|pace| *pace > 0.0)
        .map(|pace| (1.0 / pace).clamp(MIN_RATE, MAX_RATE));
    Ok(Calibration {
        answers: answers.len(),
        prefill_tokens_per_sec: prefill,
        intercept: Duration::from_secs_f64(intercept).min(MAX_FIRST_TOKEN_DELAY),
        decode_tokens_per_sec: decode,
        ttft_error: median(&mut errors).unwrap_or(0.0),
    })
}

/// The median of `values` (reordered), if any.
fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

/// The smallest and largest per-rank KV capacities [`fit_capacity`] tries, tokens.
pub const CAPACITY_RANGE: (u64, u64) = (1 << 10, 1 << 26);

/// The KV capacity a rank is given for `trace` under `config`: of the powers of two
/// in [`CAPACITY_RANGE`] (and at least a page), the smallest whose replay finds
/// cached at least `recorded_share` of the prompt tokens less half a point, or, when
/// none does, the one that comes closest. Returns it with its replay's cached share.
///
/// # Errors
/// What [`replay`](crate::replay) returns.
pub fn fit_capacity(
    config: &RouterConfig,
    trace: &[TraceRequest],
    settings: &ReplaySettings,
    recorded_share: f64,
) -> Result<(u64, f64), ReplayError> {
    let page = u64::from(settings.engine.page_size);
    let oracle = oracle_cached_tokens(trace, settings.engine.page_size);
    let share_at = |capacity: u64| -> Result<f64, ReplayError> {
        let mut tried = *settings;
        tried.engine.kv_capacity_tokens = capacity;
        Ok(crate::replay(config, trace, None, &tried)?
            .summary("capacity", oracle)
            .cached_share)
    };
    let enough = |share: f64| share >= recorded_share - 0.005;
    let mut capacity = CAPACITY_RANGE.0.max(page).next_power_of_two();
    // At least one capacity is tried, however large a page.
    let largest = CAPACITY_RANGE.1.max(capacity);
    let mut best = (capacity, share_at(capacity)?);
    while !enough(best.1) && capacity < largest {
        capacity *= 2;
        let share = share_at(capacity)?;
        if enough(share) || (share - recorded_share).abs() < (best.1 - recorded_share).abs() {
            best = (capacity, share);
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests;
