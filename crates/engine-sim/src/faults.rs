//! Faults a test can switch on at start (flags) or at runtime (`POST /admin/faults`),
//! and the set in force, which the engine model and its server share: the model acts
//! on the publisher restart, the server (`server::faults`) on the rest.

use parking_lot::{Mutex, MutexGuard};
use serde::{Deserialize, Serialize};

/// The fault set. `POST /admin/faults` replaces it whole: fields left out are off.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Fraction of chat requests answered with HTTP 500 (0 to 1).
    #[cfg_attr(feature = "server", arg(long, default_value_t = 0.0))]
    pub error_rate: f64,
    /// The status of the errors `error_rate` draws (500 when unset; 429 and 503 say
    /// the engine did not start the request).
    #[cfg_attr(feature = "server", arg(long))]
    pub error_status: Option<u16>,
    /// Answer 500 to every chat request whose body holds this text, as a real engine
    /// fails on some inputs (whatever `error_rate` draws).
    #[cfg_attr(feature = "server", arg(long))]
    pub error_on: Option<String>,
    /// Accept chat requests but never send a byte.
    #[cfg_attr(feature = "server", arg(long))]
    pub hang_before_first_byte: bool,
    /// Hold chat responses while set: at 0 a request waits before its answer begins,
    /// at N a stream waits before its chunk N+1. Clearing it (or raising N) releases
    /// them to the faults then in force, so a test can stop an answer at a known point
    /// and then choose how it goes on.
    #[cfg_attr(feature = "server", arg(long))]
    pub hold_after_chunks: Option<u32>,
    /// Hold answers that are not streamed once they are generated (after any PD
    /// hand-over), while set.
    #[cfg_attr(feature = "server", arg(long))]
    pub hold_whole_answers: bool,
    /// Cut streamed responses (closing the connection) after this many chunks.
    #[cfg_attr(feature = "server", arg(long))]
    pub disconnect_after_chunks: Option<u32>,
    /// Extra delay before the first byte of every chat response, in milliseconds.
    #[cfg_attr(feature = "server", arg(long, default_value_t = 0))]
    pub slow_start_ms: u64,
    /// Answer GET /health with 503.
    #[cfg_attr(feature = "server", arg(long))]
    pub fail_health: bool,
    /// Close the HTTP listener so connections are refused.
    #[cfg_attr(feature = "server", arg(long))]
    pub refuse_connections: bool,
    /// Leave the next K KV-event batches out of the live stream (a sequence gap);
    /// they stay in the replay buffer.
    #[cfg_attr(feature = "server", arg(long, default_value_t = 0))]
    pub drop_event_batches: u32,
    /// Restart the KV-event publisher (sequence back to 0, cache and replay buffer
    /// emptied, as after an engine restart) once this many batches were published.
    #[cfg_attr(feature = "server", arg(long))]
    pub restart_publisher_after_batches: Option<u64>,
    /// Stamp KV-event batches this many milliseconds before they are published, as a
    /// publisher that lags behind its engine does.
    #[cfg_attr(feature = "server", arg(long, default_value_t = 0))]
    pub event_clock_behind_ms: u64,
}

impl FaultConfig {
    /// Checks ranges.
    ///
    /// # Errors
    /// A message naming the setting at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.error_status.is_some_and(|s| !(400..=599).contains(&s)) {
            return Err(format!(
                "error_status must be an HTTP error status (400 to 599), got {}",
                self.error_status.unwrap_or_default()
            ));
        }
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err(format!(
                "error_rate must be between 0 and 1, got {}",
                self.error_rate
            ));
        }
        Ok(())
    }
}

/// The fault set in force in one engine: its model and its server share it, and the
/// server replaces it whole.
#[derive(Debug)]
pub(crate) struct FaultSet {
    config: Mutex<FaultConfig>,
}

impl FaultSet {
    pub(crate) fn new(config: FaultConfig) -> Self {
        Self {
            config: Mutex::new(config),
        }
    }

    /// The fault set, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, FaultConfig> {
        self.config.lock()
    }

    /// Whether the publisher restarts now, having published `published` batches;
    /// the fault fires once.
    pub(crate) fn take_restart(&self, published: u64) -> bool {
        let mut config = self.lock();
        if config
            .restart_publisher_after_batches
            .is_some_and(|n| published >= n)
        {
            config.restart_publisher_after_batches = None;
            return true;
        }
        false
    }
}
