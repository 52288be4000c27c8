//! The prefix index: which engine (rank) holds which page, by the router's chain hash.
//!
//! Each node is one page position of one prefix, keyed by its chain hash; its owners
//! are a bitset of sources (an engine rank's incarnation), so a lookup walks a
//! request's chain hashes and intersects bitsets, one word per 64 sources. Only the
//! words with an owner are kept, one of them in the node, so a page one rank holds
//! costs the same whatever the rank (see `node`). Each source keeps its engine's own
//! hashes only to resolve parents and removals: one per page it holds, kept in the
//! page's node too, so evicting a page forgets its engine hashes and a source's map
//! never holds more than the entry budget. A page announced again under another
//! engine hash is known by the latest one; a later removal or continuation naming an
//! evicted or replaced hash is skipped as unknown (`unknown_block`,
//! `unknown_parent`). Tiers are kept per copy: a removal on one tier leaves a copy on
//! another.
//!
//! Memory is bounded by a node budget (`max_nodes`) and an entry budget
//! (`max_entries`, (page, source) ownerships of all sources together): nodes and the
//! pool of leaves (at most one entry per node) follow the first, the sources' engine
//! hashes (one per entry) the second. Past it, the least recently matched leaf of a random sample
//! is evicted with its ancestors no later use reached (see `evict`), a bounded number
//! of pages per hold of the write lock, so lookups wait for one step, never for a
//! pass over the index. While a batch's eviction steps run, the index exceeds the
//! budget by at most the pages of the batches being applied.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{RwLock, RwLockWriteGuard};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::hash::{extend_chain, namespace_seed};
use super::wire::{BlockRemoved, BlockStored, KvBatch, KvEvent, Tier};
use crate::engine::EngineId;

/// Settings of a [`PrefixIndex`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexConfig {
    /// The model's page size; stores of another size are skipped.
    pub block_size: u32,
    /// Most nodes kept; past it the least recently matched leaves are evicted
    /// (approximately: the oldest of a random sample).
    pub max_nodes: usize,
    /// Most (page, source) entries kept, all sources together; past it leaves are
    /// evicted as past `max_nodes`. Pages many engine ranks hold take an entry each
    /// rank, so with many ranks this bounds memory before `max_nodes` does.
    pub max_entries: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            max_nodes: 4 << 20,
            max_entries: 16 << 20,
        }
    }
}

/// Why an event was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SkipReason {
    /// The store's page size is not the model's.
    BlockSizeMismatch,
    /// The store's token count is not pages x page size.
    Misaligned,
    /// The store extends a page this source never announced, or one evicted for the
    /// node budget since (its engine hash is forgotten with it).
    UnknownParent,
    /// The store belongs to a sliding-window, Mamba or unknown cache group.
    NonAttentionGroup,
    /// A removal names a page this source never announced, one evicted for the node
    /// budget since, or an engine hash the source has announced the page under
    /// another since.
    UnknownBlock,
}

impl SkipReason {
    /// Short label for counters.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::BlockSizeMismatch => "block_size_mismatch",
            SkipReason::Misaligned => "misaligned",
            SkipReason::UnknownParent => "unknown_parent",
            SkipReason::NonAttentionGroup => "non_attention_group",
            SkipReason::UnknownBlock => "unknown_block",
        }
    }
}

/// What one batch did to the index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// Pages stored.
    pub stored: usize,
    /// Pages removed.
    pub removed: usize,
    /// Whether the source was cleared.
    pub cleared: bool,
    /// Events skipped, with why.
    pub skipped: Vec<SkipReason>,
}

/// One engine's match of a request's prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineMatch {
    /// The engine.
    pub engine: EngineId,
    /// Leading pages of the request the engine's best rank holds, on any tier (the
    /// best rank: the deepest match, then the most on the device, then the lowest).
    pub blocks: usize,
    /// Of those, the leading pages the same rank holds on the device tier.
    pub device_blocks: usize,
    /// That rank.
    pub rank: u32,
    /// How far behind that rank's KV feed was when its latest live batch arrived
    /// ([`PrefixIndex::set_feed_age`]); zero until one is recorded.
    pub feed_age: Duration,
}

/// A request's prefix ownership.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Pages in the request's query.
    pub query_blocks: usize,
    /// Engines holding at least its first page, with their depths.
    pub engines: Vec<EngineMatch>,
}

impl PrefixMatch {
    /// The depth of `engine`, 0 when it holds nothing.
    pub fn blocks_of(&self, engine: &EngineId) -> usize {
        self.engines
            .iter()
            .find(|m| m.engine == *engine)
            .map_or(0, |m| m.blocks)
    }
}

/// An engine whose KV events have reached the index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Publisher {
    /// The latest restart, flush or gap that cleared one of its sources (`None`:
    /// none since its first batch). What was known of its cache before is void.
    pub cleared_at: Option<Instant>,
}

/// Sizes of the index, for gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexSize {
    /// Nodes (distinct page positions).
    pub nodes: usize,
    /// (page, source) entries.
    pub entries: usize,
    /// Estimated heap bytes.
    pub bytes: usize,
}

type Bits = SmallVec<[u64; 1]>;

fn bit_set(bits: &mut Bits, slot: usize) {
    let word = slot / 64;
    if bits.len() <= word {
        bits.resize(word + 1, 0);
    }
    bits[word] |= 1 << (slot % 64);
}

fn bit_clear(bits: &mut Bits, slot: usize) {
    if let Some(word) = bits.get_mut(slot / 64) {
        *word &= !(1 << (slot % 64));
    }
}

use evict::EVICT_STEP;
use node::Node;
use spill::Spills;
use table::Nodes;

const DEVICE: u8 = 1;

fn tier_bit(tier: Tier) -> u8 {
    match tier {
        Tier::Device => 1,
        Tier::Host => 2,
        Tier::Disk => 4,
        Tier::External => 8,
    }
}

#[derive(Debug)]
struct Source {
    engine: EngineId,
    rank: u32,
    /// Microseconds the feed was behind when its latest live batch arrived.
    feed_age_us: AtomicU64,
    /// Engine hash -> chain hash of the pages this source holds: exactly one entry
    /// per page it owns in the index (the page's node keeps the same engine hash),
    /// so the map never outgrows the entry budget. Changed only through
    /// [`Source::remember`], [`Source::forget`] and [`Source::clear`], which keep its
    /// room within about three times what it holds (see `memory`).
    blocks: FxHashMap<u64, u64>,
    /// The most entries the map had room for since it was last fitted: its real
    /// room, which `capacity` undercounts by the slots of removed entries.
    room: usize,
}

#[derive(Debug, Default)]
struct Inner {
    nodes: Nodes,
    /// What pages keep of their owners beyond their nodes.
    spills: Spills,
    sources: Vec<Option<Source>>,
    slots: FxHashMap<(EngineId, u32), u32>,
    /// Live slots sorted by engine id, then rank: lookups read matches in this order
    /// to answer each engine once in id order without sorting.
    by_engine: Vec<u32>,
    /// Engines with at least one source (those whose events have reached the index).
    publishers: FxHashMap<EngineId, Publisher>,
    degraded: Bits,
    entries: usize,
    /// Every leaf's chain hash, once; a leaf's node knows its position.
    leaves: Vec<u64>,
    /// State of the generator that samples leaves for eviction.
    random: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct PrefixIndex {
    config: IndexConfig,
    inner: RwLock<Inner>,
    clock: AtomicU32,
    evicted: AtomicU64,
}

impl PrefixIndex {
    /// An empty index.
    pub fn new(config: IndexConfig) -> Self {
        Self {
            config,
            inner: RwLock::default(),
            clock: AtomicU32::new(1),
            evicted: AtomicU64::new(0),
        }
    }

    /// The index's settings.
    pub fn config(&self) -> IndexConfig {
        self.config
    }

    /// Chain hashes of a request's full pages in `namespace` (the LoRA adapter the
    /// request is for, as vLLM names it in its events' `lora_name`; `None` for the
    /// base model).
    pub fn request_hashes(&self, namespace: Option<&str>, tokens: &[u32]) -> Vec<u64> {
        super::hash::chain_hashes(
            tokens,
            self.config.block_size as usize,
            namespace_seed(namespace),
        )
    }

    /// Applies one batch from `engine`'s rank `rank`.
    pub fn apply(&self, engine: &EngineId, rank: u32, batch: &KvBatch) -> ApplyOutcome {
        let mut outcome = ApplyOutcome::default();
        let mut inner = self.inner.write();
        let slot = inner.slot(engine, rank);
        // A page just stored counts as just used: it is likely matched soon.
        let now = self.clock.load(Ordering::Relaxed);
        for event in &batch.events {
            match event {
                KvEvent::Stored(store) => {
                    match inner.store(slot, store, self.config.block_size, now) {
                        Ok(n) => outcome.stored += n,
                        Err(reason) => outcome.skipped.push(reason),
                    }
                }
                KvEvent::Removed(remove) => {
                    let (removed, unknown) = inner.remove(slot, remove);
                    outcome.removed += removed;
                    outcome
                        .skipped
                        .extend((0..unknown).map(|_| SkipReason::UnknownBlock));
                }
                KvEvent::AllCleared => {
                    inner.clear_slot(slot);
                    outcome.cleared = true;
                }
            }
        }
        // Eviction runs in steps of a bounded number of pages, letting waiting
        // lookups in between: meanwhile the budget is exceeded by at most the pages
        // of the batches being applied.
        while inner.over(&self.config) {
            let evicted = inner.evict(&self.config, EVICT_STEP);
            self.evicted.fetch_add(evicted as u64, Ordering::Relaxed);
            if evicted == 0 || !inner.over(&self.config) {
                break;
            }
            RwLockWriteGuard::bump(&mut inner);
        }
        inner.fit(&self.config);
        outcome
    }

    /// Forgets everything `engine`'s rank `rank` announced (a restart or an
    /// unrepairable gap); its later events start a new incarnation.
    pub fn clear_source(&self, engine: &EngineId, rank: u32) {
        let mut inner = self.inner.write();
        if let Some(slot) = inner.slots.get(&(engine.clone(), rank)).copied() {
            inner.clear_slot(slot);
        }
    }

    /// What the index knows of `engine` as a publisher of KV events: `None` while no
    /// batch of its has arrived (or after [`remove_engine`](Self::remove_engine)).
    pub fn publisher(&self, engine: &EngineId) -> Option<Publisher> {
        self.inner.read().publishers.get(engine).copied()
    }

    /// Drops every entry of `engine` and frees its sources.
    pub fn remove_engine(&self, engine: &EngineId) {
        let mut inner = self.inner.write();
        let slots: Vec<u32> = inner
            .slots
            .iter()
            .filter(|((e, _), _)| e == engine)
            .map(|(_, s)| *s)
            .collect();
        for slot in slots {
            inner.clear_slot(slot);
            if let Some(source) = inner.sources[slot as usize].take() {
                inner.slots.remove(&(source.engine, source.rank));
                inner.by_engine.retain(|s| *s != slot);
            }
            inner.publishers.remove(engine);
            bit_clear(&mut inner.degraded, slot as usize);
        }
    }

    /// Marks a source's ownership untrusted (a gap being repaired) or trusted again;
    /// lookups ignore degraded sources.
    pub fn set_degraded(&self, engine: &EngineId, rank: u32, degraded: bool) {
        let mut inner = self.inner.write();
        let slot = inner.slot(engine, rank) as usize;
        if degraded {
            bit_set(&mut inner.degraded, slot);
        } else {
            bit_clear(&mut inner.degraded, slot);
        }
    }

    /// Records how far behind `engine`'s rank `rank` was when its latest live batch
    /// arrived (that batch's [`KvBatch::age_at`]); lookups report it with the rank's
    /// matches. A source no batch has named yet is left alone.
    pub fn set_feed_age(&self, engine: &EngineId, rank: u32, age: Duration) {
        let inner = self.inner.read();
        let Some(slot) = inner.slots.get(&(engine.clone(), rank)) else {
            return;
        };
        if let Some(source) = inner.sources.get(*slot as usize).and_then(Option::as_ref) {
            let micros = u64::try_from(age.as_micros()).unwrap_or(u64::MAX);
            source.feed_age_us.store(micros, Ordering::Relaxed);
        }
    }

    /// Each engine's feed age ([`set_feed_age`](Self::set_feed_age)), its most
    /// lagging rank's; sorted by engine id. One pass over the sources, which
    /// `by_engine` keeps in engine order: the lock the feeds' batches wait for is held
    /// for that pass alone.
    pub fn feed_ages(&self) -> Vec<(EngineId, Duration)> {
        let inner = self.inner.read();
        let mut ages: Vec<(EngineId, Duration)> = Vec::with_capacity(inner.publishers.len());
        let sources = inner
            .by_engine
            .iter()
            .filter_map(|&slot| inner.sources.get(slot as usize)?.as_ref());
        for source in sources {
            let age = Duration::from_micros(source.feed_age_us.load(Ordering::Relaxed));
            match ages.last_mut() {
                Some((engine, most)) if *engine == source.engine => *most = (*most).max(age),
                _ => ages.push((source.engine.clone(), age)),
            }
        }
        ages
    }

    /// Current sizes.
    pub fn size(&self) -> IndexSize {
        let inner = self.inner.read();
        IndexSize {
            nodes: inner.nodes.len(),
            entries: inner.entries,
            bytes: inner.bytes(),
        }
    }

    /// Engine hashes the sources keep, all sources together.
    #[cfg(test)]
    fn engine_hashes(&self) -> usize {
        let inner = self.inner.read();
        inner.sources.iter().flatten().map(|s| s.blocks.len()).sum()
    }

    /// Room for engine hashes the sources' maps have, all sources together.
    #[cfg(test)]
    fn engine_hash_room(&self) -> usize {
        let inner = self.inner.read();
        inner.sources.iter().flatten().map(|s| s.room).sum()
    }

    /// Nodes evicted for the budget since start.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Whether the given source holds the page with this chain hash (for tests and
    /// diagnostics).
    pub fn holds(&self, engine: &EngineId, rank: u32, chain: u64) -> bool {
        let inner = self.inner.read();
        let Some(slot) = inner.slots.get(&(engine.clone(), rank)) else {
            return false;
        };
        inner
            .nodes
            .get(chain)
            .is_some_and(|n| n.tiers_of(&inner.spills, *slot) != 0)
    }
}

impl Inner {
    fn slot(&mut self, engine: &EngineId, rank: u32) -> u32 {
        if let Some(slot) = self.slots.get(&(engine.clone(), rank)) {
            return *slot;
        }
        let slot = match self.sources.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.sources.push(None);
                self.sources.len() - 1
            }
        };
        self.sources[slot] = Some(Source {
            engine: engine.clone(),
            rank,
            feed_age_us: AtomicU64::new(0),
            blocks: FxHashMap::default(),
            room: 0,
        });
        self.slots.insert((engine.clone(), rank), slot as u32);
        let sources = &self.sources;
        let at = self.by_engine.partition_point(|&s| {
            sources[s as usize]
                .as_ref()
                .is_some_and(|s| (&s.engine, s.rank) < (engine, rank))
        });
        self.by_engine.insert(at, slot as u32);
        self.publishers.entry(engine.clone()).or_default();
        slot as u32
    }

    fn source(&mut self, slot: u32) -> &mut Source {
        self.sources[slot as usize]
            .as_mut()
            .expect("a live slot has a source")
    }

    fn store(
        &mut self,
        slot: u32,
        store: &BlockStored,
        block_size: u32,
        now: u32,
    ) -> Result<usize, SkipReason> {
        if store.block_size != block_size {
            return Err(SkipReason::BlockSizeMismatch);
        }
        if store.tokens.len() != store.block_hashes.len() * block_size as usize {
            return Err(SkipReason::Misaligned);
        }
        let attention = matches!(
            store.group_kind.as_deref(),
            Some("full_attention" | "mla_attention")
        ) || (store.group_kind.is_none() && store.group_idx.unwrap_or(0) == 0);
        if !attention {
            return Err(SkipReason::NonAttentionGroup);
        }
        let seed = match store.parent {
            None => namespace_seed(store.namespace.as_deref()),
            Some(parent) => *self
                .source(slot)
                .blocks
                .get(&parent)
                .ok_or(SkipReason::UnknownParent)?,
        };
        let mut chain = Vec::with_capacity(store.block_hashes.len());
        extend_chain(&mut chain, &store.tokens, block_size as usize, seed);
        let mask = tier_bit(store.tier);
        let mut parent = if store.parent.is_some() { seed } else { 0 };
        // 0 is no page (a first page's parent): a chain stops at a page whose hash
        // is 0, which xxh3 gives one page in 2^64.
        let pages = chain.iter().take_while(|hash| **hash != 0).count();
        for (engine_hash, hash) in store.block_hashes.iter().zip(&chain[..pages]) {
            if !self.nodes.contains(*hash) {
                self.insert_leaf(*hash, parent, now);
            }
            let node = self.nodes.get_mut(*hash).expect("present or just inserted");
            let before = node.tiers_of(&self.spills, slot);
            let renamed = node
                .engine_hash(&self.spills, slot)
                .filter(|h| h != engine_hash);
            if before == 0 {
                self.entries += 1;
            }
            node.own(&mut self.spills, slot, before | mask, *engine_hash);
            // One engine hash per page and source: a page announced again under
            // another hash is known by the new one only, and a hash that named other
            // content before names this page now (the other page loses the source).
            let source = self.source(slot);
            if let Some(old) = renamed {
                source.forget(old);
            }
            if let Some(other) = source.remember(*engine_hash, *hash)
                && other != *hash
            {
                self.disown(slot, other);
            }
            parent = *hash;
        }
        Ok(pages)
    }

    /// Returns (pages removed, unknown pages).
    fn remove(&mut self, slot: u32, remove: &BlockRemoved) -> (usize, usize) {
        let mask = remove.tier.map_or(0xff, tier_bit);
        let (mut removed, mut unknown) = (0, 0);
        for engine_hash in &remove.block_hashes {
            let Some(hash) = self.source(slot).blocks.get(engine_hash).copied() else {
                unknown += 1;
                continue;
            };
            let node = self
                .nodes
                .get_mut(hash)
                .expect("a source's engine hashes name pages it holds");
            let left = node.tiers_of(&self.spills, slot) & !mask;
            if left == 0 {
                self.source(slot).forget(*engine_hash);
                self.disown(slot, hash);
            } else {
                node.set_tiers(&mut self.spills, slot, left);
            }
            removed += 1;
        }
        (removed, unknown)
    }

    fn clear_slot(&mut self, slot: u32) {
        let source = self.source(slot);
        source.feed_age_us.store(0, Ordering::Relaxed);
        let engine = source.engine.clone();
        self.publishers.insert(
            engine,
            Publisher {
                cleared_at: Some(Instant::now()),
            },
        );
        for hash in self.source(slot).clear() {
            self.disown(slot, hash);
        }
    }

    /// Drops `slot`'s copies of the page `hash` (its engine hash is the caller's to
    /// forget) and prunes what that leaves ownerless.
    fn disown(&mut self, slot: u32, hash: u64) {
        if let Some(node) = self.nodes.get_mut(hash)
            && node.tiers_of(&self.spills, slot) != 0
        {
            node.disown(&mut self.spills, slot);
            self.entries -= 1;
            self.prune(hash);
        }
    }

    /// Deletes `hash` and its ancestors while they are ownerless leaves.
    fn prune(&mut self, mut hash: u64) {
        while let Some(node) = self.nodes.get(hash) {
            if node.children() > 0 || node.has_owners() {
                return;
            }
            let parent = node.parent;
            self.remove_node(hash);
            if parent == 0 {
                return;
            }
            hash = parent;
        }
    }
}

mod evict;
mod lookup;
mod memory;
mod node;
mod spill;
mod table;
#[cfg(test)]
mod tests;
