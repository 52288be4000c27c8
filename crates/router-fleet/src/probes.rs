//! How many health probes a round lets out at once.

use std::time::Duration;

/// The fewest engine probes (with the reads a passing probe brings) a round lets out
/// at once; a spread round lets out more when its engines' timeouts need them
/// ([`probes_at_once`]).
pub const MIN_PROBES_AT_ONCE: usize = 32;

/// How many of a round's probes of `engines` engines, spread over `over`, may be out
/// at once: enough that the probes started within any `timeout` fit, so engines that
/// never answer (each holding a place for `timeout`) do not hold back the probes of
/// the others past their turn; at least [`MIN_PROBES_AT_ONCE`], at most one an
/// engine. A round not spread (`over` zero) lets out [`MIN_PROBES_AT_ONCE`].
pub fn probes_at_once(engines: usize, timeout: Duration, over: Duration) -> usize {
    let needed = if over.is_zero() {
        0
    } else {
        // The probes started within one timeout, and the one just starting.
        let started = engines as f64 * timeout.as_secs_f64() / over.as_secs_f64();
        (started.ceil() as usize).saturating_add(1)
    };
    needed.max(MIN_PROBES_AT_ONCE).min(engines.max(1))
}
