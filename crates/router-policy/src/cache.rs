//! Where cache-aware policies learn which engines hold a prompt's prefix: a
//! [`CacheSource`] (the local index, or a remote indexer shared by several routers,
//! either with the pages the router routed counted too: `routed`) and a per-request
//! [`PrefixMemo`] so a request looks its prefix up once however many buckets it
//! tries.

mod routed;

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use router_state::kv_events::PrefixIndex;
use router_state::{Engine, EngineId};

use crate::future::BoxFuture;

pub use routed::{
    Estimated, EventSource, MAX_PENDING_MS, MAX_ROUTED_AGE_MS, MAX_ROUTED_PAGES, RoutedCacheSource,
    RoutedPagesSettings,
};

/// The engines holding a prompt's prefix, and how much of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixHits {
    /// Full blocks in the prompt.
    pub query_blocks: usize,
    /// Tokens per block (`0` when the source cannot say; matches then count nothing).
    pub block_size: u32,
    /// Leading blocks of the prompt each engine holds, for every engine holding at
    /// least one; sorted by engine id.
    pub engines: Vec<(EngineId, usize)>,
    /// The data-parallel rank of each engine's deepest match, when the source knows
    /// it (the local index does); sorted by engine id.
    pub ranks: Vec<(EngineId, u32)>,
    /// Of each engine's leading blocks, how many are held only on a slower tier (host
    /// memory, disk, a shared pool) and not on the device; engines with none are left
    /// out. Sorted by engine id.
    pub slower_blocks: Vec<(EngineId, usize)>,
    /// How far behind each engine's KV feed was when its latest live batch arrived,
    /// in milliseconds; engines with none recorded (or zero) are left out. Sorted by
    /// engine id.
    pub feed_age_ms: Vec<(EngineId, u64)>,
}

impl PrefixHits {
    /// Leading blocks `engine` holds.
    pub fn blocks_of(&self, engine: &EngineId) -> usize {
        find(&self.engines, engine).unwrap_or(0)
    }

    /// The rank of `engine`'s deepest match, when known.
    pub fn rank_of(&self, engine: &EngineId) -> Option<u32> {
        find(&self.ranks, engine)
    }

    /// Prompt tokens `engine` holds: its blocks times the block size, never more than
    /// the prompt.
    pub fn matched_tokens(&self, engine: &EngineId, input_tokens: u64) -> u64 {
        self.tokens(self.blocks_of(engine), input_tokens)
    }

    /// Of [`matched_tokens`](Self::matched_tokens), those held only on a slower tier.
    pub fn slower_tokens(&self, engine: &EngineId, input_tokens: u64) -> u64 {
        let slower = find(&self.slower_blocks, engine).unwrap_or(0);
        self.tokens(slower, input_tokens)
            .min(self.matched_tokens(engine, input_tokens))
    }

    /// How far behind `engine`'s KV feed was, in milliseconds (0 when unknown).
    pub fn feed_age_ms_of(&self, engine: &EngineId) -> u64 {
        find(&self.feed_age_ms, engine).unwrap_or(0)
    }

    fn tokens(&self, blocks: usize, input_tokens: u64) -> u64 {
        u64::try_from(blocks)
            .unwrap_or(u64::MAX)
            .saturating_mul(u64::from(self.block_size))
            .min(input_tokens)
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

    /// Prompt tokens of `blocks` blocks, never more than the prompt.
    pub(crate) fn tokens_of(&self, blocks: usize, input_tokens: u64) -> u64 {
        self.tokens(blocks, input_tokens)
    }
}

/// The value `engine` has in a list sorted by engine id.
fn find<T: Copy>(list: &[(EngineId, T)], engine: &EngineId) -> Option<T> {
    list.binary_search_by(|(id, _)| id.cmp(engine))
        .ok()
        .map(|i| list[i].1)
}

/// What a lookup found out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheLookup {
    /// The source answered; an empty [`PrefixHits::engines`] is a confirmed miss.
    Answered(PrefixHits),
    /// The source could not answer (remote indexer down, timed out, overloaded): the
    /// policy falls back as on a miss, but the pick says so.
    Unavailable(String),
}

/// A lookup that must not be answered with a fallback: the query itself is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("prefix lookup refused: {0}")]
pub struct CacheQueryError(pub String);

/// A prefix-ownership source: the router's own index, or a remote indexer.
///
/// Implementations answer for one model; the same `Arc` is shared by every policy
/// that reads it (the [`PrefixMemo`] key).
pub trait CacheSource: Send + Sync + fmt::Debug {
    /// Which engines hold how much of the prefix of `token_ids` in `namespace` (the
    /// LoRA adapter the request is for; `None` for the base model). A `dry_run`
    /// lookup (an explanation's) leaves the source's recency as it was.
    fn lookup<'a>(
        &'a self,
        namespace: Option<&'a str>,
        token_ids: &'a [u32],
        dry_run: bool,
    ) -> BoxFuture<'a, Result<CacheLookup, CacheQueryError>>;

    /// Tells the source that the router sent a prompt (`token_ids` in `namespace`)
    /// to `engine`, whose lookup found its first `held_blocks` blocks there. Sources
    /// that learn from routing record it ([`RoutedCacheSource`]); the others ignore
    /// it.
    fn routed(
        &self,
        namespace: Option<&str>,
        token_ids: &[u32],
        engine: &EngineId,
        held_blocks: usize,
    ) {
        let _ = (namespace, token_ids, engine, held_blocks);
    }
}

/// A [`CacheSource`] over the router's own [`PrefixIndex`], fed by engine KV events.
#[derive(Debug, Clone)]
pub struct LocalCacheSource {
    index: Arc<PrefixIndex>,
}

impl LocalCacheSource {
    /// A source reading `index`.
    pub fn new(index: Arc<PrefixIndex>) -> Self {
        Self { index }
    }

    fn answer(&self, namespace: Option<&str>, token_ids: &[u32], dry_run: bool) -> PrefixHits {
        PrefixHits::of_chain(
            &self.index,
            &self.index.request_hashes(namespace, token_ids),
            dry_run,
        )
    }
}

impl PrefixHits {
    /// What `index` holds of a prompt whose block hashes are `chain`
    /// ([`PrefixIndex::request_hashes`]); a `dry_run` leaves the index's recency as
    /// it was ([`PrefixIndex::peek`]).
    pub fn of_chain(index: &PrefixIndex, chain: &[u64], dry_run: bool) -> Self {
        let found = index.lookup_by_engine(chain, dry_run);
        let matches = found.engines;
        Self {
            query_blocks: found.query_blocks,
            block_size: index.config().block_size,
            ranks: matches.iter().map(|m| (m.engine.clone(), m.rank)).collect(),
            slower_blocks: matches
                .iter()
                .filter(|m| m.blocks > m.device_blocks)
                .map(|m| (m.engine.clone(), m.blocks - m.device_blocks))
                .collect(),
            feed_age_ms: matches
                .iter()
                .map(|m| (m.engine.clone(), millis(m.feed_age)))
                .filter(|(_, ms)| *ms > 0)
                .collect(),
            engines: matches.into_iter().map(|m| (m.engine, m.blocks)).collect(),
        }
    }
}

impl CacheSource for LocalCacheSource {
    fn lookup<'a>(
        &'a self,
        namespace: Option<&'a str>,
        token_ids: &'a [u32],
        dry_run: bool,
    ) -> BoxFuture<'a, Result<CacheLookup, CacheQueryError>> {
        let hits = self.answer(namespace, token_ids, dry_run);
        Box::pin(std::future::ready(Ok(CacheLookup::Answered(hits))))
    }
}

/// A duration in whole milliseconds.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

type Entry = (
    Arc<dyn CacheSource>,
    Arc<Result<CacheLookup, CacheQueryError>>,
);

/// One request's prefix lookups, one per source, shared by every bucket attempt of
/// that request (misses and unavailable sources included). A memo belongs to one
/// request: its token ids and namespace are not part of the key.
#[derive(Default)]
pub struct PrefixMemo {
    entries: Mutex<Vec<Entry>>,
}

impl PrefixMemo {
    /// An empty memo.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lookup of `token_ids` in `namespace` of `source`, asking the source only
    /// the first time (a `dry_run` one: see [`CacheSource::lookup`]).
    pub async fn lookup(
        &self,
        source: &Arc<dyn CacheSource>,
        namespace: Option<&str>,
        token_ids: &[u32],
        dry_run: bool,
    ) -> Arc<Result<CacheLookup, CacheQueryError>> {
        if let Some(found) = self.find(source) {
            return found;
        }
        let answer = Arc::new(source.lookup(namespace, token_ids, dry_run).await);
        let mut entries = self.entries.lock();
        if let Some((_, found)) = entries.iter().find(|(s, _)| Arc::ptr_eq(s, source)) {
            return Arc::clone(found);
        }
        entries.push((Arc::clone(source), Arc::clone(&answer)));
        answer
    }

    /// How many sources were asked.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether no source was asked yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn find(
        &self,
        source: &Arc<dyn CacheSource>,
    ) -> Option<Arc<Result<CacheLookup, CacheQueryError>>> {
        self.entries
            .lock()
            .iter()
            .find(|(s, _)| Arc::ptr_eq(s, source))
            .map(|(_, answer)| Arc::clone(answer))
    }
}

impl fmt::Debug for PrefixMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefixMemo")
            .field("sources", &self.len())
            .finish()
    }
}

/// Memos compare by identity: two memos are equal only when they are the same memo.
impl PartialEq for PrefixMemo {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for PrefixMemo {}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use router_state::Role;

    use super::*;

    fn engine(i: usize) -> Arc<Engine> {
        let id = format!("e{i:03}");
        Arc::new(Engine::new(id.as_str(), "http://e", "m", Role::Plain))
    }

    proptest! {
        #[test]
        fn the_merge_finds_what_a_search_per_candidate_finds(
            held in proptest::collection::vec((0usize..4, 0usize..3), 1..200),
            candidates in proptest::collection::vec(any::<bool>(), 1..200),
            rotate in 0usize..200,
        ) {
            // Engine i holds held[i].0 blocks, held[i].1 of them only on a slower
            // tier; candidate j is engine j when candidates[j]. The hits of even
            // engines share the candidates' id strings (as a router's do), the odd
            // ones' are copies.
            let all: Vec<Arc<Engine>> = (0..200).map(engine).collect();
            let id_of = |i: usize| if i.is_multiple_of(2) { all[i].id().clone() } else { engine(i).id().clone() };
            let ids = |f: &dyn Fn(usize, (usize, usize)) -> Option<usize>| -> Vec<(EngineId, usize)> {
                held.iter()
                    .enumerate()
                    .filter_map(|(i, h)| f(i, *h).map(|v| (id_of(i), v)))
                    .collect()
            };
            let hits = PrefixHits {
                query_blocks: 4,
                block_size: 16,
                engines: ids(&|_, (b, _)| (b > 0).then_some(b)),
                slower_blocks: ids(&|_, (b, s)| (b > 0 && s.min(b) > 0).then_some(s.min(b))),
                ..PrefixHits::default()
            };
            let mut engines: Vec<Arc<Engine>> = candidates
                .iter()
                .enumerate()
                .filter(|(_, c)| **c)
                .map(|(j, _)| Arc::clone(&all[j]))
                .collect();
            prop_assert_eq!(hits.merged(&engines), Some(hits.searched(&engines)));
            prop_assert_eq!(hits.held_among(&engines), hits.searched(&engines));
            // Candidates out of id order: the merge answers exactly or not at all.
            let len = engines.len();
            engines.rotate_left(rotate % len.max(1));
            let merged = hits.merged(&engines);
            prop_assert!(merged.is_none() || merged == Some(hits.searched(&engines)));
            prop_assert_eq!(hits.held_among(&engines), hits.searched(&engines));
            engines.reverse();
            let merged = hits.merged(&engines);
            prop_assert!(merged.is_none() || merged == Some(hits.searched(&engines)));
            prop_assert_eq!(hits.held_among(&engines), hits.searched(&engines));
        }
    }
}
