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
use router_buckets::{BucketRequest, SelectError};
use router_policy::PrefixMemo;
use router_state::kv_events::decode_batch;
use router_state::{EngineId, InflightGuard, LoadReport};

use crate::ReplayError;
use crate::engine::{Rank, Run, micros};
use crate::report::{Outcome, RunReport};
use crate::router::Router;
use crate::trace::{Segment, TraceRequest};

/// How the modelled engines and their feeds behave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplaySettings {
    /// Every engine's timing, slots and cache. Its page size must be the model's
    /// block size, as on a real fleet (the router's index would not match otherwise).
    pub engine: EngineSpec,
    /// How long a KV-event batch takes from the engine to the router's index.
    pub kv_delay: Duration,
    /// The seed given to policies that draw random numbers and name no seed.
    pub seed: u64,
}

impl Default for ReplaySettings {
    fn default() -> Self {
        Self {
            engine: EngineSpec::default(),
            kv_delay: Duration::from_millis(1),
            seed: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The trace's next request arrives.
    Arrive,
    /// A run's prefill ends.
    Prefilled(usize),
    /// A run's last token is generated.
    Finish(usize),
    /// Every rank looks at its load to publish it.
    Publish,
    /// The oldest KV-event batch in flight reaches the router.
    Deliver,
}

/// A run on an engine's rank, with the router's in-flight count for it.
#[derive(Debug)]
struct Placed {
    run: Run,
    engine: usize,
    rank: usize,
    _guard: InflightGuard,
}

/// A modelled engine.
#[derive(Debug)]
struct ModelEngine {
    id: EngineId,
    model: String,
    ranks: Vec<Rank>,
}

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
        if !last_turn {
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
    let spec = settings.engine;
    let mut engines: Vec<ModelEngine> = router
        .engines
        .iter()
        .map(|(id, model, dp)| ModelEngine {
            id: id.clone(),
            model: model.clone(),
            ranks: (0..*dp).map(|_| Rank::new(spec)).collect(),
        })
        .collect();
    let engine_index: HashMap<EngineId, usize> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| (e.id.clone(), i))
        .collect();
    for (model_id, model) in &router.models {
        if model.block_size != spec.page_size {
            return Err(ReplayError::Config(format!(
                "model {model_id} has block_size {} but the engines' page size is {}",
                model.block_size, spec.page_size
            )));
        }
    }
    let last_turn = last_turns(trace);
    let only_model = (router.models.len() == 1)
        .then(|| router.models.keys().next())
        .flatten();

    let start = tokio::time::Instant::now();
    let mut now = 0u64;
    let mut queue = Schedule::default();
    let mut runs: Vec<Option<Placed>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut in_flight: VecDeque<(usize, u32, Vec<u8>)> = VecDeque::new();
    let mut outcomes: Vec<Outcome> = trace.iter().map(Outcome::arrived).collect();
    let mut memo = KeyMemo::default();
    let mut next = 0usize;
    let mut live = 0usize;
    let tick = micros(engine_sim::LOAD_TICK);
    let republish = micros(engine_sim::LOAD_REPUBLISH);
    let kv_delay = micros(settings.kv_delay);

    if let Some(first) = trace.first() {
        queue.at(first.at_us, Event::Arrive);
        queue.at(0, Event::Publish);
    }
    while let Some((at, event)) = queue.next() {
        if at > now {
            tokio::time::advance(Duration::from_micros(at - now)).await;
            now = at;
        }
        match event {
            Event::Arrive => {
                let index = next;
                next += 1;
                if let Some(following) = trace.get(next) {
                    queue.at(following.at_us, Event::Arrive);
                }
                let request = &trace[index];
                let model_id = match (&request.model, only_model) {
                    (Some(m), _) => m.as_str(),
                    (None, Some(m)) => m.as_str(),
                    (None, None) => {
                        return Err(ReplayError::Trace(format!(
                            "request {} names no model and the configuration serves several",
                            index + 1
                        )));
                    }
                };
                let Some(model) = router.models.get(model_id) else {
                    return Err(ReplayError::Trace(format!(
                        "request {} asks for model {model_id:?}, which the configuration does not serve",
                        index + 1
                    )));
                };
                let tokens = request.tokens();
                let prefix = PrefixMemo::new();
                let picked = {
                    let bucket_request = BucketRequest::new(model_id, tokens.len() as u64)
                        .with_max_output_tokens(Some(u64::from(request.output_tokens)))
                        .map_err(|e| ReplayError::Trace(format!("request {}: {e}", index + 1)))?
                        .with_token_ids(Some(&tokens))
                        .with_prefix_memo(Some(&prefix))
                        .with_session_key(request.session.as_deref());
                    model
                        .resolver
                        .select(&router.registry.snapshot(), &bucket_request)
                        .await
                };
                let selection = match picked {
                    Ok(selection) => selection,
                    Err(SelectError::AtCapacity { .. }) => {
                        outcomes[index].rejected = true;
                        continue;
                    }
                    Err(e) => {
                        return Err(ReplayError::Trace(format!("request {}: {e}", index + 1)));
                    }
                };
                let Some(pick) = selection.pick.engines.iter().next() else {
                    continue;
                };
                let engine = engine_index[pick.engine.id()];
                let dp = engines[engine].ranks.len() as u32;
                let rank = if dp > 1 {
                    pick.rank
                        .filter(|r| *r < dp)
                        .or_else(|| router.load.least_loaded_rank(pick.engine.id()))
                } else {
                    None
                };
                let guard = match rank {
                    Some(r) => router.load.acquire_rank(pick.engine.id(), r),
                    None => router.load.acquire(pick.engine.id()),
                };
                let rank = rank.unwrap_or(0) as usize;
                outcomes[index].engine = Some(engine);
                outcomes[index].reason = Some(pick.reason.as_str().to_owned());
                let keys = memo.keys(request, &tokens, spec.page_size as usize, last_turn[index]);
                let run = Run::new(index, tokens, keys, u64::from(request.output_tokens), now);
                let id = free.pop().unwrap_or_else(|| {
                    runs.push(None);
                    runs.len() - 1
                });
                let mut placed = Placed {
                    run,
                    engine,
                    rank,
                    _guard: guard,
                };
                live += 1;
                engines[engine].ranks[rank].arrive(id, &mut placed.run);
                runs[id] = Some(placed);
                start_ready(&mut engines[engine].ranks[rank], &mut runs, now, &mut queue);
            }
            Event::Prefilled(id) => {
                let placed = runs[id].as_mut().expect("a prefilling run is placed");
                let rank = &mut engines[placed.engine].ranks[placed.rank];
                let (events, first_token, last_token) = rank.prefilled(&mut placed.run, now);
                let outcome = &mut outcomes[placed.run.request];
                outcome.ttft_us = Some(first_token - placed.run.arrived);
                outcome.cached_tokens = placed.run.cached_tokens;
                if !events.is_empty()
                    && router.models[&engines[placed.engine].model].index.is_some()
                {
                    let payload = encode_batch(
                        now as f64 / 1e6,
                        &events,
                        placed.rank as u32,
                        EventForm::Map,
                    );
                    in_flight.push_back((placed.engine, placed.rank as u32, payload));
                    queue.at(now + kv_delay, Event::Deliver);
                }
                queue.at(last_token, Event::Finish(id));
                let (engine, rank) = (placed.engine, placed.rank);
                start_ready(&mut engines[engine].ranks[rank], &mut runs, now, &mut queue);
            }
            Event::Finish(id) => {
                let placed = runs[id].take().expect("a finishing run is placed");
                free.push(id);
                live -= 1;
                outcomes[placed.run.request].finished_us = Some(now);
                let rank = &mut engines[placed.engine].ranks[placed.rank];
                rank.finish(&placed.run);
                start_ready(rank, &mut runs, now, &mut queue);
            }
            Event::Publish => {
                for engine in &mut engines {
                    for (r, rank) in engine.ranks.iter_mut().enumerate() {
                        let Some(sample) = rank.publish(now, republish) else {
                            continue;
                        };
                        let payload = encode_load_stat(&sample, Some(r as u32));
                        let report = LoadReport::decode(&payload).map_err(|e| {
                            ReplayError::Model(format!("a load report did not decode: {e}"))
                        })?;
                        router
                            .load
                            .ingest(
                                &engine.id,
                                r as u32,
                                report,
                                start + Duration::from_micros(now),
                            )
                            .map_err(|e| ReplayError::Model(e.to_string()))?;
                    }
                }
                if next < trace.len() || live > 0 {
                    queue.at(now + tick, Event::Publish);
                }
            }
            Event::Deliver => {
                let (engine, rank, payload) = in_flight.pop_front().expect("a batch is in flight");
                let batch = decode_batch(&payload).map_err(|e| {
                    ReplayError::Model(format!("a KV-event batch did not decode: {e}"))
                })?;
                let model = &router.models[&engines[engine].model];
                if let Some(index) = &model.index {
                    index.apply(&engines[engine].id, rank, &batch);
                }
            }
        }
    }
    Ok(RunReport::new(
        outcomes,
        engines.iter().map(|e| e.id.as_str().to_owned()).collect(),
    ))
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

/// Starts every run of `rank` that can start at `now`, scheduling its prefill's end.
fn start_ready(rank: &mut Rank, runs: &mut [Option<Placed>], now: u64, queue: &mut Schedule) {
    while let Some(id) = rank.next_ready() {
        let placed = runs[id].as_mut().expect("a waiting run is placed");
        queue.at(rank.start(&mut placed.run, now), Event::Prefilled(id));
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

#[cfg(test)]
mod tests;
