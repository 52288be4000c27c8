//! The engine load table: reported load per rank, aggregated per engine, plus the
//! router's own in-flight and dispatch counters.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::time::Instant;

use super::load_stat::LoadReport;
use super::observation::{EngineObservation, NativeAggregate, ReportedLoad};
use super::tpot::TpotEstimate;
use crate::engine::EngineId;

/// Default time a rank's report stays fresh after the router receives it.
pub const DEFAULT_FRESHNESS: Duration = Duration::from_secs(5);

/// Settings of an [`EngineReportedLoadTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadTableConfig {
    /// How long a rank's report counts as fresh, measured from receipt.
    pub freshness: Duration,
}

impl Default for LoadTableConfig {
    fn default() -> Self {
        Self {
            freshness: DEFAULT_FRESHNESS,
        }
    }
}

/// Why a report was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    /// The engine is not registered in the table (it may have just been removed).
    #[error("engine {0} is not registered in the load table")]
    UnknownEngine(EngineId),
    /// The rank is outside the engine's data-parallel size.
    #[error("engine {id} has {dp_size} data-parallel ranks; rank {rank} is out of range")]
    RankOutOfRange {
        /// The engine.
        id: EngineId,
        /// The rank of the socket the report came from.
        rank: u32,
        /// The engine's rank count.
        dp_size: u32,
    },
}

/// Reported engine load and router-local request accounting, shared by every policy.
///
/// Reports are aggregated per engine when they arrive, so capturing a
/// [`LoadSnapshot`] for a pick is one atomic load and reading an engine from it is one
/// hash lookup, whatever the fleet size.
#[derive(Debug, Default)]
pub struct EngineReportedLoadTable {
    config: LoadTableConfig,
    engines: ArcSwap<FxHashMap<EngineId, Arc<EngineSlot>>>,
    write: Mutex<()>,
    signal: Arc<CapacitySignal>,
}

/// Called whenever capacity may have freed: a request released, a report applied,
/// an engine registered. It must be cheap, it runs on every release.
pub type CapacityListener = Box<dyn Fn() + Send + Sync>;

/// Where the table tells its listener that capacity may have freed; every slot holds
/// it, so a guard's release reaches the listener.
#[derive(Default)]
struct CapacitySignal {
    listener: ArcSwapOption<CapacityListener>,
}

impl CapacitySignal {
    fn fire(&self) {
        if let Some(listener) = self.listener.load().as_deref() {
            listener();
        }
    }
}

impl std::fmt::Debug for CapacitySignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapacitySignal")
            .field("listening", &self.listener.load().is_some())
            .finish()
    }
}

#[derive(Debug)]
struct EngineSlot {
    in_flight: AtomicU64,
    signal: Arc<CapacitySignal>,
    /// Total dispatches ever made to the engine; the dispatch correction is the
    /// difference between now and the value recorded with a report.
    dispatched: AtomicU64,
    ranks: Mutex<Vec<Option<RankSample>>>,
    /// Requests this router has in flight to each rank it named.
    rank_in_flight: Mutex<Vec<u64>>,
    published: ArcSwapOption<Published>,
    tpot: TpotEstimate,
}

#[derive(Debug, Clone, Copy)]
struct RankSample {
    report: LoadReport,
    received_at: Instant,
    dispatched_at_receipt: u64,
    prefill_tokens_per_sec: Option<f64>,
}

#[derive(Debug)]
struct Published {
    load: ReportedLoad,
    dispatched_at_report: u64,
}

impl EngineSlot {
    fn new(dp_size: NonZeroU32, signal: &Arc<CapacitySignal>) -> Self {
        Self {
            in_flight: AtomicU64::new(0),
            signal: Arc::clone(signal),
            dispatched: AtomicU64::new(0),
            ranks: Mutex::new(vec![None; dp_size.get() as usize]),
            rank_in_flight: Mutex::new(vec![0; dp_size.get() as usize]),
            published: ArcSwapOption::empty(),
            tpot: TpotEstimate::default(),
        }
    }
}

impl EngineReportedLoadTable {
    /// An empty table.
    pub fn new(config: LoadTableConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The table's settings.
    pub fn config(&self) -> LoadTableConfig {
        self.config
    }

    /// Starts tracking an engine with `dp_size` ranks. Registering a known engine with a
    /// different rank count forgets its reports (the ranks changed), keeping counters.
    pub fn register(&self, id: &EngineId, dp_size: NonZeroU32) {
        let _write = self.write.lock();
        let engines = self.engines.load();
        if let Some(slot) = engines.get(id) {
            let mut ranks = slot.ranks.lock();
            if ranks.len() != dp_size.get() as usize {
                *ranks = vec![None; dp_size.get() as usize];
                slot.published.store(None);
                let mut in_flight = slot.rank_in_flight.lock();
                if in_flight.len() < ranks.len() {
                    in_flight.resize(ranks.len(), 0);
                }
            }
            return;
        }
        let mut next = FxHashMap::clone(&engines);
        next.insert(id.clone(), Arc::new(EngineSlot::new(dp_size, &self.signal)));
        self.engines.store(Arc::new(next));
        drop(_write);
        self.signal.fire();
    }

    /// Sets (or with `None`, clears) the one listener told whenever capacity may have
    /// freed: a guard released, a report applied, an engine registered.
    pub fn on_capacity(&self, listener: Option<CapacityListener>) {
        self.signal.listener.store(listener.map(Arc::new));
    }

    /// Stops tracking an engine; its reports are dropped. Guards still held for it
    /// release normally. Returns whether it was tracked.
    pub fn unregister(&self, id: &EngineId) -> bool {
        let _write = self.write.lock();
        let engines = self.engines.load();
        if !engines.contains_key(id) {
            return false;
        }
        let mut next = FxHashMap::clone(&engines);
        next.remove(id);
        self.engines.store(Arc::new(next));
        true
    }

    /// Applies one rank's report, received at `received_at`.
    ///
    /// # Errors
    /// An unregistered engine or a rank beyond its data-parallel size.
    pub fn ingest(
        &self,
        id: &EngineId,
        rank: u32,
        report: LoadReport,
        received_at: Instant,
    ) -> Result<(), IngestError> {
        let engines = self.engines.load();
        let slot = engines
            .get(id)
            .ok_or_else(|| IngestError::UnknownEngine(id.clone()))?;
        let mut ranks = slot.ranks.lock();
        let dp_size = ranks.len() as u32;
        let Some(entry) = ranks.get_mut(rank as usize) else {
            return Err(IngestError::RankOutOfRange {
                id: id.clone(),
                rank,
                dp_size,
            });
        };
        let prefill_tokens_per_sec = entry
            .as_ref()
            .and_then(|previous| prefill_speed(&previous.report, &report));
        *entry = Some(RankSample {
            report,
            received_at,
            dispatched_at_receipt: slot.dispatched.load(Ordering::Relaxed),
            prefill_tokens_per_sec,
        });
        slot.published.store(aggregate(&ranks).map(Arc::new));
        drop(ranks);
        self.signal.fire();
        Ok(())
    }

    /// Captures the table for one pick at the current (tokio) time.
    pub fn snapshot(&self) -> LoadSnapshot {
        LoadSnapshot {
            engines: self.engines.load(),
            now: Instant::now(),
            freshness: self.config.freshness,
        }
    }

    /// Counts a request dispatched to `id` until the returned guard drops. Unregistered
    /// engines are tracked from their first guard on.
    pub fn acquire(&self, id: &EngineId) -> InflightGuard {
        let slot = self.slot(id);
        slot.in_flight.fetch_add(1, Ordering::Relaxed);
        slot.dispatched.fetch_add(1, Ordering::Relaxed);
        InflightGuard { slot, rank: None }
    }

    /// Reserves a slot for a request to `id`, if this router has fewer than `cap`
    /// requests in flight to it (reservations included); otherwise `Err` with the count
    /// found. The check and the count are one atomic step, so concurrent callers never
    /// take `id` past `cap` between them. The reservation becomes the request's guard
    /// when it is dispatched ([`Reservation::dispatch`]).
    ///
    /// # Errors
    /// The requests in flight to `id` when it was at or above `cap`.
    pub fn try_reserve(&self, id: &EngineId, cap: u64) -> Result<Reservation, u64> {
        let slot = self.slot(id);
        slot.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })?;
        Ok(Reservation { slot: Some(slot) })
    }

    /// Counts a request dispatched to rank `rank` of `id` (and to `id`) until the
    /// returned guard drops.
    pub fn acquire_rank(&self, id: &EngineId, rank: u32) -> InflightGuard {
        self.acquire(id).with_rank(rank)
    }

    fn slot(&self, id: &EngineId) -> Arc<EngineSlot> {
        match self.engines.load().get(id) {
            Some(slot) => Arc::clone(slot),
            None => self.slot_for_guard(id),
        }
    }

    /// The rank of a data-parallel engine a request should go to: the one with the
    /// fewest requests, each rank's count being the larger of its fresh report
    /// (running plus waiting) and this router's requests in flight to it; the lowest
    /// rank on a tie. `None` for an engine of one rank, or one the table does not
    /// track.
    pub fn least_loaded_rank(&self, id: &EngineId) -> Option<u32> {
        let engines = self.engines.load();
        let slot = engines.get(id)?;
        let now = Instant::now();
        let reports = slot.ranks.lock();
        if reports.len() <= 1 {
            return None;
        }
        let in_flight = slot.rank_in_flight.lock();
        let load = |rank: usize| {
            let reported = reports[rank]
                .as_ref()
                .filter(|s| now.saturating_duration_since(s.received_at) < self.config.freshness)
                .map_or(0, |s| {
                    s.report
                        .running_requests
                        .saturating_add(s.report.waiting_requests)
                });
            reported.max(in_flight.get(rank).copied().unwrap_or(0))
        };
        (0..reports.len())
            .min_by_key(|rank| (load(*rank), *rank))
            .and_then(|rank| u32::try_from(rank).ok())
    }

    /// Folds one streamed answer's time per output token into `id`'s estimate (see
    /// [`LoadSnapshot::tpot`]); an engine the table does not track is ignored.
    pub fn observe_tpot(&self, id: &EngineId, per_token: Duration) {
        if let Some(slot) = self.engines.load().get(id) {
            slot.tpot.observe(per_token, Instant::now());
        }
    }

    /// Requests this router currently has in flight to `id`.
    pub fn in_flight(&self, id: &EngineId) -> u64 {
        self.engines
            .load()
            .get(id)
            .map_or(0, |slot| slot.in_flight.load(Ordering::Relaxed))
    }

    fn slot_for_guard(&self, id: &EngineId) -> Arc<EngineSlot> {
        let _write = self.write.lock();
        let engines = self.engines.load();
        if let Some(slot) = engines.get(id) {
            return Arc::clone(slot);
        }
        let slot = Arc::new(EngineSlot::new(NonZeroU32::MIN, &self.signal));
        let mut next = FxHashMap::clone(&engines);
        next.insert(id.clone(), Arc::clone(&slot));
        self.engines.store(Arc::new(next));
        slot
    }
}

/// Prefill speed of one rank between two consecutive native reports, when both
/// counters advanced; counters that go backwards (a restarted publisher) give none.
fn prefill_speed(previous: &LoadReport, next: &LoadReport) -> Option<f64> {
    let (previous, next) = (previous.native?, next.native?);
    let tokens = next
        .prefill_uncached_tokens_total
        .checked_sub(previous.prefill_uncached_tokens_total)?;
    let busy_us = next
        .prefill_busy_us_total
        .checked_sub(previous.prefill_busy_us_total)?;
    (tokens > 0 && busy_us > 0).then(|| 1e6 * tokens as f64 / busy_us as f64)
}

/// Sums the ranks of one engine; `None` unless every rank has a report.
fn aggregate(ranks: &[Option<RankSample>]) -> Option<Published> {
    let samples: Vec<&RankSample> = ranks.iter().map(Option::as_ref).collect::<Option<_>>()?;
    let oldest = samples.iter().min_by_key(|s| s.received_at)?;
    let sum =
        |f: fn(&RankSample) -> u64| samples.iter().fold(0u64, |acc, s| acc.saturating_add(f(s)));
    let sum_opt = |f: fn(&RankSample) -> Option<u64>| {
        samples
            .iter()
            .try_fold(0u64, |acc, s| f(s).map(|v| acc.saturating_add(v)))
    };
    let native = samples.iter().all(|s| s.report.native.is_some()).then(|| {
        let waiting_uncached_tokens =
            sum(|s| s.report.native.map_or(0, |n| n.waiting_uncached_tokens));
        let speed = samples
            .iter()
            .try_fold(0f64, |acc, s| s.prefill_tokens_per_sec.map(|v| acc + v));
        NativeAggregate {
            waiting_uncached_tokens,
            total_tokens: sum(|s| s.report.native.map_or(0, |n| n.total_tokens)),
            max_running_requests: sum(|s| s.report.native.map_or(0, |n| n.max_running_requests)),
            prefill_tokens_per_sec: speed,
            prefill_queue_ms: speed
                .filter(|v| *v > 0.0)
                .map(|v| 1000.0 * waiting_uncached_tokens as f64 / v),
        }
    });
    Some(Published {
        load: ReportedLoad {
            running_requests: sum(|s| s.report.running_requests),
            waiting_requests: sum(|s| s.report.waiting_requests),
            used_kv_tokens: sum(|s| s.report.used_kv_tokens),
            max_kv_tokens: sum_opt(|s| s.report.max_kv_tokens),
            native,
            received_at: oldest.received_at,
        },
        dispatched_at_report: oldest.dispatched_at_receipt,
    })
}

/// The load table as captured for one pick.
///
/// Reading an engine applies the freshness window against the capture time, so a pick
/// and the admission check after it see the same observation.
#[derive(Debug)]
pub struct LoadSnapshot {
    engines: arc_swap::Guard<Arc<FxHashMap<EngineId, Arc<EngineSlot>>>>,
    now: Instant,
    freshness: Duration,
}

impl LoadSnapshot {
    /// The capture time.
    pub fn captured_at(&self) -> Instant {
        self.now
    }

    /// The time per output token this router measured on `id`'s streamed answers (a
    /// moving average), while its latest measurement is within
    /// [`TPOT_FRESHNESS`](super::TPOT_FRESHNESS) of the capture.
    pub fn tpot(&self, id: &EngineId) -> Option<Duration> {
        self.engines.get(id)?.tpot.at(self.now)
    }

    /// One engine's observation; [`EngineObservation::UNKNOWN`] for an engine the
    /// table does not track.
    pub fn observe(&self, id: &EngineId) -> EngineObservation {
        let Some(slot) = self.engines.get(id) else {
            return EngineObservation::UNKNOWN;
        };
        let in_flight = slot.in_flight.load(Ordering::Relaxed);
        let published = slot.published.load();
        let fresh = published
            .as_deref()
            .filter(|p| self.now.saturating_duration_since(p.load.received_at) < self.freshness);
        EngineObservation {
            reported: fresh.map(|p| p.load),
            in_flight,
            dispatched_since_report: fresh.map_or(0, |p| {
                slot.dispatched
                    .load(Ordering::Relaxed)
                    .saturating_sub(p.dispatched_at_report)
            }),
        }
    }
}

/// Counts one request in flight to one engine until dropped.
///
/// Dropping is the only way to release it, so every path (success, error, panic
/// unwinding, a cancelled future) releases exactly once.
#[derive(Debug)]
#[must_use = "the request counts as in flight only while the guard lives"]
pub struct InflightGuard {
    slot: Arc<EngineSlot>,
    /// The rank the request was sent to, when it named one.
    rank: Option<u32>,
}

impl InflightGuard {
    /// The same request, counted on rank `rank` of its engine too until the guard
    /// drops (replacing a rank it named before).
    pub fn with_rank(mut self, rank: u32) -> Self {
        let mut ranks = self.slot.rank_in_flight.lock();
        if let Some(previous) = self.rank
            && let Some(count) = ranks.get_mut(previous as usize)
        {
            *count = count.saturating_sub(1);
        }
        if ranks.len() <= rank as usize {
            ranks.resize(rank as usize + 1, 0);
        }
        ranks[rank as usize] += 1;
        drop(ranks);
        self.rank = Some(rank);
        self
    }
}

/// A slot on one engine held for a request that is not dispatched yet; it counts as
/// in flight. [`Reservation::dispatch`] turns it into the request's [`InflightGuard`].
///
/// Dropped undispatched (the other leg of a pair was refused, the client left), it
/// frees the slot without telling the capacity listener: the slot was only ever
/// taken by the attempt that drops it, and telling would start another pass of a
/// waiting room for every such attempt, forever if the attempt keeps failing.
#[derive(Debug)]
#[must_use = "the slot is held only while the reservation lives"]
pub struct Reservation {
    /// `None` once dispatched.
    slot: Option<Arc<EngineSlot>>,
}

impl Reservation {
    /// The request is dispatched: from now on it counts as dispatched to the engine
    /// (the correction of reported load) and its release tells the capacity listener.
    pub fn dispatch(mut self) -> InflightGuard {
        let slot = self.slot.take().expect("a reservation is dispatched once");
        slot.dispatched.fetch_add(1, Ordering::Relaxed);
        InflightGuard { slot, rank: None }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.slot.in_flight.fetch_sub(1, Ordering::AcqRel);
        if let Some(rank) = self.rank
            && let Some(count) = self.slot.rank_in_flight.lock().get_mut(rank as usize)
        {
            *count = count.saturating_sub(1);
        }
        self.slot.signal.fire();
    }
}
