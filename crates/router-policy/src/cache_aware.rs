//! Cache-aware selection: send a request to an engine that already holds its
//! prompt's prefix, unless load or admission say otherwise; on a miss, take the least
//! pressured of `min_load_choices` samples.
//!
//! Within one group's candidates:
//! 1. Look the prefix up once per request (through the request's [`PrefixMemo`](crate::PrefixMemo)).
//! 2. Holders: engines credited with at least `min_matched_tokens` of the prompt (and
//!    passing the ratio gate), a token held only on a slower tier counting
//!    `slower_tier_weight`; uncached work = prompt - credited.
//! 3. Order holders by uncached work, then prefill pressure, then candidate order
//!    (id order, as a group gives them), and keep the best
//!    [`CandidateBounds::count`] of them.
//! 4. Soft queue gate: holders reporting `engine_queue_limit` waiting requests are
//!    set aside while others are usable. If all are set aside: without a saturation
//!    floor they are all kept (a saturation pin); with one, the least pressured is
//!    pinned only when no engine of the group is below the floor, else the request
//!    goes cold to an engine with room.
//! 5. Admission is checked on the usable holders in order; the winner is the first
//!    admitted holder (the least uncached work), except that an admitted holder within
//!    `switch_margin_tokens` of it wins when the pressure guard finds the current
//!    choice clearly worse. Holders past the margin could not win and are not
//!    checked: an explanation shows no admission of theirs, and an admission check
//!    that fails on one of them does not fail the pick. Steps 3 to 5 walk the
//!    holders in order and read a run of holders of equal uncached work when they
//!    reach it, so the load of holders past the margin is not read either.
//!    Rejections never turn into a cold fallback: if every usable holder is rejected,
//!    the pick fails and the bucket loop moves on.
//! 6. Miss (or source unavailable, or no token ids): power of k over the group's
//!    engines below the queue limit (all when none is), then admission on the winner.
//! 7. The winner is told to the source ([`CacheSource::routed`]) unless the pick is a
//!    dry run, so a source counting routed pages credits the engine with the prompt
//!    before its KV events announce it.
//!
//! Of more than [`CACHE_AWARE_WINDOW`] candidates, steps 3, 5 and 6 read the load of a
//! window of them (the holders with the least uncached work; a spread sample for the
//! load bound's mean and for a miss), so a pick's load reads do not grow with the
//! group. The holders are read from the source's answer deepest first, each found
//! among the candidates by its id (the policy keeps the places of the candidate lists
//! it was given last), so neither do its reads of the answer.

mod config;
mod order;
mod places;
mod score;
mod window;

use std::cmp::Ordering;
use std::sync::Arc;

use router_state::{
    Engine, EngineListMemo, EngineObservation, EngineReportedLoadTable, LoadSnapshot, Reservation,
    Role,
};

pub use self::config::{CacheAwareConfig, CacheScore, CandidateBounds, PressureGuard, Real};
use self::order::{Holder, Holding, InOrder, pressure_key};
use self::places::Places;
pub use self::window::CACHE_AWARE_WINDOW;
use crate::admission::EngineAdmission;
use crate::cache::{CacheLookup, CacheSource, Held, PrefixHits};
use crate::config_error::PolicyConfigError;
use crate::error::{PickError, Rejection};
use crate::explain::Observation;
use crate::future::BoxFuture;
use crate::pick::{Pick, PickReason};
use crate::policy::{PickRequest, Policy};
use crate::pressure::compare;
use crate::rng::{Draws, SharedRng};
use crate::walk::{admit, reserve};

/// Prefers engines holding the prompt's prefix; see the module documentation for the
/// algorithm. Never used for decode groups.
#[derive(Debug)]
pub struct CacheAwarePolicy {
    source: Arc<dyn CacheSource>,
    load: Arc<EngineReportedLoadTable>,
    admission: Arc<dyn EngineAdmission>,
    config: CacheAwareConfig,
    rng: SharedRng,
    places: EngineListMemo<Places>,
}

/// Where a walk over the holders in order ended ([`CacheAwarePolicy::walk`]);
/// holders named by their place in the walk's [`InOrder`].
enum Walk {
    /// An admitted holder won; `switched` when the pressure guard preferred it to the
    /// first admitted one.
    Won { place: usize, switched: bool },
    /// Admission refused every holder it checked.
    Refused(Vec<Rejection>),
    /// No holder is under the load bound: every one, in order.
    OverBound(Vec<usize>),
    /// The soft queue gate set aside every holder considered: those, in order.
    SetAside(Vec<usize>),
}

impl CacheAwarePolicy {
    /// A policy reading `source` and `load`, checking `admission`, tuned by `config`
    /// (whose own `admission` field is not consulted: pass it as `admission`).
    ///
    /// # Errors
    /// An invalid setting of `config`.
    pub fn new(
        source: Arc<dyn CacheSource>,
        load: Arc<EngineReportedLoadTable>,
        admission: Arc<dyn EngineAdmission>,
        config: CacheAwareConfig,
    ) -> Result<Self, PolicyConfigError> {
        config.validate()?;
        let rng = config
            .seed
            .map_or_else(SharedRng::from_entropy, SharedRng::from_seed);
        Ok(Self {
            source,
            load,
            admission,
            config,
            rng,
            places: EngineListMemo::new(),
        })
    }

    async fn pick_async(
        &self,
        engines: &[Arc<Engine>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        let stage = request.stage;
        if stage == Role::Decode {
            return Err(PickError::InvalidConfiguration {
                stage: Some(stage),
                message: "cache_aware picks plain or prefill engines, never decode".into(),
            });
        }
        if engines.is_empty() {
            return Err(PickError::NoCandidates { stage });
        }
        let Some(tokens) = request.facts.token_ids else {
            return self.select(engines, request, None);
        };
        let answer = match request.facts.prefix_memo {
            Some(memo) => {
                memo.lookup(
                    &self.source,
                    request.facts.lookup_namespace(),
                    tokens,
                    request.is_dry_run(),
                )
                .await
            }
            None => Arc::new(
                self.source
                    .lookup(
                        request.facts.lookup_namespace(),
                        tokens,
                        request.is_dry_run(),
                    )
                    .await,
            ),
        };
        // The pick, and the leading blocks of the prompt its engine holds.
        let (picked, held_blocks) = match answer.as_ref() {
            Ok(CacheLookup::Answered(hits)) => {
                // Every holder among the candidates is named only to an explanation.
                let held = if request.facts.keeps_observations() {
                    hits.held_among(engines)
                } else {
                    Vec::new()
                };
                for h in &held {
                    let engine = engines[h.index].id();
                    let tokens = hits.tokens_of(h.blocks, request.facts.input_tokens);
                    if tokens > 0 {
                        request.observe(|| Observation::CachedTokens {
                            bucket: request.bucket_id.to_owned(),
                            stage,
                            engine: engine.clone(),
                            tokens,
                            slower_tokens: hits.slower_tokens(engine, request.facts.input_tokens),
                            feed_age_ms: hits.feed_age_ms_of(engine),
                        });
                    }
                }
                match self.select(engines, request, Some(hits)) {
                    Ok(pick) => {
                        let place = hits.place_of(pick.engine.id());
                        // A holder goes to the rank holding its prefix.
                        let rank = pick
                            .predicted_cached_tokens
                            .filter(|cached| *cached > 0)
                            .and(place)
                            .and_then(|place| hits.rank_at(place));
                        let blocks = place.map_or(0, |place| hits.engines()[place].1);
                        (Ok(pick.with_rank(rank)), blocks)
                    }
                    Err(e) => (Err(e), 0),
                }
            }
            Ok(CacheLookup::Unavailable(_)) => {
                request.observe(|| Observation::CacheUnavailable {
                    bucket: request.bucket_id.to_owned(),
                    stage,
                });
                (self.select(engines, request, None), 0)
            }
            Err(e) => (
                Err(PickError::InvalidSignal {
                    stage: Some(stage),
                    message: e.to_string(),
                }),
                0,
            ),
        };
        // The engine will hold the prompt's pages: sources that learn from routing
        // count them from now on.
        if let Ok(pick) = &picked
            && !request.is_dry_run()
        {
            self.source.routed(
                request.facts.lookup_namespace(),
                tokens,
                pick.engine.id(),
                held_blocks,
            );
        }
        picked
    }

    /// Steps 2-6 over one fresh load snapshot (its engines and capture time; an
    /// engine's counts are read when the pick reaches it, as live as the snapshot
    /// allows); `hits` is `None` when no lookup was possible.
    fn select(
        &self,
        engines: &[Arc<Engine>],
        request: &PickRequest<'_>,
        hits: Option<&PrefixHits>,
    ) -> Result<Pick, PickError> {
        let snapshot = self.load.snapshot();
        // One pick's draws, so a dry run draws what the next real pick will.
        let mut draws = self.rng.draws(!request.moves_own_state());
        let Some(hits) = hits else {
            return self.cold(
                engines,
                request,
                &snapshot,
                &mut draws,
                PickReason::CacheUnavailable,
                None,
            );
        };
        let holdings = self.holdings(engines, request, hits, &mut draws);
        let observe = |index: usize| snapshot.observe(engines[index].id());
        let mut holders = match self.config.score {
            CacheScore::Ttft => {
                // Every holder weighed: read once, and that reading decides if the
                // pick falls back to `cached`.
                let read: Vec<Holder> = holdings.iter().map(|h| h.read(observe(h.index))).collect();
                if let Some(scored) = self.scored(engines, request, &read, &snapshot, &mut draws) {
                    return scored;
                }
                InOrder::of_read(read, &observe)
            }
            CacheScore::Cached => InOrder::new(holdings, &observe),
        };
        if holders.next_work().is_none() {
            return self.cold(
                engines,
                request,
                &snapshot,
                &mut draws,
                PickReason::CacheMiss,
                None,
            );
        }
        // The bound first, so the best holders under it are the ones considered.
        let cap = self.load_cap(engines, &snapshot, &mut draws);
        let mut walk = self.walk(engines, request, &mut holders, cap, true)?;
        let mut pinned = false;
        loop {
            walk = match walk {
                Walk::Won { place, switched } => {
                    let reason = match (pinned, switched) {
                        (true, _) => PickReason::CacheSaturationPin,
                        (false, false) => PickReason::CacheHit,
                        (false, true) => PickReason::CacheGuardSwitch,
                    };
                    let winner = holders.get(place);
                    return Ok(Pick::new(Arc::clone(&engines[winner.index]), reason)
                        .with_predicted_cached_tokens(winner.matched));
                }
                Walk::Refused(rejections) => return Err(no_admissible(request.stage, rejections)),
                // Every holder is over the bound: spill to an engine under it, crediting
                // what it holds; if admission refuses that one, the holders are walked
                // again, as without a bound.
                Walk::OverBound(places) => match self.cold(
                    engines,
                    request,
                    &snapshot,
                    &mut draws,
                    PickReason::CacheSpill,
                    cap,
                ) {
                    Err(PickError::AdmissionRejected { .. }) => {
                        holders.again(places);
                        self.walk(engines, request, &mut holders, None, true)?
                    }
                    spilled => {
                        return spilled.map(|pick| {
                            let held =
                                hits.matched_tokens(pick.engine.id(), request.facts.input_tokens);
                            pick.with_predicted_cached_tokens(held)
                        });
                    }
                },
                // Every holder considered is set aside: without a saturation floor they
                // are walked again ungated (a saturation pin).
                Walk::SetAside(places) => match self.config.saturation_queue_floor {
                    None => {
                        pinned = true;
                        holders.again(places);
                        self.walk(engines, request, &mut holders, None, false)?
                    }
                    Some(floor) => {
                        let set_aside = places.iter().map(|&place| *holders.get(place)).collect();
                        return self
                            .saturated(engines, request, &snapshot, &mut draws, set_aside, floor);
                    }
                },
            };
        }
    }

    /// Steps 3 to 5 over `holders` in order: of the best `count` under `cap`, those
    /// the soft queue gate passes (all of them unless `gate`) are checked for
    /// admission up to the first admitted and those within the switch margin of it
    /// (the holders past the margin could not win, and their load is not read); the
    /// winner is the first admitted unless the pressure guard prefers a later one.
    fn walk(
        &self,
        engines: &[Arc<Engine>],
        request: &PickRequest<'_>,
        holders: &mut InOrder<'_>,
        cap: Option<u64>,
        gate: bool,
    ) -> Result<Walk, PickError> {
        let count = self.config.candidates.count(engines.len());
        let mut considered = 0;
        let (mut over_bound, mut set_aside, mut rejections) = (Vec::new(), Vec::new(), Vec::new());
        let mut usable = false;
        // The first admitted holder's uncached work, and the winner so far.
        let mut first: Option<u64> = None;
        let mut winner: Option<(usize, bool)> = None;
        while let Some(work) = holders.next_work() {
            if considered == count
                || first.is_some_and(|first| work - first > self.config.switch_margin_tokens)
            {
                break;
            }
            let Some(place) = holders.next() else { break };
            let holder = holders.get(place);
            if cap.is_some_and(|cap| requests(&holder.observation) > cap) {
                over_bound.push(place);
                continue;
            }
            considered += 1;
            if gate && self.queued(&holder.observation) {
                set_aside.push(place);
                continue;
            }
            usable = true;
            let engine = &engines[holder.index];
            let metrics = holder.observation.metrics();
            if let Some(rejection) = admit(self.admission.as_ref(), engine, &metrics, request)? {
                rejections.push(rejection);
                continue;
            }
            winner = match winner {
                None => {
                    first = Some(holder.uncached);
                    Some((place, false))
                }
                Some((current, _)) if self.guard_prefers(holder, holders.get(current)) => {
                    Some((place, true))
                }
                kept => kept,
            };
        }
        Ok(match winner {
            Some((place, switched)) => Walk::Won { place, switched },
            None if considered == 0 => Walk::OverBound(over_bound),
            None if !usable => Walk::SetAside(set_aside),
            None => Walk::Refused(rejections),
        })
    }

    /// The candidates that count as holders, unordered and their load not read: of
    /// more than the window, those with the least uncached work, read deepest first from `hits`
    /// ([`window::deepest`]) unless a slower tier weighs less than the device and
    /// some holder has blocks only there: then every holder is ranked
    /// ([`window::least_work`]).
    fn holdings(
        &self,
        engines: &[Arc<Engine>],
        request: &PickRequest<'_>,
        hits: &PrefixHits,
        draws: &mut Draws<'_>,
    ) -> Vec<Holding> {
        let input = request.facts.input_tokens;
        let window = CACHE_AWARE_WINDOW.max(self.config.candidates.count(engines.len()));
        let holding = |index: usize, blocks: usize, credited: u64| Holding {
            index,
            matched: hits.tokens_of(blocks, input),
            uncached: input - credited,
        };
        if hits.slower_blocks().is_empty() || self.config.slower_tier_weight.get() >= 1.0 {
            // Every held token is credited: depth orders the holders.
            let places = self.places.get(engines, Places::of);
            let engine_ids = hits.engines();
            window::deepest(
                draws,
                hits,
                window,
                |place| places.place(&engine_ids[place].0),
                |blocks| self.counts(hits.tokens_of(blocks, input), input),
            )
            .into_iter()
            .map(|(index, blocks)| holding(index, blocks, hits.tokens_of(blocks, input)))
            .collect()
        } else {
            let held = hits.held_among(engines);
            let ranked: Vec<(u64, usize)> = held
                .iter()
                .enumerate()
                .filter_map(|(place, h)| Some((input - self.holds(hits, h, input)?, place)))
                .collect();
            window::least_work(draws, ranked, window)
                .into_iter()
                .map(|(uncached, place)| {
                    holding(held[place].index, held[place].blocks, input - uncached)
                })
                .collect()
        }
    }

    /// The prompt tokens the candidate `held` describes is credited with when that
    /// makes it a holder (enough of them, and a large enough share of the prompt).
    fn holds(&self, hits: &PrefixHits, held: &Held, input: u64) -> Option<u64> {
        let credited = self.credited(hits, held, input);
        self.counts(credited, input).then_some(credited)
    }

    /// Whether `credited` prompt tokens make a holder: enough of them, and a large
    /// enough share of the prompt.
    fn counts(&self, credited: u64, input: u64) -> bool {
        let enough = credited > 0 && credited >= self.config.min_matched_tokens;
        let share = credited as f64 / input.max(1) as f64;
        enough && self.config.min_match_ratio.is_none_or(|r| share >= r.get())
    }

    /// The prompt tokens the candidate `held` describes is credited with: those on
    /// the device, plus `slower_tier_weight` of those only on a slower tier (rounded
    /// down).
    fn credited(&self, hits: &PrefixHits, held: &Held, input: u64) -> u64 {
        let matched = hits.tokens_of(held.blocks, input);
        let slower = hits.tokens_of(held.slower, input).min(matched);
        let credit = self.config.slower_tier_weight.get() * slower as f64;
        // A weight in [0, 1] keeps the credit within `slower`.
        matched - slower + (credit as u64).min(slower)
    }

    /// The most requests a holder may have under `load_bound`, if one is set; the
    /// group's mean load estimated from a spread sample of the window's size when the
    /// group is larger.
    fn load_cap(
        &self,
        engines: &[Arc<Engine>],
        snapshot: &LoadSnapshot,
        draws: &mut Draws<'_>,
    ) -> Option<u64> {
        let bound = self.config.load_bound?.get();
        let n = engines.len().max(1) as f64;
        let sample = window::spread(draws, engines.len(), CACHE_AWARE_WINDOW);
        // Reported counts are the engines' word: summed without overflow.
        let sampled = sample.iter().fold(0u64, |sum, &i| {
            sum.saturating_add(requests(&snapshot.observe(engines[i].id())))
        });
        let mean = sampled as f64 / sample.len().max(1) as f64;
        let share = bound * (mean + 1.0 / n);
        // A float past u64::MAX converts to u64::MAX.
        Some(share.ceil() as u64)
    }

    /// Whether the soft queue gate sets this engine aside (unknown load passes).
    fn queued(&self, observation: &EngineObservation) -> bool {
        match (self.config.engine_queue_limit, &observation.reported) {
            (Some(limit), Some(report)) => report.waiting_requests >= limit,
            _ => false,
        }
    }

    /// Every holder is set aside and a saturation floor is set: pin the least
    /// pressured admitted holder when the whole group is at or above the floor,
    /// otherwise go cold to an engine with room.
    fn saturated(
        &self,
        engines: &[Arc<Engine>],
        request: &PickRequest<'_>,
        snapshot: &LoadSnapshot,
        draws: &mut Draws<'_>,
        mut set_aside: Vec<Holder>,
        floor: u64,
    ) -> Result<Pick, PickError> {
        let sample = window::spread(draws, engines.len(), CACHE_AWARE_WINDOW);
        let room_elsewhere = sample.iter().any(|&i| {
            snapshot
                .observe(engines[i].id())
                .reported
                .is_some_and(|r| r.waiting_requests < floor)
        });
        if room_elsewhere {
            return self.cold(
                engines,
                request,
                snapshot,
                draws,
                PickReason::CacheMiss,
                None,
            );
        }
        set_aside.sort_by_cached_key(|h| (pressure_key(h), h.index));
        let mut rejections = Vec::new();
        for holder in set_aside {
            let engine = &engines[holder.index];
            let metrics = holder.observation.metrics();
            match admit(self.admission.as_ref(), engine, &metrics, request)? {
                None => {
                    return Ok(
                        Pick::new(Arc::clone(engine), PickReason::CacheSaturationPin)
                            .with_predicted_cached_tokens(holder.matched),
                    );
                }
                Some(rejection) => rejections.push(rejection),
            }
        }
        Err(no_admissible(request.stage, rejections))
    }

    /// The miss path: power of k over the engines below the queue limit (all of them
    /// when none is), comparing stage pressure pairwise; admission on the winner. Of a
    /// group larger than the window, the engines are those of a spread sample.
    fn cold(
        &self,
        engines: &[Arc<Engine>],
        request: &PickRequest<'_>,
        snapshot: &LoadSnapshot,
        draws: &mut Draws<'_>,
        reason: PickReason,
        cap: Option<u64>,
    ) -> Result<Pick, PickError> {
        let read: Vec<(usize, EngineObservation)> =
            window::spread(draws, engines.len(), CACHE_AWARE_WINDOW)
                .into_iter()
                .map(|i| (i, snapshot.observe(engines[i].id())))
                .collect();
        let mut tier: Vec<&(usize, EngineObservation)> = read
            .iter()
            .filter(|(_, o)| !self.queued(o))
            .filter(|(_, o)| cap.is_none_or(|cap| requests(o) <= cap))
            .collect();
        if tier.is_empty() {
            tier = read.iter().collect();
        }
        let sampled: Vec<&(usize, EngineObservation)> =
            if self.config.min_load_choices >= tier.len() {
                tier
            } else {
                draws
                    .distinct(tier.len(), self.config.min_load_choices)
                    .into_iter()
                    .map(|i| tier[i])
                    .collect()
            };
        let mut best = sampled[0];
        for &candidate in &sampled[1..] {
            if compare(
                request.stage,
                &candidate.1,
                &best.1,
                request.facts.input_tokens,
            )
            .0 == Ordering::Less
            {
                best = candidate;
            }
        }
        let (best, observation) = best;
        let engine = &engines[*best];
        let metrics = observation.metrics();
        match admit(self.admission.as_ref(), engine, &metrics, request)? {
            None => Ok(Pick::new(Arc::clone(engine), reason).with_predicted_cached_tokens(0)),
            Some(rejection) => Err(PickError::AdmissionRejected {
                stage: request.stage,
                rejection,
            }),
        }
    }

    /// The pressure guard: whether near-tie `challenger` should replace `current`
    /// because `current` is clearly worse. Needs fresh native reports from both.
    fn guard_prefers(&self, challenger: &Holder, current: &Holder) -> bool {
        let guard = &self.config.pressure_guard;
        if !guard.enabled {
            return false;
        }
        let (Some(a), Some(b)) = (native(current), native(challenger)) else {
            return false;
        };
        let rel = guard.rel.get();
        if let (Some(abs_ms), Some(qa), Some(qb)) = (guard.abs_ms, a.0, b.0) {
            return qa - qb > abs_ms as f64 && qa > rel * qb;
        }
        let (wa, wb) = (a.1, b.1);
        wa.saturating_sub(wb) > guard.abs_tokens && wa as f64 > rel * wb as f64
    }
}

/// An engine's requests for the load bound: reported running and waiting plus the
/// dispatches since the report, else the router's own in flight.
fn requests(observation: &EngineObservation) -> u64 {
    observation
        .corrected_reported_requests()
        .unwrap_or(observation.in_flight)
}

/// `(prefill queue ms, waiting uncached tokens)` of a holder's fresh native report,
/// the queue corrected by the dispatches the report has not seen (each taken to bring
/// this request's uncached tokens on that engine).
fn native(holder: &Holder) -> Option<(Option<f64>, u64)> {
    let report = holder.observation.reported.as_ref()?;
    report.native_with_capacity()?;
    let native = report.native?;
    Some((
        holder
            .observation
            .corrected_prefill_queue_ms(holder.uncached),
        native.waiting_uncached_tokens,
    ))
}

fn no_admissible(stage: Role, rejections: Vec<Rejection>) -> PickError {
    if rejections.is_empty() {
        PickError::NoCandidates { stage }
    } else {
        PickError::NoAdmissibleEngine { stage, rejections }
    }
}

impl Policy for CacheAwarePolicy {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Engine>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        Box::pin(self.pick_async(engines, request))
    }

    fn reserve(&self, pick: &Pick) -> Result<Option<Reservation>, Rejection> {
        reserve(&self.load, self.admission.as_ref(), pick)
    }
}
