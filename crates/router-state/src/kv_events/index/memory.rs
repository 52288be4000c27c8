//! What the index takes in memory: the estimate the gauges report
//! ([`super::IndexSize::bytes`]) and the most it can take with given budgets
//! ([`IndexConfig::memory_bound`]), side by side so that both count the same
//! structures.
//!
//! Every structure is bounded by what it holds: the table of nodes and the pool of
//! leaves by the page budget (both are fitted back after a batch past it), spills by
//! the pages and entries (see `spill`), and each source's map of engine hashes by its
//! own entries, giving back its room once less than a third of it is used.

use super::spill::Spills;
use super::table::Nodes;
use super::{EngineId, IndexConfig, Inner, Publisher, Source};

/// The most [`allocation`] adds to a block.
pub(super) const ALLOCATION_SLACK: usize = 23;

/// What the allocator takes for a block of `bytes`: glibc rounds a block and its
/// 8-byte header up to 16 bytes, at least 32 (mimalloc's size classes take no more
/// for the small blocks most of these are).
pub(super) fn allocation(bytes: usize) -> usize {
    if bytes == 0 {
        0
    } else {
        (bytes + 8).next_multiple_of(16).max(32)
    }
}

/// Entries a source's map may have room for beyond three times what it holds.
const MAP_SPARE: usize = 64;
/// Bytes of an entry of a source's map: engine hash and chain hash.
const MAP_ITEM: usize = 16;

/// Heap bytes of a hash table (std's, that is hashbrown's) with room for `room` items
/// of `item` bytes: below eight buckets a bucket more than the room, from eight a
/// bucket per item and one in eight spare; a control byte a bucket, and 16 more.
fn table_bytes(room: usize, item: usize) -> usize {
    if room == 0 {
        return 0;
    }
    let buckets = if room < 8 { room + 1 } else { room / 7 * 8 };
    allocation(buckets.next_power_of_two() * (item + 1) + 16)
}

/// The most heap bytes a table of at most `items` items of `item` bytes takes,
/// whatever came and went: at most 16 buckets in 7 items, twice that once removed
/// items' slots made it grow, eight buckets at the least.
fn table_bound(items: usize, item: usize) -> usize {
    (items * 32 / 7 + 8) * (item + 1) + 16 + ALLOCATION_SLACK
}

impl Source {
    /// Maps `engine_hash` to `chain`, returning the chain hash it named before.
    pub(super) fn remember(&mut self, engine_hash: u64, chain: u64) -> Option<u64> {
        let before = self.blocks.insert(engine_hash, chain);
        self.room = self.room.max(self.blocks.capacity());
        self.fit();
        before
    }

    /// Forgets `engine_hash`, returning the chain hash it named.
    pub(super) fn forget(&mut self, engine_hash: u64) -> Option<u64> {
        let chain = self.blocks.remove(&engine_hash);
        self.fit();
        chain
    }

    /// Forgets every engine hash and gives back the room, returning the chain hashes
    /// they named.
    pub(super) fn clear(&mut self) -> Vec<u64> {
        let chains = self.blocks.drain().map(|(_, chain)| chain).collect();
        self.blocks.shrink_to_fit();
        self.room = self.blocks.capacity();
        chains
    }

    /// Gives back the map's room once less than a third of it is used (past
    /// [`MAP_SPARE`] entries): the map then has room for at most three times what it
    /// holds, and a shrink (a pass over the map) comes only after a third of the
    /// entries it kept went. It also clears removed entries' slots, which would
    /// otherwise make the map grow while about half full.
    fn fit(&mut self) {
        if self.room > 3 * self.blocks.len() + MAP_SPARE {
            self.blocks.shrink_to_fit();
            self.room = self.blocks.capacity();
        }
    }
}

impl Inner {
    /// Gives back what a batch past the page budget left once its pages are evicted:
    /// the table of nodes goes back to its size for the budget, and the pool of
    /// leaves to room for the budget when it has room for twice as many.
    pub(super) fn fit(&mut self, config: &IndexConfig) {
        self.nodes.fit(config.max_nodes);
        let pool = config.max_nodes.max(self.leaves.len());
        if self.leaves.capacity() > 2 * pool {
            self.leaves.shrink_to(pool);
        }
    }

    /// Heap bytes the index takes, with the allocator's rounding: what
    /// [`super::IndexSize::bytes`] reports.
    pub(super) fn bytes(&self) -> usize {
        let maps: usize = self
            .sources
            .iter()
            .flatten()
            .map(|s| table_bytes(s.room, MAP_ITEM))
            .sum();
        allocation(self.nodes.slot_bytes())
            + self.spills.bytes()
            + allocation(self.leaves.capacity() * 8)
            + maps
            + allocation(self.sources.capacity() * size_of::<Option<Source>>())
            + table_bytes(self.slots.capacity(), size_of::<((EngineId, u32), u32)>())
            + allocation(self.by_engine.capacity() * 4)
            + table_bytes(
                self.publishers.capacity(),
                size_of::<(EngineId, Publisher)>(),
            )
            + if self.degraded.spilled() {
                allocation(self.degraded.capacity() * 8)
            } else {
                0
            }
    }
}

impl IndexConfig {
    /// The most heap bytes a [`super::PrefixIndex`] with these budgets takes once
    /// each batch is applied, counted as [`super::IndexSize::bytes`] counts them,
    /// with at most `sources` engine ranks at once and batches of at most
    /// `batch_pages` pages. Whatever the feeds send, pages shared or not, held by
    /// any ranks on any tiers: about 260 bytes a page of `max_nodes`, 106 an entry
    /// of `max_entries` and 1.9 KiB a source, the worst case of every structure at
    /// once (see docs/configuration.md, "Prefix index memory").
    pub fn memory_bound(&self, sources: usize, batch_pages: usize) -> usize {
        let (pages, entries) = (self.max_nodes, self.max_entries);
        // A source's map: room for three times its entries and `MAP_SPARE` more,
        // 8 buckets in 7 of its room, a control byte each; or 8 buckets at most
        // while its room is below 8.
        let map_entry = 3 * (MAP_ITEM + 1) * 8;
        let maps = (entries * map_entry).div_ceil(7)
            + sources
                * ((MAP_SPARE * (MAP_ITEM + 1) * 8).div_ceil(7)
                    + table_bytes(7, MAP_ITEM)
                    + 16
                    + ALLOCATION_SLACK);
        // What each source takes besides its map: its place among the sources and
        // in the lists of slots, engines, publishers and degraded sources.
        let sources_bytes = 2 * sources * size_of::<Option<Source>>()
            + table_bound(sources, size_of::<((EngineId, u32), u32)>())
            + 2 * sources * 4
            + table_bound(sources, size_of::<(EngineId, Publisher)>())
            + 2 * (sources / 64 + 1) * 8
            + 4 * ALLOCATION_SLACK;
        allocation(Nodes::bound(pages))
            + 2 * pages * 8
            + ALLOCATION_SLACK
            + Spills::bound(pages + batch_pages, pages, entries)
            + maps
            + sources_bytes
    }
}
