//! engine-sim's model of one engine, stepped by events instead of timers.
//!
//! The same rules as `engine_sim::SimEngine`, with its cache and its timing: each
//! rank runs at most `max_running_requests` requests (and, with serial prefill,
//! prefills one at a time) and queues the rest in arrival order; a request holds its
//! cached prefix, prefills the uncached tokens at the prefill rate, caches its new
//! pages (the KV events the rank publishes), then generates its output at the decode
//! rate and gives everything back. One difference: tokens generated are not counted
//! in the published KV usage as they are generated. Time is in microseconds of the
//! replay's clock.
//!
//! With a host tier ([`HostTier`]), a rank also writes every page it computes through
//! to host memory and loads a prefix that continues there back onto the device, at
//! `load_cost` of the time prefilling it would take; its events name each tier.
//!
//! A prefill/decode pair splits a request in two runs: the prefill engine's, which
//! ends when its prefill does, and the decode engine's ([`Run::handed_over`]), which
//! holds the KV cache handed over, prefills nothing, caches nothing and generates the
//! output.

use std::collections::VecDeque;

use engine_sim::{EngineSpec, KvEvent, LoadSample, Medium, PageKey, PrefixCache};

use crate::host::HostCache;
use crate::sim::HostTier;

/// One request on a modelled engine.
#[derive(Debug)]
pub(crate) struct Run {
    /// The request's index in the trace.
    pub(crate) request: usize,
    /// Its prompt's tokens (the stored pages' tokens go into KV events).
    pub(crate) tokens: Vec<u32>,
    /// Its prompt's page keys.
    pub(crate) keys: Vec<PageKey>,
    /// Output tokens to generate.
    pub(crate) output_tokens: u64,
    /// Arrival time.
    pub(crate) arrived: u64,
    /// Prompt tokens not cached when it arrived (the waiting queue's count).
    waiting_uncached: u64,
    /// Pages matched in the device cache when prefill began.
    matched: usize,
    /// Pages after those loaded back from the host tier.
    loaded: usize,
    /// Pages it holds in the cache.
    held: usize,
    /// Prompt tokens found in the cache.
    pub(crate) cached_tokens: u64,
    /// Its KV cache was handed over by a prefill engine: nothing to prefill or cache.
    handed_over: bool,
}

impl Run {
    /// A request arriving at `arrived`.
    pub(crate) fn new(
        request: usize,
        tokens: Vec<u32>,
        keys: Vec<PageKey>,
        output_tokens: u64,
        arrived: u64,
    ) -> Self {
        Self {
            request,
            tokens,
            keys,
            output_tokens,
            arrived,
            waiting_uncached: 0,
            matched: 0,
            loaded: 0,
            held: 0,
            cached_tokens: 0,
            handed_over: false,
        }
    }

    /// The same request on a decode engine, its KV cache handed over by the prefill
    /// engine whose run this was.
    pub(crate) fn handed_over(self) -> Self {
        Self {
            handed_over: true,
            ..Self::new(
                self.request,
                self.tokens,
                self.keys,
                self.output_tokens,
                self.arrived,
            )
        }
    }

    /// Whether its KV cache was handed over by a prefill engine.
    pub(crate) fn is_handed_over(&self) -> bool {
        self.handed_over
    }

    fn prompt_tokens(&self) -> u64 {
        self.tokens.len() as u64
    }
}

/// One rank of a modelled engine.
#[derive(Debug)]
pub(crate) struct Rank {
    spec: EngineSpec,
    cache: PrefixCache,
    host: Option<HostCache>,
    load_cost: f64,
    load: LoadSample,
    /// Runs waiting for a slot, by id, in arrival order.
    waiting: VecDeque<usize>,
    /// Whether a run is prefilling.
    prefilling: bool,
    /// The load last published and when.
    published: Option<(LoadSample, u64)>,
}

impl Rank {
    pub(crate) fn new(spec: EngineSpec, host: HostTier) -> Self {
        Self {
            spec,
            cache: PrefixCache::new((spec.kv_capacity_tokens / u64::from(spec.page_size)) as usize),
            host: (host.pages > 0).then(|| HostCache::new(host.pages)),
            load_cost: host.load_cost,
            load: LoadSample {
                max_kv_tokens: spec.kv_capacity_tokens,
                max_running_requests: u64::from(spec.max_running_requests),
                ..LoadSample::default()
            },
            waiting: VecDeque::new(),
            prefilling: false,
            published: None,
        }
    }

    /// Queues run `id`, which arrives now; [`next_ready`](Self::next_ready) says
    /// when it starts.
    pub(crate) fn arrive(&mut self, id: usize, run: &mut Run) {
        let page = u64::from(self.spec.page_size);
        let prompt = run.prompt_tokens();
        if run.handed_over {
            run.waiting_uncached = 0;
            self.load.waiting_requests += 1;
            self.load.total_tokens += prompt;
            self.waiting.push_back(id);
            return;
        }
        let device = self.cache.peek(&run.keys);
        let host = self
            .host
            .as_ref()
            .map_or(0, |h| h.run_from(&run.keys, device));
        run.waiting_uncached = prompt - (device + host) as u64 * page;
        self.load.waiting_requests += 1;
        self.load.waiting_uncached_tokens += run.waiting_uncached;
        self.load.total_tokens += prompt;
        self.waiting.push_back(id);
    }

    /// The waiting run to start now, if a slot is free for it (and, with serial
    /// prefill, no prefill is running); the caller then [`start`](Self::start)s it.
    pub(crate) fn next_ready(&mut self) -> Option<usize> {
        let slot_free = self.load.running_requests < u64::from(self.spec.max_running_requests);
        let turn_free = !(self.spec.serial_prefill && self.prefilling);
        if slot_free && turn_free {
            self.waiting.pop_front()
        } else {
            None
        }
    }

    /// Gives `run` a running slot at `now` and holds its cached prefix; returns when
    /// its prefill ends.
    pub(crate) fn start(&mut self, run: &mut Run, now: u64) -> u64 {
        self.load.waiting_requests -= 1;
        self.load.waiting_uncached_tokens -= run.waiting_uncached;
        self.load.running_requests += 1;
        self.load.used_kv_tokens += run.prompt_tokens();
        if run.handed_over {
            return now;
        }
        self.prefilling = true;
        run.matched = self.cache.hold_prefix(&run.keys);
        run.loaded = match &mut self.host {
            Some(host) => {
                let loaded = host.run_from(&run.keys, run.matched);
                // Every page the request found counts as used on the host too, as
                // vLLM's offloading marks a request's blocks at lookup.
                host.touch(&run.keys[..run.matched + loaded]);
                loaded
            }
            None => 0,
        };
        run.held = run.matched;
        run.cached_tokens = (run.matched + run.loaded) as u64 * u64::from(self.spec.page_size);
        now + micros(self.prefill_time(run))
    }

    /// Prefilling `run`'s uncached tokens and loading its host pages back.
    fn prefill_time(&self, run: &Run) -> std::time::Duration {
        let load = run.loaded as u64 * u64::from(self.spec.page_size);
        self.spec.prefill_time(self.uncached(run))
            + self.spec.prefill_time(load).mul_f64(self.load_cost)
    }

    fn uncached(&self, run: &Run) -> u64 {
        run.prompt_tokens() - run.cached_tokens
    }

    /// Ends `run`'s prefill: caches its new pages and returns the events that says,
    /// the time of its first output token and the time of its last.
    pub(crate) fn prefilled(&mut self, run: &mut Run, now: u64) -> (Vec<KvEvent>, u64, u64) {
        // As engine-sim does: each token takes one decode step.
        let step = micros(self.spec.decode_time(1));
        let first_token = now + step.min(step * run.output_tokens);
        let last_token = now + step * run.output_tokens;
        if run.handed_over {
            return (Vec::new(), first_token, last_token);
        }
        let uncached = self.uncached(run);
        self.prefilling = false;
        self.load.prefill_uncached_tokens_total += uncached;
        // The counters give the router the prefill speed: loads are not prefill.
        self.load.prefill_busy_us_total += micros(self.spec.prefill_time(uncached));
        let change = self.cache.insert(&run.keys, run.matched);
        run.held = change.held;
        let mut events = Vec::new();
        if !change.removed.is_empty() {
            events.push(KvEvent::Removed {
                hashes: change.removed,
                medium: Medium::Gpu,
            });
        }
        if !change.stored.is_empty() {
            let first = run.held - change.stored.len();
            events.push(self.stored(run, first, run.held, Medium::Gpu));
        }
        let written = self
            .host
            .as_mut()
            .map(|host| host.write(&run.keys, run.matched, run.held));
        if let Some(written) = written {
            for &(first, n) in &written.stored {
                events.push(self.stored(run, first, first + n, Medium::Cpu));
            }
            if !written.removed.is_empty() {
                events.push(KvEvent::Removed {
                    hashes: written.removed,
                    medium: Medium::Cpu,
                });
            }
        }
        (events, first_token, last_token)
    }

    /// The event storing `run`'s pages `first..end` on `medium`.
    fn stored(&self, run: &Run, first: usize, end: usize, medium: Medium) -> KvEvent {
        let page = self.spec.page_size as usize;
        KvEvent::Stored {
            hashes: run.keys[first..end].iter().map(PageKey::hash).collect(),
            parent: first.checked_sub(1).map(|i| run.keys[i].hash()),
            tokens: run.tokens[first * page..end * page].to_vec(),
            block_size: self.spec.page_size,
            lora_name: None,
            medium,
        }
    }

    /// Ends `run`: gives back its slot, tokens and pages.
    pub(crate) fn finish(&mut self, run: &Run) {
        let used = run.prompt_tokens();
        self.load.total_tokens -= used;
        self.load.running_requests -= 1;
        self.load.used_kv_tokens -= used;
        self.cache.release(&run.keys[..run.held]);
    }

    /// Whether nothing waits, runs or is counted on it: so every rank ends a replay.
    pub(crate) fn is_idle(&self) -> bool {
        let load = &self.load;
        self.waiting.is_empty()
            && [
                load.running_requests,
                load.waiting_requests,
                load.used_kv_tokens,
                load.waiting_uncached_tokens,
                load.total_tokens,
            ]
            .iter()
            .all(|n| *n == 0)
    }

    /// The load to publish at `now`, when it changed or has not been published for
    /// `republish` microseconds (as engine-sim's publisher decides).
    pub(crate) fn publish(&mut self, now: u64, republish: u64) -> Option<LoadSample> {
        if self
            .published
            .is_some_and(|(last, at)| last == self.load && now - at < republish)
        {
            return None;
        }
        self.published = Some((self.load, now));
        Some(self.load)
    }
}

/// A duration in whole microseconds.
pub(crate) fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
