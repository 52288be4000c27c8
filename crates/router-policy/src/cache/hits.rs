//! A prefix lookup's answer: which engines hold how much of the prompt, in engine-id
//! order (to find one engine, or merge with a candidate list) and, once a pick asks,
//! deepest first (so a pick reads the best holders without reading all of them).

use std::cmp::Reverse;
use std::sync::{Arc, OnceLock};

use router_state::kv_events::PrefixIndex;
use router_state::{Engine, EngineId};

/// The engines holding a prompt's prefix, and how much of it. Two answers are equal
/// when they say the same; whether one was read deepest first yet does not count.
#[derive(Debug, Clone, Default)]
pub struct PrefixHits {
    query_blocks: usize,
    block_size: u32,
    engines: Vec<(EngineId, usize)>,
    /// `engines` deepest first, built by the first [`PrefixHits::by_depth`] (a
    /// source answering over the wire never builds it).
    by_depth: OnceLock<DepthOrder>,
    ranks: Vec<(EngineId, u32)>,
    slower_blocks: Vec<(EngineId, usize)>,
    feed_age_ms: Vec<(EngineId, u64)>,
}

impl PartialEq for PrefixHits {
    fn eq(&self, other: &Self) -> bool {
        self.query_blocks == other.query_blocks
            && self.block_size == other.block_size
            && self.engines == other.engines
            && self.ranks == other.ranks
            && self.slower_blocks == other.slower_blocks
            && self.feed_age_ms == other.feed_age_ms
    }
}

impl Eq for PrefixHits {}

/// Places in [`PrefixHits::engines`], the most blocks first, ties in their order, and
/// where each run of places holding as many blocks ends.
#[derive(Debug, Clone, Default)]
struct DepthOrder {
    places: Vec<usize>,
    runs: Vec<Run>,
}

impl PrefixHits {
    /// The answer for a prompt of `query_blocks` full blocks of `block_size` tokens
    /// (`0` when the source cannot say; matches then count nothing): `engines` hold
    /// that many leading blocks each. `engines` lists every engine holding at least
    /// one block, once, sorted by engine id.
    pub fn new(query_blocks: usize, block_size: u32, engines: Vec<(EngineId, usize)>) -> Self {
        Self {
            query_blocks,
            block_size,
            engines,
            ..Self::default()
        }
    }

    /// With the data-parallel rank of each engine's deepest match, when the source
    /// knows it (the local index does); sorted by engine id.
    pub fn with_ranks(mut self, ranks: Vec<(EngineId, u32)>) -> Self {
        self.ranks = ranks;
        self
    }

    /// With, of each engine's leading blocks, how many are held only on a slower
    /// tier (host memory, disk, a shared pool) and not on the device; engines with
    /// none left out. Sorted by engine id.
    pub fn with_slower_blocks(mut self, slower_blocks: Vec<(EngineId, usize)>) -> Self {
        self.slower_blocks = slower_blocks;
        self
    }

    /// With how far behind each engine's KV feed was when its latest live batch
    /// arrived, in milliseconds; engines with none recorded (or zero) left out.
    /// Sorted by engine id.
    pub fn with_feed_age_ms(mut self, feed_age_ms: Vec<(EngineId, u64)>) -> Self {
        self.feed_age_ms = feed_age_ms;
        self
    }

    /// What `index` holds of a prompt whose block hashes are `chain`
    /// ([`PrefixIndex::request_hashes`]); a `dry_run` leaves the index's recency as
    /// it was ([`PrefixIndex::peek`]).
    pub fn of_chain(index: &PrefixIndex, chain: &[u64], dry_run: bool) -> Self {
        let found = index.lookup_by_engine(chain, dry_run);
        let matches = found.engines;
        let ranks = matches.iter().map(|m| (m.engine.clone(), m.rank)).collect();
        let slower_blocks = matches
            .iter()
            .filter(|m| m.blocks > m.device_blocks)
            .map(|m| (m.engine.clone(), m.blocks - m.device_blocks))
            .collect();
        let feed_age_ms = matches
            .iter()
            .map(|m| (m.engine.clone(), millis(m.feed_age)))
            .filter(|(_, ms)| *ms > 0)
            .collect();
        let engines = matches.into_iter().map(|m| (m.engine, m.blocks)).collect();
        Self::new(found.query_blocks, index.config().block_size, engines)
            .with_ranks(ranks)
            .with_slower_blocks(slower_blocks)
            .with_feed_age_ms(feed_age_ms)
    }

    /// Full blocks in the prompt.
    pub fn query_blocks(&self) -> usize {
        self.query_blocks
    }

    /// Tokens per block (`0` when the source cannot say).
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Leading blocks of the prompt each engine holds, for every engine holding at
    /// least one; sorted by engine id.
    pub fn engines(&self) -> &[(EngineId, usize)] {
        &self.engines
    }

    /// The places in [`engines`](Self::engines) of the engines holding the most
    /// blocks first, in runs of engines holding as many blocks (each run in
    /// engine-id order): the run's blocks and places.
    pub fn by_depth(&self) -> impl Iterator<Item = (usize, &[usize])> {
        let order = self.by_depth.get_or_init(|| deepest_first(&self.engines));
        let mut start = 0;
        order.runs.iter().map(move |run| {
            let places = &order.places[start..run.end];
            start = run.end;
            (run.blocks, places)
        })
    }

    /// The data-parallel rank of each engine's deepest match, where known; sorted by
    /// engine id.
    pub fn ranks(&self) -> &[(EngineId, u32)] {
        &self.ranks
    }

    /// Of each engine's leading blocks, those held only on a slower tier; engines
    /// with none left out. Sorted by engine id.
    pub fn slower_blocks(&self) -> &[(EngineId, usize)] {
        &self.slower_blocks
    }

    /// How far behind each engine's KV feed was, in milliseconds; engines with none
    /// recorded left out. Sorted by engine id.
    pub fn feed_age_ms(&self) -> &[(EngineId, u64)] {
        &self.feed_age_ms
    }

    /// Leading blocks `engine` holds.
    pub fn blocks_of(&self, engine: &EngineId) -> usize {
        find(&self.engines, engine).unwrap_or(0)
    }

    /// The rank of `engine`'s deepest match, when known.
    pub fn rank_of(&self, engine: &EngineId) -> Option<u32> {
        find(&self.ranks, engine)
    }

    /// The place in [`engines`](Self::engines) of `engine`, if it holds any block.
    pub fn place_of(&self, engine: &EngineId) -> Option<usize> {
        self.engines.binary_search_by(|(id, _)| id.cmp(engine)).ok()
    }

    /// The rank of the deepest match of the engine at `place` in
    /// [`engines`](Self::engines), when known: read at the same place when the ranks
    /// name every engine (as the local index's do), else searched for.
    pub fn rank_at(&self, place: usize) -> Option<u32> {
        let (engine, _) = self.engines.get(place)?;
        match self.ranks.get(place) {
            Some((ranked, rank)) if ranked == engine => Some(*rank),
            _ => self.rank_of(engine),
        }
    }

    /// Prompt tokens `engine` holds: its blocks times the block size, never more than
    /// the prompt.
    pub fn matched_tokens(&self, engine: &EngineId, input_tokens: u64) -> u64 {
        self.tokens_of(self.blocks_of(engine), input_tokens)
    }

    /// Of [`matched_tokens`](Self::matched_tokens), those held only on a slower tier.
    pub fn slower_tokens(&self, engine: &EngineId, input_tokens: u64) -> u64 {
        let slower = find(&self.slower_blocks, engine).unwrap_or(0);
        self.tokens_of(slower, input_tokens)
            .min(self.matched_tokens(engine, input_tokens))
    }

    /// How far behind `engine`'s KV feed was, in milliseconds (0 when unknown).
    pub fn feed_age_ms_of(&self, engine: &EngineId) -> u64 {
        find(&self.feed_age_ms, engine).unwrap_or(0)
    }

    /// Prompt tokens of `blocks` blocks, never more than the prompt.
    pub fn tokens_of(&self, blocks: usize, input_tokens: u64) -> u64 {
        u64::try_from(blocks)
            .unwrap_or(u64::MAX)
            .saturating_mul(u64::from(self.block_size))
            .min(input_tokens)
    }

    /// Raises each engine's leading blocks to those of `deeper` (sorted by engine
    /// id), adding the engines it names.
    pub(crate) fn deepen(&mut self, deeper: Vec<(EngineId, usize)>) {
        if deeper.is_empty() {
            return;
        }
        for (engine, blocks) in deeper {
            match self.engines.binary_search_by(|(id, _)| id.cmp(&engine)) {
                Ok(i) => self.engines[i].1 = self.engines[i].1.max(blocks),
                Err(i) => self.engines.insert(i, (engine, blocks)),
            }
        }
        self.by_depth = OnceLock::new();
    }
}

/// A candidate holding some of a prompt ([`PrefixHits::held_among`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    /// Its index among the candidates.
    pub(crate) index: usize,
    /// Leading blocks it holds.
    pub(crate) blocks: usize,
    /// Of those, the blocks held only on a slower tier.
    pub(crate) slower: usize,
}

impl PrefixHits {
    /// The candidates among `engines` holding at least one block, in the order of
    /// `engines`: one merge of the two id-ordered lists when `engines` is in id order
    /// (as a group gives its candidates), else a search per candidate.
    pub(crate) fn held_among(&self, engines: &[Arc<Engine>]) -> Vec<Held> {
        self.merged(engines)
            .unwrap_or_else(|| self.searched(engines))
    }

    /// The merge; `None` when it may have missed a holder. Each candidate costs one
    /// comparison with the next hit (a pointer comparison when the two share the id's
    /// string, as the index's answers and the registry's engines do).
    ///
    /// When every hit the merge passed was matched, the answer is exact whatever the
    /// candidates' order: a holder is missed only when its hit was passed for a
    /// candidate ordered after it. Only when a hit was passed unmatched (an engine
    /// holding the prompt that is not a candidate) is the candidates' order checked,
    /// one comparison a candidate.
    fn merged(&self, engines: &[Arc<Engine>]) -> Option<Vec<Held>> {
        let mut held = Vec::with_capacity(self.engines.len().min(engines.len()));
        let mut slower = self.slower_blocks.iter().peekable();
        let mut hits = self.engines.iter().peekable();
        let mut passed = false;
        for (index, engine) in engines.iter().enumerate() {
            let id = engine.id();
            let blocks = loop {
                let Some((hit, blocks)) = hits.peek() else {
                    break None;
                };
                let order = if Arc::ptr_eq(hit.as_arc_str(), id.as_arc_str()) {
                    std::cmp::Ordering::Equal
                } else {
                    hit.cmp(id)
                };
                match order {
                    std::cmp::Ordering::Less => {
                        hits.next();
                        passed = true;
                    }
                    std::cmp::Ordering::Equal => {
                        hits.next();
                        break Some(*blocks);
                    }
                    std::cmp::Ordering::Greater => break None,
                }
            };
            let Some(blocks) = blocks else {
                continue;
            };
            while slower.next_if(|(s, _)| s < id).is_some() {}
            let slower = slower.next_if(|(s, _)| s == id).map_or(0, |(_, s)| *s);
            held.push(Held {
                index,
                blocks,
                slower,
            });
        }
        let in_order = || engines.windows(2).all(|pair| pair[0].id() < pair[1].id());
        (!passed || in_order()).then_some(held)
    }

    fn searched(&self, engines: &[Arc<Engine>]) -> Vec<Held> {
        engines
            .iter()
            .enumerate()
            .filter_map(|(index, engine)| {
                let blocks = self.blocks_of(engine.id());
                (blocks > 0).then(|| Held {
                    index,
                    blocks,
                    slower: find(&self.slower_blocks, engine.id()).unwrap_or(0),
                })
            })
            .collect()
    }
}

/// Depths a counting sort of the hits counts for each engine at most (see
/// [`deepest_first`]).
const COUNTED_DEPTHS: usize = 4;

/// The end of a run of [`DepthOrder::places`] holding `blocks` blocks each.
#[derive(Debug, Clone, Copy)]
struct Run {
    blocks: usize,
    end: usize,
}

/// The places of `engines`, the most blocks first, ties in place order, and the runs
/// of them holding as many: a counting sort when the deepest engine holds no more
/// than [`COUNTED_DEPTHS`] blocks an engine (so its counts cost no more than the
/// engines do, whatever a source claims), else a stable comparison sort.
fn deepest_first(engines: &[(EngineId, usize)]) -> DepthOrder {
    let most = engines.iter().map(|(_, b)| *b).max().unwrap_or(0);
    if most / COUNTED_DEPTHS >= engines.len() {
        let mut order: Vec<usize> = (0..engines.len()).collect();
        order.sort_by_key(|&place| Reverse(engines[place].1));
        let mut runs: Vec<Run> = Vec::new();
        for (at, &place) in order.iter().enumerate() {
            let blocks = engines[place].1;
            match runs.last_mut() {
                Some(run) if run.blocks == blocks => run.end = at + 1,
                _ => runs.push(Run {
                    blocks,
                    end: at + 1,
                }),
            }
        }
        return DepthOrder {
            places: order,
            runs,
        };
    }
    // `next[most - b]`: where the next engine holding `b` blocks goes.
    let mut next = vec![0usize; most + 1];
    for (_, blocks) in engines {
        next[most - blocks] += 1;
    }
    let mut runs = Vec::new();
    let mut start = 0;
    for (deeper, slot) in next.iter_mut().enumerate() {
        let count = *slot;
        *slot = start;
        start += count;
        if count > 0 {
            runs.push(Run {
                blocks: most - deeper,
                end: start,
            });
        }
    }
    let mut order = vec![0; engines.len()];
    for (place, (_, blocks)) in engines.iter().enumerate() {
        let slot = &mut next[most - blocks];
        order[*slot] = place;
        *slot += 1;
    }
    DepthOrder {
        places: order,
        runs,
    }
}

/// The value `engine` has in a list sorted by engine id.
fn find<T: Copy>(list: &[(EngineId, T)], engine: &EngineId) -> Option<T> {
    list.binary_search_by(|(id, _)| id.cmp(engine))
        .ok()
        .map(|i| list[i].1)
}

/// A duration in whole milliseconds.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
