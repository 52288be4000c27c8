//! Faults a test can switch on at start (flags) or at runtime (`POST /admin/faults`).

use axum::http::StatusCode;
use parking_lot::Mutex;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The fault set. `POST /admin/faults` replaces it whole: fields left out are off.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Fraction of chat requests answered with HTTP 500 (0 to 1).
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// The status of the errors `error_rate` draws (500 when unset; 429 and 503 say
    /// the engine did not start the request).
    #[arg(long)]
    pub error_status: Option<u16>,
    /// Accept chat requests but never send a byte.
    #[arg(long)]
    pub hang_before_first_byte: bool,
    /// Hold chat responses while set: at 0 a request waits before its answer begins,
    /// at N a stream waits before its chunk N+1. Clearing it (or raising N) releases
    /// them to the faults then in force, so a test can stop an answer at a known point
    /// and then choose how it goes on.
    #[arg(long)]
    pub hold_after_chunks: Option<u32>,
    /// Cut streamed responses (closing the connection) after this many chunks.
    #[arg(long)]
    pub disconnect_after_chunks: Option<u32>,
    /// Extra delay before the first byte of every chat response, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub slow_start_ms: u64,
    /// Answer GET /health with 503.
    #[arg(long)]
    pub fail_health: bool,
    /// Close the HTTP listener so connections are refused.
    #[arg(long)]
    pub refuse_connections: bool,
    /// Leave the next K KV-event batches out of the live stream (a sequence gap);
    /// they stay in the replay buffer.
    #[arg(long, default_value_t = 0)]
    pub drop_event_batches: u32,
    /// Restart the KV-event publisher (sequence back to 0, cache and replay buffer
    /// emptied, as after an engine restart) once this many batches were published.
    #[arg(long)]
    pub restart_publisher_after_batches: Option<u64>,
    /// Stamp KV-event batches this many milliseconds before they are published, as a
    /// publisher that lags behind its engine does.
    #[arg(long, default_value_t = 0)]
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

/// The live fault set shared by every part of the engine.
#[derive(Debug)]
pub(crate) struct Faults {
    config: Mutex<FaultConfig>,
    rng: Mutex<Xoshiro256PlusPlus>,
    refuse: watch::Sender<bool>,
    /// Bumped on every replacement, for the responses the hold fault holds.
    replaced: watch::Sender<u64>,
}

impl Faults {
    pub(crate) fn new(config: FaultConfig, seed: u64) -> Self {
        let (refuse, _) = watch::channel(config.refuse_connections);
        Self {
            config: Mutex::new(config),
            rng: Mutex::new(Xoshiro256PlusPlus::seed_from_u64(seed)),
            refuse,
            replaced: watch::Sender::new(0),
        }
    }

    pub(crate) fn current(&self) -> FaultConfig {
        self.config.lock().clone()
    }

    pub(crate) fn replace(&self, config: FaultConfig) {
        self.refuse.send_replace(config.refuse_connections);
        *self.config.lock() = config;
        self.replaced.send_modify(|n| *n += 1);
    }

    /// Waits while the hold fault holds a response that has sent `sent` chunks.
    pub(crate) async fn hold(&self, sent: u32) {
        let mut replaced = self.replaced.subscribe();
        while self
            .config
            .lock()
            .hold_after_chunks
            .is_some_and(|n| sent >= n)
        {
            if replaced.changed().await.is_err() {
                return;
            }
        }
    }

    /// Watches the refuse-connections switch.
    pub(crate) fn refusing(&self) -> watch::Receiver<bool> {
        self.refuse.subscribe()
    }

    /// The error status this request draws from the error-rate fault, if any.
    pub(crate) fn draw_error(&self) -> Option<StatusCode> {
        let (rate, status) = {
            let config = self.config.lock();
            (config.error_rate, config.error_status)
        };
        let drawn = rate > 0.0 && (self.rng.lock().next_u64() as f64 / u64::MAX as f64) < rate;
        drawn.then(|| {
            status
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        })
    }

    /// How far before publication batches are stamped.
    pub(crate) fn event_clock_behind(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.config.lock().event_clock_behind_ms)
    }

    /// Consumes one dropped batch, if the drop fault has any left.
    pub(crate) fn take_dropped_batch(&self) -> bool {
        let mut config = self.config.lock();
        if config.drop_event_batches == 0 {
            return false;
        }
        config.drop_event_batches -= 1;
        true
    }

    /// Whether the publisher restarts now, having published `published` batches;
    /// the fault fires once.
    pub(crate) fn take_restart(&self, published: u64) -> bool {
        let mut config = self.config.lock();
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
