//! The faults as the server acts on them: error draws, held and slow answers, refused
//! connections and the publishers' dropped and late batches, over the fault set it
//! shares with the engine model.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use parking_lot::Mutex;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use tokio::sync::watch;

use crate::faults::{FaultConfig, FaultSet};

/// The live fault set shared by every part of the engine.
#[derive(Debug)]
pub(crate) struct Faults {
    set: Arc<FaultSet>,
    rng: Mutex<Xoshiro256PlusPlus>,
    refuse: watch::Sender<bool>,
    /// Bumped on every replacement, for the responses the hold fault holds.
    replaced: watch::Sender<u64>,
}

impl Faults {
    pub(crate) fn new(config: FaultConfig, seed: u64) -> Self {
        let (refuse, _) = watch::channel(config.refuse_connections);
        Self {
            set: Arc::new(FaultSet::new(config)),
            rng: Mutex::new(Xoshiro256PlusPlus::seed_from_u64(seed)),
            refuse,
            replaced: watch::Sender::new(0),
        }
    }

    /// The fault set, for the engine model.
    pub(crate) fn set(&self) -> &Arc<FaultSet> {
        &self.set
    }

    pub(crate) fn current(&self) -> FaultConfig {
        self.set.lock().clone()
    }

    pub(crate) fn replace(&self, config: FaultConfig) {
        self.refuse.send_replace(config.refuse_connections);
        *self.set.lock() = config;
        self.replaced.send_modify(|n| *n += 1);
    }

    /// Waits while the hold fault holds a response that has sent `sent` chunks.
    pub(crate) async fn hold(&self, sent: u32) {
        let mut replaced = self.replaced.subscribe();
        while self.set.lock().hold_after_chunks.is_some_and(|n| sent >= n) {
            if replaced.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits while the fault holding whole answers holds them.
    pub(crate) async fn hold_whole(&self) {
        let mut replaced = self.replaced.subscribe();
        while self.set.lock().hold_whole_answers {
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
            let config = self.set.lock();
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
    pub(crate) fn event_clock_behind(&self) -> Duration {
        Duration::from_millis(self.set.lock().event_clock_behind_ms)
    }

    /// Consumes one dropped batch, if the drop fault has any left.
    pub(crate) fn take_dropped_batch(&self) -> bool {
        let mut config = self.set.lock();
        if config.drop_event_batches == 0 {
            return false;
        }
        config.drop_event_batches -= 1;
        true
    }
}
