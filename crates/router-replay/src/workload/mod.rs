//! Generated workloads, one shape a file, each a function of its seed.
//!
//! - [`SharedPrefixWorkload`] (`conversations`): multi-turn conversations over shared
//!   system prompts.
//! - [`BurstWorkload`] (`bursts`): groups of requests arriving within a few
//!   milliseconds on one new long prefix, over background conversations.
//! - [`AgentWorkload`] (`agents`): agent sessions over a few long tools-and-instructions
//!   prefixes, tool results appended turn by turn, sub-agents branching off.
//! - [`DocumentWorkload`] (`documents`): short questions about long documents.
//!
//! Every shape draws its prefixes with a [`Popularity`], its lengths log-uniformly
//! from their ranges and its counts uniformly, and starts its sessions as a Poisson
//! process. Sizes and times come from separate generators, so changing the rate moves
//! requests in time without changing a token.

mod agents;
mod bursts;
mod conversations;
mod documents;

pub use agents::AgentWorkload;
pub use bursts::BurstWorkload;
pub use conversations::SharedPrefixWorkload;
pub use documents::DocumentWorkload;

use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::trace::TraceRequest;

/// How often each of a workload's shared prefixes is drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Popularity {
    /// Zipf(1): the k-th prefix is drawn in proportion to 1/k, so a few are very
    /// common and most are rare.
    #[default]
    Zipf,
    /// Every prefix equally often.
    Uniform,
}

/// A workload of one of the shapes.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// Multi-turn conversations over shared system prompts.
    Conversations(SharedPrefixWorkload),
    /// Bursts on new prefixes over background conversations.
    Bursts(BurstWorkload),
    /// Agent sessions with sub-agents.
    Agents(AgentWorkload),
    /// Short questions about long documents.
    Documents(DocumentWorkload),
}

impl Workload {
    /// The trace, in arrival order.
    pub fn generate(&self) -> Vec<TraceRequest> {
        match self {
            Self::Conversations(w) => w.generate(),
            Self::Bursts(w) => w.generate(),
            Self::Agents(w) => w.generate(),
            Self::Documents(w) => w.generate(),
        }
    }

    /// Its mean arrival rate, requests per second.
    pub fn requests_per_sec(&self) -> f64 {
        match self {
            Self::Conversations(w) => w.requests_per_sec,
            Self::Bursts(w) => w.requests_per_sec,
            Self::Agents(w) => w.requests_per_sec,
            Self::Documents(w) => w.requests_per_sec,
        }
    }

    /// Sets its mean arrival rate, requests per second; its tokens stay the same.
    pub fn set_requests_per_sec(&mut self, rate: f64) {
        match self {
            Self::Conversations(w) => w.requests_per_sec = rate,
            Self::Bursts(w) => w.requests_per_sec = rate,
            Self::Agents(w) => w.requests_per_sec = rate,
            Self::Documents(w) => w.requests_per_sec = rate,
        }
    }
}

/// The generator of sizes and the generator of times of `seed`.
fn generators(seed: u64) -> (Xoshiro256PlusPlus, Xoshiro256PlusPlus) {
    (
        Xoshiro256PlusPlus::seed_from_u64(seed),
        Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
    )
}

/// Uniform in `[0, 1)`.
fn unit(rng: &mut Xoshiro256PlusPlus) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Log-uniform in `[lo, hi]`.
fn log_uniform(rng: &mut Xoshiro256PlusPlus, (lo, hi): (u32, u32)) -> u32 {
    let (lo, hi) = (f64::from(lo.max(1)), f64::from(hi.max(lo.max(1))));
    (lo * (hi / lo).powf(unit(rng))).round() as u32
}

/// A count uniform in `[lo, hi]`, at least 1.
fn count(rng: &mut Xoshiro256PlusPlus, range: (u32, u32)) -> u32 {
    let (lo, hi) = counts(range);
    let span = u64::from(hi - lo) + 1;
    lo + (rng.next_u64() % span) as u32
}

/// The mean of [`count`] over `range`.
fn mean_count(range: (u32, u32)) -> f64 {
    let (lo, hi) = counts(range);
    (f64::from(lo) + f64::from(hi)) / 2.0
}

/// The bounds [`count`] draws between: at least 1, `hi` at least `lo`.
fn counts((lo, hi): (u32, u32)) -> (u32, u32) {
    let lo = lo.max(1);
    (lo, hi.max(lo))
}

/// Exponential with `mean`.
fn exponential(rng: &mut Xoshiro256PlusPlus, mean: f64) -> f64 {
    -mean * (1.0 - unit(rng)).ln()
}

/// Seconds from the trace's start as its microseconds.
fn micros(seconds: f64) -> u64 {
    (seconds * 1e6) as u64
}

/// Draws one of `n` items with a [`Popularity`].
#[derive(Debug)]
struct Popular {
    /// The cumulative weights of the items, in order.
    cumulative: Vec<f64>,
}

impl Popular {
    /// `n` items (at least one).
    fn new(n: u32, popularity: Popularity) -> Self {
        let mut cumulative = Vec::with_capacity(n.max(1) as usize);
        let mut sum = 0.0;
        for i in 1..=n.max(1) {
            sum += match popularity {
                Popularity::Zipf => 1.0 / f64::from(i),
                Popularity::Uniform => 1.0,
            };
            cumulative.push(sum);
        }
        Self { cumulative }
    }

    /// An item's index.
    fn pick(&self, rng: &mut Xoshiro256PlusPlus) -> usize {
        let sum = self.cumulative.last().copied().unwrap_or(0.0);
        let draw = unit(rng) * sum;
        self.cumulative
            .partition_point(|c| *c <= draw)
            .min(self.cumulative.len() - 1)
    }
}

/// The first `requests` requests, in arrival order, of sessions that start as a
/// Poisson process of `sessions_per_sec` (drawn from `times`); `session(n, start_s,
/// times)` makes the `n`-th session's requests, starting at `start_s` seconds.
/// Sessions start until there are `requests` requests and a new one would start after
/// the last of them: none is missing before the cut. Requests of one microsecond are
/// in session order, then in the order their session made them.
fn sessions(
    requests: usize,
    sessions_per_sec: f64,
    times: &mut Xoshiro256PlusPlus,
    mut session: impl FnMut(u32, f64, &mut Xoshiro256PlusPlus) -> Vec<TraceRequest>,
) -> Vec<TraceRequest> {
    let mut made: Vec<(u32, u32, TraceRequest)> = Vec::with_capacity(requests);
    let mut start_s = 0.0;
    let mut n = 0u32;
    let mut cut_us: Option<u64> = None;
    loop {
        if cut_us.is_none() && made.len() >= requests {
            let mut at: Vec<u64> = made.iter().map(|r| r.2.at_us).collect();
            at.sort_unstable();
            cut_us = Some(at.get(requests.saturating_sub(1)).copied().unwrap_or(0));
        }
        start_s += exponential(times, 1.0 / sessions_per_sec.max(1e-9));
        if cut_us.is_some_and(|cut| micros(start_s) > cut) {
            break;
        }
        for (i, request) in session(n, start_s, times).into_iter().enumerate() {
            made.push((n, i as u32, request));
        }
        n += 1;
    }
    made.sort_by_key(|(n, i, r)| (r.at_us, *n, *i));
    made.truncate(requests);
    made.into_iter().map(|(.., r)| r).collect()
}

/// Requests per second one engine rank serves when nothing is cached, as `spec`
/// times them: every slot busy prefilling whole prompts and generating answers, or,
/// with serial prefill, the prefill turn always taken, whichever binds first.
pub fn uncached_capacity(trace: &[TraceRequest], spec: &engine_sim::EngineSpec) -> f64 {
    if trace.is_empty() {
        return 0.0;
    }
    let n = trace.len() as f64;
    let prefill: f64 = trace
        .iter()
        .map(|r| spec.prefill_time(r.prompt_tokens()).as_secs_f64())
        .sum::<f64>()
        / n;
    let decode: f64 = trace
        .iter()
        .map(|r| spec.decode_time(1).as_secs_f64() * f64::from(r.output_tokens))
        .sum::<f64>()
        / n;
    let slots = f64::from(spec.max_running_requests) / (prefill + decode).max(1e-9);
    if spec.serial_prefill {
        slots.min(1.0 / prefill.max(1e-9))
    } else {
        slots
    }
}
