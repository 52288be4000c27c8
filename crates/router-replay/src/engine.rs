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

use std::collections::VecDeque;

use engine_sim::{EngineSpec, KvEvent, LoadSample, PageKey, PrefixCache};

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
    /// Pages matched in the cache when prefill began.
    matched: usize,
    /// Pages it holds in the cache.
    held: usize,
    /// Prompt tokens found in the cache.
    pub(crate) cached_tokens: u64,
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
            held: 0,
            cached_tokens: 0,
        }
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
    load: LoadSample,
    /// Runs waiting for a slot, by id, in arrival order.
    waiting: VecDeque<usize>,
    /// Whether a run is prefilling.
    prefilling: bool,
    /// The load last published and when.
    published: Option<(LoadSample, u64)>,
}

impl Rank {
    pub(crate) fn new(spec: EngineSpec) -> Self {
        Self {
            spec,
            cache: PrefixCache::new((spec.kv_capacity_tokens / u64::from(spec.page_size)) as usize),
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
        run.waiting_uncached = prompt - self.cache.peek(&run.keys) as u64 * page;
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
        self.prefilling = true;
        run.matched = self.cache.hold_prefix(&run.keys);
        run.held = run.matched;
        run.cached_tokens = run.matched as u64 * u64::from(self.spec.page_size);
        now + micros(self.spec.prefill_time(self.uncached(run)))
    }

    fn uncached(&self, run: &Run) -> u64 {
        run.prompt_tokens() - run.cached_tokens
    }

    /// Ends `run`'s prefill: caches its new pages and returns the events that says,
    /// the time of its first output token and the time of its last.
    pub(crate) fn prefilled(&mut self, run: &mut Run, now: u64) -> (Vec<KvEvent>, u64, u64) {
        let uncached = self.uncached(run);
        self.prefilling = false;
        self.load.prefill_uncached_tokens_total += uncached;
        self.load.prefill_busy_us_total += micros(self.spec.prefill_time(uncached));
        let change = self.cache.insert(&run.keys, run.matched);
        run.held = change.held;
        let mut events = Vec::new();
        if !change.removed.is_empty() {
            events.push(KvEvent::Removed {
                hashes: change.removed,
            });
        }
        if !change.stored.is_empty() {
            let page = self.spec.page_size as usize;
            let first = run.held - change.stored.len();
            events.push(KvEvent::Stored {
                hashes: change.stored,
                parent: change.parent,
                tokens: run.tokens[first * page..run.held * page].to_vec(),
                block_size: self.spec.page_size,
                lora_name: None,
            });
        }
        // As engine-sim does: each token takes one decode step.
        let step = micros(self.spec.decode_time(1));
        let first_token = now + step.min(step * run.output_tokens);
        (events, first_token, now + step * run.output_tokens)
    }

    /// Ends `run`: gives back its slot, tokens and pages.
    pub(crate) fn finish(&mut self, run: &Run) {
        let used = run.prompt_tokens();
        self.load.total_tokens -= used;
        self.load.running_requests -= 1;
        self.load.used_kv_tokens -= used;
        self.cache.release(&run.keys[..run.held]);
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
