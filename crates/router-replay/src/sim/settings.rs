//! The replay's settings: the modelled engines, their feeds and how requests arrive.

use std::time::Duration;

use engine_sim::EngineSpec;

use crate::closed_loop::MAX_CLIENTS;
use crate::error::{ReplayError, SettingsError};

/// How the modelled engines and their feeds behave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplaySettings {
    /// Every engine's timing, slots and cache. Its page size must be the model's
    /// block size, as on a real fleet (the router's index would not match otherwise).
    pub engine: EngineSpec,
    /// Every rank's host-memory tier (none by default).
    pub host_tier: HostTier,
    /// How long a KV-event batch takes from the engine to the router's index.
    pub kv_delay: Duration,
    /// Engines whose KV feed lags behind the others' (none by default).
    pub lagging_feeds: LaggingFeeds,
    /// How many engines, the first in the configuration's order, publish no KV
    /// events: they cache as the others do, but the router's prefix index never hears
    /// of it, as with engines whose events are off or unreachable (none by default).
    pub silent_kv_engines: usize,
    /// When requests are sent: at their trace times, or by a closed loop of clients.
    pub arrivals: Arrivals,
    /// The seed given to policies that draw random numbers and name no seed.
    pub seed: u64,
    /// Time outside the engine model (the router, HTTP, the engine's front end)
    /// added to every answer's first token and end; 0 by default. Calibration fits it
    /// to records ([`calibrate`](crate::calibrate)). Open arrivals only.
    pub first_token_delay: Duration,
}

/// A host-memory tier behind each rank's device cache: every page computed is
/// written through to it; a prompt whose cached prefix continues there loads those
/// pages back instead of prefilling them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostTier {
    /// Pages it holds per rank; 0 = no host tier.
    pub pages: usize,
    /// Time to load a page back, as a share of the time to prefill it.
    pub load_cost: f64,
}

impl Default for HostTier {
    fn default() -> Self {
        Self {
            pages: 0,
            load_cost: 0.1,
        }
    }
}

/// When a replay's requests arrive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Arrivals {
    /// At their trace times (an open loop: arrivals do not wait for answers).
    #[default]
    Open,
    /// A closed loop of `clients` clients: each sends its next request as soon as its
    /// previous one completed, the trace's times ignored and its order kept (see
    /// [`ClosedLoop`](crate::ClosedLoop)). A request's time to first token counts from
    /// when its client sent it.
    Closed {
        /// Clients, 1 to [`MAX_CLIENTS`].
        clients: usize,
    },
}

/// Engines whose KV events reach the router later than the others'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaggingFeeds {
    /// How many engines, the first in the configuration's order.
    pub engines: usize,
    /// How long their batches take, instead of `kv_delay`.
    pub delay: Duration,
}

/// The most running slots per rank a replay models.
pub(crate) const MAX_SLOTS: u32 = 1 << 16;
/// The slowest nonzero rate, tokens per second: a step of at most a second.
pub(crate) const MIN_RATE: f64 = 1.0;
/// The fastest rate, tokens per second.
pub(crate) const MAX_RATE: f64 = 1e9;
/// The longest KV-event delay.
pub(crate) const MAX_KV_DELAY: Duration = Duration::from_secs(60);
/// The longest first-token delay.
pub(crate) const MAX_FIRST_TOKEN_DELAY: Duration = Duration::from_secs(60);
/// The most host-tier pages per rank.
pub(crate) const MAX_HOST_PAGES: usize = 1 << 26;
/// The costliest host load, as a share of prefilling.
pub(crate) const MAX_LOAD_COST: f64 = 10.0;

impl ReplaySettings {
    /// Checks the settings' bounds.
    ///
    /// # Errors
    /// The first setting out of its bounds.
    pub fn check(&self) -> Result<(), ReplayError> {
        let spec = &self.engine;
        if !(1..=MAX_SLOTS).contains(&spec.max_running_requests) {
            return Err(SettingsError::Slots.into());
        }
        for (stage, rate) in [
            ("prefill", spec.prefill_tokens_per_sec),
            ("decode", spec.decode_tokens_per_sec),
        ] {
            if !(rate == 0.0 || (MIN_RATE..=MAX_RATE).contains(&rate)) {
                return Err(SettingsError::Rate { stage, rate }.into());
            }
        }
        if spec.page_size == 0 || spec.kv_capacity_tokens < u64::from(spec.page_size) {
            return Err(SettingsError::KvCapacity.into());
        }
        if self.lagging_feeds.engines > 0 && self.lagging_feeds.delay < self.kv_delay {
            return Err(SettingsError::LaggingDelay.into());
        }
        if self.kv_delay.max(self.lagging_feeds.delay) > MAX_KV_DELAY {
            return Err(SettingsError::KvDelay.into());
        }
        if self.first_token_delay > MAX_FIRST_TOKEN_DELAY {
            return Err(SettingsError::FirstTokenDelay.into());
        }
        // Added once the run is over, the delay would not hold a closed loop's
        // clients back.
        if !self.first_token_delay.is_zero() && matches!(self.arrivals, Arrivals::Closed { .. }) {
            return Err(SettingsError::DelayInClosedLoop.into());
        }
        if self.host_tier.pages > MAX_HOST_PAGES {
            return Err(SettingsError::HostPages.into());
        }
        let cost = self.host_tier.load_cost;
        if !(0.0..=MAX_LOAD_COST).contains(&cost) {
            return Err(SettingsError::HostLoadCost { cost }.into());
        }
        if let Arrivals::Closed { clients } = self.arrivals
            && !(1..=MAX_CLIENTS).contains(&clients)
        {
            return Err(SettingsError::Clients { clients }.into());
        }
        Ok(())
    }
}

impl Default for ReplaySettings {
    fn default() -> Self {
        Self {
            engine: EngineSpec::default(),
            host_tier: HostTier::default(),
            kv_delay: Duration::from_millis(1),
            lagging_feeds: LaggingFeeds::default(),
            silent_kv_engines: 0,
            arrivals: Arrivals::Open,
            seed: 0,
            first_token_delay: Duration::ZERO,
        }
    }
}
