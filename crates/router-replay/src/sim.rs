//! The replay loop: requests arrive at their trace times, the router's selection code
//! picks their engines, modelled engines serve them, and the engines' load reports
//! and KV events reach the router as they would over ZeroMQ, all on a virtual clock.
//!
//! The clock is tokio's, paused: the loop moves it from one event to the next, so
//! everything that reads the time (load freshness, affinity expiry) sees replay time.
//! Events at the same microsecond run in the order they were scheduled, which makes a
//! replay a function of its inputs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use engine_sim::{
    EngineSpec, EventForm, PageKey, encode_batch, encode_load_stat, extend_page_keys,
};
use router_buckets::{EnginePicks, SelectError, Selection};
use router_policy::{Pick, PrefixMemo, RequestFacts};
use router_state::kv_events::decode_batch;
use router_state::{EngineId, InflightGuard, LoadReport, Role};

use crate::closed_loop::ClosedLoop;
use crate::engine::{Rank, Run, micros};
use crate::error::{ModelDefect, ReplayError, SettingsError, TraceMismatch};
use crate::report::{Outcome, RunReport};
use crate::router::{Model, Router};
use crate::trace::{Segment, TraceRequest};

mod settings;

pub use settings::{Arrivals, HostTier, LaggingFeeds, ReplaySettings};
pub(crate) use settings::{
    MAX_FIRST_TOKEN_DELAY, MAX_HOST_PAGES, MAX_KV_DELAY, MAX_LOAD_COST, MAX_RATE, MAX_SLOTS,
    MIN_RATE,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The request at this index of the trace arrives.
    Arrive(usize),
    /// A run's prefill ends.
    Prefilled(usize),
    /// A run's last token is generated.
    Finish(usize),
    /// Every rank looks at its load to publish it.
    Publish,
    /// The oldest KV-event batch in flight from an engine reaches the router.
    Deliver(usize),
}

/// A run on an engine's rank, with the router's in-flight counts for it: its
/// engine's and, on a decode engine, its prefill engine's too (the router counts a
/// pair's both legs until the answer ends).
#[derive(Debug)]
struct Placed {
    run: Run,
    engine: usize,
    rank: usize,
    _guards: Vec<InflightGuard>,
    /// Where a prefill engine's run goes once prefilled: the decode engine picked
    /// with it.
    decode: Option<Leg>,
}

/// The decode engine of a prefill/decode pick: its engine, rank and the router's
/// in-flight count for it, taken when both legs are sent.
#[derive(Debug)]
struct Leg {
    engine: usize,
    rank: usize,
    guard: InflightGuard,
}

/// A modelled engine.
#[derive(Debug)]
struct ModelEngine {
    id: EngineId,
    model: String,
    /// Whether it is a decode engine (a request's outcome names its prefill engine).
    decode: bool,
    ranks: Vec<Rank>,
    /// How long its KV-event batches take to reach the router, microseconds.
    kv_delay: u64,
    /// Whether it publishes no KV events.
    silent: bool,
    /// Its batches on their way, oldest first: `(rank, payload)`.
    in_flight: VecDeque<(u32, Vec<u8>)>,
}

/// Answers of more output tokens than this have their pace measured (the relay
/// measures those with at least sixteen events after the first).
const STREAMED_TOKENS_MEASURED: u64 = 16;

/// The most sessions whose latest prompt's page keys are kept; past it a session's
/// next turn hashes its whole prompt.
const MAX_MEMO_SESSIONS: usize = 1 << 16;

/// Page keys of sessions' latest prompts, so a later turn hashes only its new pages.
#[derive(Debug, Default)]
struct KeyMemo {
    sessions: HashMap<String, (Vec<Segment>, Vec<PageKey>)>,
}

impl KeyMemo {
    fn keys(
        &mut self,
        request: &TraceRequest,
        tokens: &[u32],
        page_size: usize,
        last_turn: bool,
    ) -> Vec<PageKey> {
        let Some(session) = &request.session else {
            return engine_sim::page_keys(tokens, page_size, None);
        };
        let mut keys = match self.sessions.remove(session) {
            Some((segments, mut keys)) => {
                let shared: u64 = segments
                    .iter()
                    .zip(&request.prompt)
                    .take_while(|(a, b)| a == b)
                    .map(|(a, _)| a.len())
                    .sum();
                keys.truncate((shared / page_size as u64) as usize);
                keys
            }
            None => Vec::new(),
        };
        extend_page_keys(&mut keys, tokens, page_size, None);
        if !last_turn && self.sessions.len() < MAX_MEMO_SESSIONS {
            self.sessions
                .insert(session.clone(), (request.prompt.clone(), keys.clone()));
        }
        keys
    }
}

/// Replays `trace` through `router` against engines modelled as `settings` says.
pub(crate) async fn run(
    router: &Router,
    trace: &[TraceRequest],
    settings: &ReplaySettings,
) -> Result<RunReport, ReplayError> {
    let mut replay = Replay::new(router, trace, settings)?;
    if let Some(first) = trace.first() {
        match &mut replay.clients {
            None => replay.queue.at(first.at_us, Event::Arrive(0)),
            Some(clients) => {
                while let Some(index) = clients.send() {
                    replay.queue.at(0, Event::Arrive(index));
                }
            }
        }
        replay.queue.at(0, Event::Publish);
    }
    while let Some((at, event)) = replay.queue.next() {
        if at > replay.now {
            tokio::time::advance(Duration::from_micros(at - replay.now)).await;
            replay.now = at;
        }
        match event {
            Event::Arrive(index) => replay.arrive(index).await?,
            Event::Prefilled(id) => replay.prefilled(id),
            Event::Finish(id) => replay.finish(id),
            Event::Publish => replay.publish()?,
            Event::Deliver(engine) => replay.deliver(engine)?,
        }
    }
    debug_assert!(
        replay.live == 0
            && replay
                .engines
                .iter()
                .all(|e| e.ranks.iter().all(Rank::is_idle)),
        "every run ended and gave back what it held"
    );
    // Time outside the engine model comes after everything the model decided.
    let delay = u64::try_from(settings.first_token_delay.as_micros()).unwrap_or(u64::MAX);
    for outcome in &mut replay.outcomes {
        for time in [&mut outcome.ttft_us, &mut outcome.finished_us] {
            *time = time.map(|t| t.saturating_add(delay));
        }
    }
    // Outcomes name plain and prefill engines, the ones holding the prompts: the
    // report's engines are those.
    let mut named = Vec::new();
    let mut place = vec![None; replay.engines.len()];
    for (i, engine) in replay.engines.iter().enumerate() {
        if !engine.decode {
            place[i] = Some(named.len());
            named.push(engine.id.as_str().to_owned());
        }
    }
    for outcome in &mut replay.outcomes {
        outcome.engine = outcome.engine.and_then(|e| place[e]);
    }
    Ok(RunReport::new(replay.outcomes, named))
}

/// A replay in progress.
struct Replay<'a> {
    router: &'a Router,
    trace: &'a [TraceRequest],
    spec: EngineSpec,
    engines: Vec<ModelEngine>,
    engine_index: HashMap<EngineId, usize>,
    /// Whether each request is its session's last.
    last_turn: Vec<bool>,
    /// The model of requests that name none.
    only_model: Option<&'a String>,
    /// The clock at the trace's start.
    start: tokio::time::Instant,
    /// Microseconds since the trace's start.
    now: u64,
    queue: Schedule,
    /// Runs by id; an id is reused once its run ends.
    runs: Vec<Option<Placed>>,
    free: Vec<usize>,
    outcomes: Vec<Outcome>,
    memo: KeyMemo,
    /// The next request to arrive, in an open loop.
    next: usize,
    /// The clients of a closed loop.
    clients: Option<ClosedLoop<'a>>,
    /// Runs placed and not finished.
    live: usize,
    tick: u64,
    republish: u64,
}

impl<'a> Replay<'a> {
    fn new(
        router: &'a Router,
        trace: &'a [TraceRequest],
        settings: &ReplaySettings,
    ) -> Result<Self, ReplayError> {
        let spec = settings.engine;
        for (model_id, model) in &router.models {
            if model.block_size != spec.page_size {
                return Err(SettingsError::PageSize {
                    model: model_id.clone(),
                    block_size: model.block_size,
                    page_size: spec.page_size,
                }
                .into());
            }
        }
        let lagging = settings.lagging_feeds;
        if lagging.engines > router.engines.len() {
            return Err(SettingsError::LaggingFeeds {
                lagging: lagging.engines,
                engines: router.engines.len(),
            }
            .into());
        }
        if settings.silent_kv_engines > router.engines.len() {
            return Err(SettingsError::SilentEngines {
                silent: settings.silent_kv_engines,
                engines: router.engines.len(),
            }
            .into());
        }
        let engines: Vec<ModelEngine> = router
            .engines
            .iter()
            .enumerate()
            .map(|(i, (id, model, dp, role))| ModelEngine {
                id: id.clone(),
                model: model.clone(),
                decode: *role == Role::Decode,
                ranks: (0..*dp)
                    .map(|_| Rank::new(spec, settings.host_tier))
                    .collect(),
                kv_delay: micros(if i < lagging.engines {
                    lagging.delay
                } else {
                    settings.kv_delay
                }),
                silent: i < settings.silent_kv_engines,
                in_flight: VecDeque::new(),
            })
            .collect();
        Ok(Self {
            router,
            trace,
            spec,
            engine_index: engines
                .iter()
                .enumerate()
                .map(|(i, e)| (e.id.clone(), i))
                .collect(),
            engines,
            last_turn: last_turns(trace),
            only_model: (router.models.len() == 1)
                .then(|| router.models.keys().next())
                .flatten(),
            start: tokio::time::Instant::now(),
            now: 0,
            queue: Schedule::default(),
            runs: Vec::new(),
            free: Vec::new(),
            outcomes: trace.iter().map(Outcome::arrived).collect(),
            memo: KeyMemo::default(),
            next: 0,
            clients: match settings.arrivals {
                Arrivals::Open => None,
                Arrivals::Closed { clients } => Some(ClosedLoop::new(trace, clients)),
            },
            live: 0,
            tick: micros(engine_sim::LOAD_TICK),
            republish: micros(engine_sim::LOAD_REPUBLISH),
        })
    }

    /// The request at `index` arrives: the router picks its engine, where it queues.
    async fn arrive(&mut self, index: usize) -> Result<(), ReplayError> {
        if self.clients.is_none() {
            self.next = index + 1;
            if let Some(following) = self.trace.get(self.next) {
                self.queue.at(following.at_us, Event::Arrive(self.next));
            }
        }
        self.outcomes[index].arrived_us = self.now;
        let trace = self.trace;
        let request = &trace[index];
        let (model_id, model) = self.model_of(index, request)?;
        let tokens = request.tokens();
        let Some(selection) = self.select(index, model_id, model, &tokens).await? else {
            self.completed(index);
            return Ok(());
        };
        match selection.pick.engines {
            EnginePicks::Plain(mut pick) => self.place(index, &mut pick, tokens, None),
            // Both legs are sent at once: the decode engine counts the request in
            // flight from now, and takes it once the prefill engine is done.
            EnginePicks::Pd {
                mut prefill,
                mut decode,
            } => {
                let engine = self.engine_index[decode.engine.id()];
                let (rank, guard) = self.rank_and_guard(&mut decode, engine);
                let leg = Leg {
                    engine,
                    rank,
                    guard,
                };
                self.place(index, &mut prefill, tokens, Some(leg));
            }
        }
        Ok(())
    }

    /// The request at `index` completed (served, refused or failed): in a closed
    /// loop, its client sends its next request now, as may a client that waited for
    /// its session.
    fn completed(&mut self, index: usize) {
        if let Some(clients) = &mut self.clients {
            clients.completed(index);
            while let Some(next) = clients.send() {
                self.queue.at(self.now, Event::Arrive(next));
            }
        }
    }

    /// The id and the model of the request at `index` (the only model when it names
    /// none).
    fn model_of(
        &self,
        index: usize,
        request: &'a TraceRequest,
    ) -> Result<(&'a str, &'a Model), ReplayError> {
        let model_id = match (&request.model, self.only_model) {
            (Some(m), _) | (None, Some(m)) => m.as_str(),
            (None, None) => {
                return Err(mismatch(index, TraceMismatch::NoModel));
            }
        };
        let Some(model) = self.router.models.get(model_id) else {
            return Err(mismatch(
                index,
                TraceMismatch::UnknownModel(model_id.to_owned()),
            ));
        };
        Ok((model_id, model))
    }

    /// The model's selection for the request at `index` with prompt `tokens`, or
    /// `None` when the router answers it with an error, which its outcome records.
    async fn select(
        &mut self,
        index: usize,
        model_id: &str,
        model: &Model,
        tokens: &[u32],
    ) -> Result<Option<Selection>, ReplayError> {
        let request = &self.trace[index];
        let prefix = PrefixMemo::new();
        let bucket_request = RequestFacts::new(model_id, tokens.len() as u64)
            .with_max_output_tokens(Some(u64::from(request.output_tokens)))
            .map_err(|e| mismatch(index, TraceMismatch::Refused(e)))?
            .with_token_ids(Some(tokens))
            .with_prefix_memo(Some(&prefix))
            .with_session_key(request.session.as_deref());
        match model
            .resolver
            .select(&self.router.registry.snapshot(), &bucket_request)
            .await
        {
            Ok(selection) => Ok(Some(selection)),
            Err(SelectError::AtCapacity { .. }) => {
                self.outcomes[index].rejected = true;
                Ok(None)
            }
            Err(SelectError::Stopped { error, .. }) => {
                Err(mismatch(index, TraceMismatch::Refused(error)))
            }
            // No bucket takes it, or no engine: the router answers an error.
            Err(_) => {
                self.outcomes[index].failed = true;
                Ok(None)
            }
        }
    }

    /// Places the request at `index` on the engine `pick` chose, where it queues on
    /// the rank the router's dispatch chooses; a prefill engine's run then goes to
    /// `decode`.
    fn place(&mut self, index: usize, pick: &mut Pick, tokens: Vec<u32>, decode: Option<Leg>) {
        let request = &self.trace[index];
        let engine = self.engine_index[pick.engine.id()];
        let (rank, guard) = self.rank_and_guard(pick, engine);
        self.outcomes[index].engine = Some(engine);
        self.outcomes[index].reason = Some(pick.reason.as_str().to_owned());
        let keys = self.memo.keys(
            request,
            &tokens,
            self.spec.page_size as usize,
            self.last_turn[index],
        );
        let run = Run::new(
            index,
            tokens,
            keys,
            u64::from(request.output_tokens),
            self.now,
        );
        self.live += 1;
        self.queue_run(Placed {
            run,
            engine,
            rank,
            _guards: vec![guard],
            decode,
        });
    }

    /// Queues `placed` on its rank, starting it if it can start now.
    fn queue_run(&mut self, mut placed: Placed) {
        let id = self.run_id();
        let (engine, rank) = (placed.engine, placed.rank);
        self.engines[engine].ranks[rank].arrive(id, &mut placed.run);
        self.runs[id] = Some(placed);
        self.start_ready(engine, rank);
    }

    /// A free run id: one whose run ended, else a new one.
    fn run_id(&mut self) -> usize {
        self.free.pop().unwrap_or_else(|| {
            self.runs.push(None);
            self.runs.len() - 1
        })
    }

    /// The rank a pick's request goes to, as the router's dispatch chooses it, and
    /// the router's in-flight count for it.
    fn rank_and_guard(&self, pick: &mut Pick, engine: usize) -> (usize, InflightGuard) {
        let load = &self.router.load;
        let ranks = self.engines[engine].ranks.len() as u32;
        let rank = (ranks > 1)
            .then(|| {
                pick.rank
                    .filter(|r| *r < ranks)
                    .or_else(|| load.least_loaded_rank(pick.engine.id()))
            })
            .flatten();
        let guard = pick.guard(load, rank);
        (rank.unwrap_or(0) as usize, guard)
    }

    /// A run's prefill ends: its first token's time is known, its pages are cached
    /// and their events sent.
    fn prefilled(&mut self, id: usize) {
        let now = self.now;
        let placed = self.runs[id].as_mut().expect("a prefilling run is placed");
        let (engine, rank) = (placed.engine, placed.rank);
        let (events, first_token, last_token) =
            self.engines[engine].ranks[rank].prefilled(&mut placed.run, now);
        let outcome = &mut self.outcomes[placed.run.request];
        if !placed.run.is_handed_over() {
            outcome.cached_tokens = placed.run.cached_tokens;
        }
        if placed.decode.is_none() {
            outcome.ttft_us = Some(first_token - placed.run.arrived);
        }
        let indexed = self.router.models[&self.engines[engine].model]
            .index
            .is_some();
        if !events.is_empty() && indexed && !self.engines[engine].silent {
            let payload = encode_batch(seconds(now), &events, rank as u32, EventForm::Map);
            let model = &mut self.engines[engine];
            model.in_flight.push_back((rank as u32, payload));
            self.queue.at(now + model.kv_delay, Event::Deliver(engine));
        }
        match self.runs[id].as_mut().and_then(|p| p.decode.take()) {
            Some(leg) => self.hand_over(id, leg),
            None => self.queue.at(last_token, Event::Finish(id)),
        }
        self.start_ready(engine, rank);
    }

    /// A prefill engine's run `id` is prefilled: the prefill engine gives it back and
    /// the decode engine `leg` takes its KV cache and generates its output.
    fn hand_over(&mut self, id: usize, leg: Leg) {
        let placed = self.runs[id].take().expect("a prefilled run is placed");
        self.free.push(id);
        self.engines[placed.engine].ranks[placed.rank].finish(&placed.run);
        let mut guards = placed._guards;
        guards.push(leg.guard);
        self.queue_run(Placed {
            run: placed.run.handed_over(),
            engine: leg.engine,
            rank: leg.rank,
            _guards: guards,
            decode: None,
        });
    }

    /// A run's last token is generated: it gives everything back.
    fn finish(&mut self, id: usize) {
        let placed = self.runs[id].take().expect("a finishing run is placed");
        self.free.push(id);
        self.live -= 1;
        let outcome = &mut self.outcomes[placed.run.request];
        outcome.finished_us = Some(self.now);
        // The router measures the pace of streamed answers, as its relay does: from
        // the first token to the last, over the tokens after the first.
        let tokens = placed.run.output_tokens;
        if let (Some(ttft), true) = (outcome.ttft_us, tokens > STREAMED_TOKENS_MEASURED) {
            let first = placed.run.arrived + ttft;
            let per_token = (self.now - first) / (tokens - 1);
            self.router.load.observe_tpot(
                &self.engines[placed.engine].id,
                Duration::from_micros(per_token),
            );
        }
        self.engines[placed.engine].ranks[placed.rank].finish(&placed.run);
        self.start_ready(placed.engine, placed.rank);
        self.completed(placed.run.request);
    }

    /// Starts every run of a rank that can start now, scheduling its prefill's end.
    fn start_ready(&mut self, engine: usize, rank: usize) {
        let rank = &mut self.engines[engine].ranks[rank];
        while let Some(id) = rank.next_ready() {
            let placed = self.runs[id].as_mut().expect("a waiting run is placed");
            self.queue
                .at(rank.start(&mut placed.run, self.now), Event::Prefilled(id));
        }
    }

    /// Every rank publishes its load if it changed (or has not for a while); the
    /// router decodes and applies each report.
    fn publish(&mut self) -> Result<(), ReplayError> {
        let received = self.start + Duration::from_micros(self.now);
        for engine in &mut self.engines {
            for (r, rank) in engine.ranks.iter_mut().enumerate() {
                let Some(sample) = rank.publish(self.now, self.republish) else {
                    continue;
                };
                let payload = encode_load_stat(&sample, Some(r as u32));
                let report = LoadReport::decode(&payload).map_err(ModelDefect::LoadReport)?;
                self.router
                    .load
                    .ingest(&engine.id, r as u32, report, received)
                    .map_err(ModelDefect::Ingest)?;
            }
        }
        let to_come = match &self.clients {
            None => self.next < self.trace.len(),
            Some(clients) => !clients.done(),
        };
        if to_come || self.live > 0 {
            let mut at = self.now + self.tick;
            if self.live == 0
                && self.clients.is_none()
                && let Some(next) = self.trace.get(self.next)
            {
                // Idle, nothing changes until the next arrival: the last tick before
                // it publishes what every tick between would have.
                let ticks = next.at_us.saturating_sub(self.now) / self.tick;
                at = self.now + self.tick * ticks.max(1);
            }
            self.queue.at(at, Event::Publish);
        }
        Ok(())
    }

    /// An engine's oldest KV-event batch in flight reaches the router's index.
    fn deliver(&mut self, engine: usize) -> Result<(), ReplayError> {
        let engine = &mut self.engines[engine];
        let (rank, payload) = engine.in_flight.pop_front().expect("a batch is in flight");
        let batch = decode_batch(&payload).map_err(ModelDefect::KvBatch)?;
        if let Some(index) = &self.router.models[&engine.model].index {
            let outcome = index.apply(&engine.id, rank, &batch);
            // The model's events are well formed: a skip is a defect of the model.
            if let Some(skipped) = outcome.skipped.first() {
                return Err(ModelDefect::Skipped {
                    engine: engine.id.clone(),
                    reason: *skipped,
                }
                .into());
            }
        }
        Ok(())
    }
}

/// Microseconds of the replay's clock as the seconds a batch is stamped with.
fn seconds(micros: u64) -> f64 {
    micros as f64 / 1e6
}

/// Events by time; those at the same microsecond in the order they were scheduled.
#[derive(Debug, Default)]
struct Schedule {
    queue: BinaryHeap<Reverse<(u64, u64, Event)>>,
    scheduled: u64,
}

impl Schedule {
    fn at(&mut self, at: u64, event: Event) {
        self.scheduled += 1;
        self.queue.push(Reverse((at, self.scheduled, event)));
    }

    fn next(&mut self) -> Option<(u64, Event)> {
        self.queue.pop().map(|Reverse((at, _, event))| (at, event))
    }
}

/// For each request, whether it is its session's last.
fn last_turns(trace: &[TraceRequest]) -> Vec<bool> {
    let mut seen = std::collections::HashSet::new();
    let mut last = vec![false; trace.len()];
    for (i, request) in trace.iter().enumerate().rev() {
        last[i] = request.session.as_ref().is_none_or(|s| seen.insert(s));
    }
    last
}

/// The error of the request at `index` asking for what the configuration does not
/// serve.
fn mismatch(index: usize, problem: TraceMismatch) -> ReplayError {
    ReplayError::Trace {
        request: index + 1,
        problem,
    }
}

#[cfg(test)]
mod tests;
