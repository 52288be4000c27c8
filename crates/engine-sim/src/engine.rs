//! The scheduling, caching and timing model of one engine.
//!
//! Each data-parallel rank has its own running slots, prefix cache and counters.
//! A request waits for a slot, holds its cached prefix, prefills the uncached tokens at
//! the prefill rate, caches its new pages (publishing KV events), then emits output
//! tokens at the decode rate. Dropping a [`Run`] at any point (a client that went
//! away) returns everything it held.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::{Instant, sleep};

use crate::cache::{CacheChange, PageKey, PrefixCache, page_keys};
use crate::events::{KvEvent, Medium};
use crate::faults::{FaultConfig, FaultSet};

/// How fast and how wide an engine is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineSpec {
    /// Requests that run at once per rank; the rest wait in arrival order.
    pub max_running_requests: u32,
    /// Uncached prompt tokens prefilled per second (0 = instant): per request, or per
    /// rank with `serial_prefill`.
    pub prefill_tokens_per_sec: f64,
    /// Prefill one request at a time per rank, in arrival order, as a GPU whose
    /// prefill throughput its requests share; otherwise each request prefills on its
    /// own at the full rate.
    pub serial_prefill: bool,
    /// Output tokens generated per second per request (0 = instant).
    pub decode_tokens_per_sec: f64,
    /// KV-cache capacity in tokens per rank.
    pub kv_capacity_tokens: u64,
    /// Tokens per KV page.
    pub page_size: u32,
    /// Data-parallel ranks.
    pub dp_size: u32,
}

impl Default for EngineSpec {
    fn default() -> Self {
        Self {
            max_running_requests: 64,
            prefill_tokens_per_sec: 40_000.0,
            decode_tokens_per_sec: 1_000.0,
            kv_capacity_tokens: 1 << 20,
            page_size: 16,
            dp_size: 1,
            serial_prefill: false,
        }
    }
}

impl EngineSpec {
    /// How long prefilling `uncached` prompt tokens takes one request.
    pub fn prefill_time(&self, uncached: u64) -> Duration {
        rate_delay(uncached, self.prefill_tokens_per_sec)
    }

    /// How long generating `tokens` output tokens takes one request.
    pub fn decode_time(&self, tokens: u64) -> Duration {
        rate_delay(tokens, self.decode_tokens_per_sec)
    }
}

/// One rank's queues and counters, in the terms of the `LoadStat` gauge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadSample {
    /// Requests running.
    pub running_requests: u64,
    /// Requests waiting for a slot.
    pub waiting_requests: u64,
    /// KV tokens held by running requests.
    pub used_kv_tokens: u64,
    /// KV-cache capacity in tokens.
    pub max_kv_tokens: u64,
    /// Prompt tokens of waiting requests not covered by the prefix cache.
    pub waiting_uncached_tokens: u64,
    /// KV tokens in use plus the prompt tokens of waiting requests.
    pub total_tokens: u64,
    /// The running-request limit.
    pub max_running_requests: u64,
    /// Counter: uncached prompt tokens prefilled since start.
    pub prefill_uncached_tokens_total: u64,
    /// Counter: microseconds spent prefilling since start.
    pub prefill_busy_us_total: u64,
}

/// How one request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// Prompt length in tokens.
    pub prompt_tokens: u64,
    /// Time spent waiting for a running slot.
    pub queued: Duration,
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: u64,
    /// Time from arrival to the first output token.
    pub time_to_first_token: Duration,
    /// Time from arrival to the last output token.
    pub total: Duration,
}

/// A message to a rank's KV-event publisher.
#[derive(Debug)]
#[cfg_attr(
    not(feature = "server"),
    allow(
        dead_code,
        reason = "the publishers that read the batches are the server's"
    )
)]
pub(crate) enum PublisherMsg {
    /// Publish these events as one batch.
    Batch(Vec<KvEvent>),
    /// The engine restarted: sequence back to 0, replay history gone.
    Restart,
}

#[derive(Debug)]
pub(crate) struct Rank {
    index: u32,
    slots: Arc<Semaphore>,
    /// The turn to prefill, with `serial_prefill`.
    prefill_turn: Arc<tokio::sync::Mutex<()>>,
    state: Mutex<RankState>,
    events: Option<mpsc::UnboundedSender<PublisherMsg>>,
    /// Batches emitted since the last restart.
    batches: AtomicU64,
    /// The most requests the rank held at once (waiting or running) since start.
    peak: AtomicU64,
}

#[derive(Debug)]
struct RankState {
    load: LoadSample,
    cache: PrefixCache,
}

impl Rank {
    fn emit(&self, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        if let Some(tx) = &self.events {
            self.batches.fetch_add(1, Ordering::Relaxed);
            // A closed channel means the publisher is shutting down with the engine.
            drop(tx.send(PublisherMsg::Batch(events)));
        }
    }

    #[cfg(feature = "server")]
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    pub(crate) fn load(&self) -> LoadSample {
        self.state.lock().load
    }

    #[cfg(test)]
    pub(crate) fn cached_pages(&self) -> usize {
        self.state.lock().cache.len()
    }

    /// Empties the cache as a flush does, publishing `AllBlocksCleared`.
    fn flush(&self) {
        self.state.lock().cache.clear();
        self.emit(vec![KvEvent::Cleared]);
    }

    /// Empties the cache as an engine restart does: silently, with the publisher's
    /// sequence back to 0.
    fn restart(&self) {
        self.state.lock().cache.clear();
        self.batches.store(0, Ordering::Relaxed);
        if let Some(tx) = &self.events {
            drop(tx.send(PublisherMsg::Restart));
        }
    }
}

/// One simulated engine: `dp_size` ranks behind one front end.
#[derive(Debug)]
pub struct SimEngine {
    spec: EngineSpec,
    ranks: Vec<Arc<Rank>>,
    next_rank: AtomicUsize,
    faults: Arc<FaultSet>,
}

impl SimEngine {
    /// An idle engine with no event publishing and no faults.
    pub fn new(spec: EngineSpec) -> Self {
        Self::build(
            spec,
            Arc::new(FaultSet::new(FaultConfig::default())),
            Vec::new(),
        )
    }

    /// An engine whose rank `r` sends its KV events to `publishers[r]` (none when
    /// `publishers` is empty).
    pub(crate) fn build(
        spec: EngineSpec,
        faults: Arc<FaultSet>,
        publishers: Vec<mpsc::UnboundedSender<PublisherMsg>>,
    ) -> Self {
        let mut publishers = publishers.into_iter();
        let ranks = (0..spec.dp_size.max(1))
            .map(|index| {
                Arc::new(Rank {
                    index,
                    slots: Arc::new(Semaphore::new(spec.max_running_requests as usize)),
                    prefill_turn: Arc::new(tokio::sync::Mutex::new(())),
                    state: Mutex::new(RankState {
                        load: LoadSample {
                            max_kv_tokens: spec.kv_capacity_tokens,
                            max_running_requests: u64::from(spec.max_running_requests),
                            ..LoadSample::default()
                        },
                        cache: PrefixCache::new(
                            (spec.kv_capacity_tokens / u64::from(spec.page_size)) as usize,
                        ),
                    }),
                    events: publishers.next(),
                    batches: AtomicU64::new(0),
                    peak: AtomicU64::new(0),
                })
            })
            .collect();
        Self {
            spec,
            ranks,
            next_rank: AtomicUsize::new(0),
            faults,
        }
    }

    /// The engine's spec.
    pub fn spec(&self) -> EngineSpec {
        self.spec
    }

    /// KV-event batches handed to the publishers since start (or the last publisher
    /// restart), over every rank: a subscriber that has applied this many is caught
    /// up.
    pub fn published_batches(&self) -> u64 {
        self.ranks
            .iter()
            .map(|r| r.batches.load(Ordering::Relaxed))
            .sum()
    }

    /// The most requests one rank held at once (waiting or running) since start:
    /// what an admission cap in front of the engine must keep down.
    pub fn peak_requests(&self) -> u64 {
        self.ranks
            .iter()
            .map(|r| r.peak.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
    }

    /// The summed load of every rank.
    pub fn load(&self) -> LoadSample {
        self.ranks
            .iter()
            .map(|r| r.load())
            .fold(LoadSample::default(), |a, b| LoadSample {
                running_requests: a.running_requests + b.running_requests,
                waiting_requests: a.waiting_requests + b.waiting_requests,
                used_kv_tokens: a.used_kv_tokens + b.used_kv_tokens,
                max_kv_tokens: a.max_kv_tokens + b.max_kv_tokens,
                waiting_uncached_tokens: a.waiting_uncached_tokens + b.waiting_uncached_tokens,
                total_tokens: a.total_tokens + b.total_tokens,
                max_running_requests: a.max_running_requests + b.max_running_requests,
                prefill_uncached_tokens_total: a.prefill_uncached_tokens_total
                    + b.prefill_uncached_tokens_total,
                prefill_busy_us_total: a.prefill_busy_us_total + b.prefill_busy_us_total,
            })
    }

    #[cfg(feature = "server")]
    pub(crate) fn ranks(&self) -> &[Arc<Rank>] {
        &self.ranks
    }

    /// Flushes every rank's cache, publishing `AllBlocksCleared` per rank.
    pub fn flush_cache(&self) {
        self.ranks.iter().for_each(|r| r.flush());
    }

    /// Restarts every rank's publisher, as an engine restart would.
    pub fn restart_publishers(&self) {
        self.ranks.iter().for_each(|r| r.restart());
    }

    /// Registers a request of `tokens` as waiting, on `rank` (modulo the rank count) or
    /// the next rank in rotation.
    pub fn start(&self, tokens: Vec<u32>, rank: Option<u64>) -> Run {
        self.start_for(tokens, rank, None)
    }

    /// [`start`](Self::start) for LoRA adapter `adapter` (`None`: the base model):
    /// its pages are cached, and published, in the adapter's namespace.
    pub fn start_for(&self, tokens: Vec<u32>, rank: Option<u64>, adapter: Option<Arc<str>>) -> Run {
        let index = match rank {
            Some(r) => (r % self.ranks.len() as u64) as usize,
            None => self.next_rank.fetch_add(1, Ordering::Relaxed) % self.ranks.len(),
        };
        let rank = Arc::clone(&self.ranks[index]);
        let keys = page_keys(&tokens, self.spec.page_size as usize, adapter.as_deref());
        let prompt = tokens.len() as u64;
        let uncached = {
            let mut state = rank.state.lock();
            let uncached =
                prompt - (state.cache.peek(&keys) as u64 * u64::from(self.spec.page_size));
            state.load.waiting_requests += 1;
            state.load.waiting_uncached_tokens += uncached;
            state.load.total_tokens += prompt;
            rank.peak.fetch_max(
                state.load.waiting_requests + state.load.running_requests,
                Ordering::Relaxed,
            );
            uncached
        };
        Run {
            spec: self.spec,
            faults: Arc::clone(&self.faults),
            rank,
            tokens,
            keys,
            held: 0,
            phase: Phase::Waiting { uncached },
            generated: 0,
            arrived: Instant::now(),
            adapter,
            ended: false,
        }
    }

    /// Serves a whole request in-process and reports its timing.
    pub async fn serve(&self, tokens: Vec<u32>, output_tokens: u64) -> Served {
        let mut run = self.start(tokens, None);
        let queued = run.admit().await;
        let cached_tokens = run.prefill().await;
        let time_to_first_token = run.arrived.elapsed();
        for _ in 0..output_tokens {
            run.decode_token().await;
        }
        Served {
            prompt_tokens: run.prompt_tokens(),
            queued,
            cached_tokens,
            time_to_first_token,
            total: run.arrived.elapsed(),
        }
    }
}

#[derive(Debug)]
enum Phase {
    Waiting {
        uncached: u64,
    },
    Running {
        _permit: OwnedSemaphorePermit,
        /// The rank's prefill turn, held until prefill ends (`serial_prefill`).
        turn: Option<OwnedMutexGuard<()>>,
    },
}

/// One request's life on one rank. Dropping it at any phase returns its slot, its
/// counters and its hold on cached pages.
#[derive(Debug)]
pub struct Run {
    spec: EngineSpec,
    faults: Arc<FaultSet>,
    rank: Arc<Rank>,
    tokens: Vec<u32>,
    keys: Vec<PageKey>,
    held: usize,
    phase: Phase,
    generated: u64,
    arrived: Instant,
    /// The LoRA adapter it runs, named in its KV events (`lora_name`, as vLLM does).
    adapter: Option<Arc<str>>,
    /// Whether its slot and pages were given back.
    ended: bool,
}

impl Run {
    /// Gives the run's slot, KV tokens and pages back: when its last token is
    /// generated, as an engine frees a finished request before its answer is
    /// flushed, or when it is dropped unfinished.
    pub fn end(&mut self) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let mut state = self.rank.state.lock();
        let prompt = self.prompt_tokens();
        state.load.total_tokens -= prompt + self.generated;
        match self.phase {
            Phase::Waiting { uncached } => {
                state.load.waiting_requests -= 1;
                state.load.waiting_uncached_tokens -= uncached;
            }
            Phase::Running { .. } => {
                state.load.running_requests -= 1;
                state.load.used_kv_tokens -= prompt + self.generated;
            }
        }
        let held = &self.keys[..self.held];
        state.cache.release(held);
    }

    /// The rank serving the request.
    pub fn rank(&self) -> u32 {
        self.rank.index
    }

    /// Prompt length in tokens.
    pub fn prompt_tokens(&self) -> u64 {
        self.tokens.len() as u64
    }

    /// Waits for a running slot (and, with `serial_prefill`, for the rank's prefill
    /// turn first); returns the time spent waiting.
    pub async fn admit(&mut self) -> Duration {
        let turn = if self.spec.serial_prefill && matches!(self.phase, Phase::Waiting { .. }) {
            Some(Arc::clone(&self.rank.prefill_turn).lock_owned().await)
        } else {
            None
        };
        let permit = Arc::clone(&self.rank.slots)
            .acquire_owned()
            .await
            .expect("the slot semaphore is never closed");
        let Phase::Waiting { uncached } = self.phase else {
            return Duration::ZERO;
        };
        {
            let mut state = self.rank.state.lock();
            state.load.waiting_requests -= 1;
            state.load.waiting_uncached_tokens -= uncached;
            state.load.running_requests += 1;
            state.load.used_kv_tokens += self.prompt_tokens();
        }
        self.phase = Phase::Running {
            _permit: permit,
            turn,
        };
        self.arrived.elapsed()
    }

    /// Prefills the prompt: holds its cached prefix, computes the rest at the
    /// prefill rate, then caches the new pages and publishes them. Returns the prompt
    /// tokens found in the cache.
    pub async fn prefill(&mut self) -> u64 {
        let page = u64::from(self.spec.page_size);
        let matched = {
            if self
                .faults
                .take_restart(self.rank.batches.load(Ordering::Relaxed))
            {
                self.rank.restart();
            }
            self.rank.state.lock().cache.hold_prefix(&self.keys)
        };
        self.held = matched;
        let cached = matched as u64 * page;
        let uncached = self.prompt_tokens() - cached;
        let took = self.spec.prefill_time(uncached);
        if !took.is_zero() {
            sleep(took).await;
        }
        let events = {
            let mut state = self.rank.state.lock();
            state.load.prefill_uncached_tokens_total += uncached;
            state.load.prefill_busy_us_total += took.as_micros() as u64;
            let change = state.cache.insert(&self.keys, matched);
            self.held = change.held;
            change_events(
                change,
                &self.tokens,
                self.spec.page_size,
                self.adapter.clone(),
            )
        };
        self.rank.emit(events);
        if let Phase::Running { turn, .. } = &mut self.phase {
            turn.take();
        }
        cached
    }

    /// Emits one output token at the decode rate.
    pub async fn decode_token(&mut self) {
        let took = self.spec.decode_time(1);
        if !took.is_zero() {
            sleep(took).await;
        }
        self.generated += 1;
        let mut state = self.rank.state.lock();
        state.load.used_kv_tokens += 1;
        state.load.total_tokens += 1;
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.end();
    }
}

/// The KV events of a cache change: the evictions, then the pages stored (the last
/// `change.stored.len()` of the `change.held` pages of `tokens`, in `page_size` pages).
fn change_events(
    change: CacheChange,
    tokens: &[u32],
    page_size: u32,
    lora_name: Option<Arc<str>>,
) -> Vec<KvEvent> {
    let mut events = Vec::new();
    if !change.removed.is_empty() {
        events.push(KvEvent::Removed {
            hashes: change.removed,
            medium: Medium::Gpu,
        });
    }
    if !change.stored.is_empty() {
        let page = page_size as usize;
        let first = change.held - change.stored.len();
        events.push(KvEvent::Stored {
            hashes: change.stored,
            parent: change.parent,
            tokens: tokens[first * page..change.held * page].to_vec(),
            block_size: page_size,
            lora_name,
            medium: Medium::Gpu,
        });
    }
    events
}

/// `tokens` at `rate` per second, to the microsecond; zero for an instant (zero) rate.
fn rate_delay(tokens: u64, rate: f64) -> Duration {
    if rate > 0.0 && tokens > 0 {
        Duration::from_micros((tokens as f64 * 1e6 / rate).round() as u64)
    } else {
        Duration::ZERO
    }
}

mod synthetic;
#[cfg(test)]
mod tests;
