//! Prefix lookup: walk a request's chain hashes and record, per source, how deep its
//! contiguous match goes (any tier, and on the device).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Bits, EngineMatch, Inner, Node, PrefixIndex, PrefixMatch};

/// Per source that matched, how deep: found by slot in constant time, so a page
/// where a thousand sources stop costs a thousand steps, not a million.
struct Depths {
    /// `(pages of any tier, pages on the device)` by slot; 0 pages of any tier for
    /// no match (a match is of one page at least).
    by_slot: Vec<(u32, u32)>,
    /// Whether any source matched.
    any: bool,
}

impl Depths {
    fn new(slots: usize) -> Self {
        Self {
            by_slot: vec![(0, 0); slots],
            any: false,
        }
    }

    /// Notes that the slots set in `bits` (of word `word`) matched `depth` pages, of
    /// any tier or on the device.
    fn record(&mut self, word: usize, mut bits: u64, depth: usize, any_tier: bool) {
        let depth = u32::try_from(depth).unwrap_or(u32::MAX);
        while bits != 0 {
            let slot = word * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if slot >= self.by_slot.len() {
                self.by_slot.resize(slot + 1, (0, 0));
            }
            let entry = &mut self.by_slot[slot];
            if any_tier {
                entry.0 = depth;
            } else {
                entry.1 = depth;
            }
            self.any = true;
        }
    }

    /// `slot`'s (pages of any tier, pages on the device), when it matched.
    fn of(&self, slot: u32) -> Option<(usize, usize)> {
        let (any, device) = self.by_slot.get(slot as usize).copied()?;
        (any > 0).then_some((any as usize, device as usize))
    }
}

impl PrefixIndex {
    /// Each engine's contiguous matched depth for a request's chain hashes (a
    /// multi-rank engine reports its best rank). Degraded sources are ignored. The
    /// deepest matched page counts as used (eviction keeps recent paths).
    pub fn lookup(&self, chain: &[u64]) -> PrefixMatch {
        by_depth(self.matched(chain, true))
    }

    /// What [`lookup`](Self::lookup) answers, without counting the path as used: for
    /// dry runs, which must leave eviction order as it was.
    pub fn peek(&self, chain: &[u64]) -> PrefixMatch {
        by_depth(self.matched(chain, false))
    }

    /// What [`lookup`](Self::lookup) (or, for a `dry_run`, [`peek`](Self::peek))
    /// answers, its engines sorted by engine id instead of by depth.
    pub fn lookup_by_engine(&self, chain: &[u64], dry_run: bool) -> PrefixMatch {
        self.matched(chain, !dry_run)
    }

    /// The matches in engine-id order, each engine once (its best rank).
    fn matched(&self, chain: &[u64], used: bool) -> PrefixMatch {
        let inner = self.inner.read();
        let (walked, depths) = if inner.sources.len() <= 64 {
            walk_narrow(&inner, chain)
        } else {
            walk_wide(&inner, chain)
        };
        // Recency is kept on the deepest matched page; eviction hands it to the
        // parent when that page goes, so a path is as recent as its deepest use.
        if used
            && let Some(node) = walked
                .checked_sub(1)
                .and_then(|i| inner.nodes.get(chain[i]))
        {
            let now = self.clock.fetch_add(1, Ordering::Relaxed);
            node.last_used.store(now, Ordering::Relaxed);
        }
        let mut engines: Vec<EngineMatch> = Vec::new();
        if !depths.any {
            return PrefixMatch {
                query_blocks: chain.len(),
                engines,
            };
        }
        // Sources in engine order, so each engine's ranks are side by side.
        for &slot in &inner.by_engine {
            let Some((blocks, device_blocks)) = depths.of(slot) else {
                continue;
            };
            let Some(source) = inner.sources.get(slot as usize).and_then(Option::as_ref) else {
                continue;
            };
            let feed_age = Duration::from_micros(source.feed_age_us.load(Ordering::Relaxed));
            let matched = EngineMatch {
                engine: source.engine.clone(),
                blocks,
                device_blocks,
                rank: source.rank,
                feed_age,
            };
            // An engine is its best rank's match, every figure of that one rank: the
            // deepest, then the most on the device, then the lowest rank.
            let better = |m: &EngineMatch| (m.blocks, m.device_blocks, std::cmp::Reverse(m.rank));
            match engines.last_mut() {
                Some(m) if m.engine == source.engine => {
                    if better(&matched) > better(m) {
                        *m = matched;
                    }
                }
                _ => engines.push(matched),
            }
        }
        PrefixMatch {
            query_blocks: chain.len(),
            engines,
        }
    }
}

/// `found` with its engines by depth, deepest first, then by engine id.
fn by_depth(mut found: PrefixMatch) -> PrefixMatch {
    // Stable: engines of one depth stay in id order.
    found.engines.sort_by_key(|m| std::cmp::Reverse(m.blocks));
    found
}

/// The walk when every source fits one 64-bit word (up to 64 engine ranks).
fn walk_narrow(inner: &Inner, chain: &[u64]) -> (usize, Depths) {
    let mut depths = Depths::new(inner.sources.len());
    let mut nodes = nodes(inner, chain);
    let Some(first) = nodes.next() else {
        return (0, depths);
    };
    let spills = &inner.spills;
    let trusted = !inner.degraded.first().copied().unwrap_or(0);
    let (owners, device_owners) = first.owners_in(spills, 0);
    let (mut alive, mut device) = (owners & trusted, device_owners & trusted);
    let mut walked = 1;
    while alive != 0 && walked < chain.len() {
        let Some(node) = nodes.next() else {
            break;
        };
        let (owners, device_owners) = node.owners_in(spills, 0);
        let (left, left_device) = (alive & !owners, device & !device_owners);
        if left | left_device != 0 {
            depths.record(0, left, walked, true);
            depths.record(0, left_device, walked, false);
            alive &= owners;
            device &= device_owners;
        }
        walked += 1;
    }
    depths.record(0, alive, walked, true);
    depths.record(0, device, walked, false);
    (walked, depths)
}

/// The walk over any number of sources, one word of 64 slots at a time. The owners
/// of a chunk's pages are read first, page by page, and then walked: reading a
/// page's spill does not wait for the walk of the page before, so the memory reads
/// of neighbouring pages' spills overlap as their nodes' do (see [`nodes`]).
fn walk_wide(inner: &Inner, chain: &[u64]) -> (usize, Depths) {
    let spills = &inner.spills;
    // More than 64 sources: at least two words.
    let words = inner.sources.len().div_ceil(64);
    let mut alive: Bits = smallvec::smallvec![0; words];
    let mut device: Bits = smallvec::smallvec![0; words];
    // The owners of a chunk's pages, and of their device copies: `words` a page.
    let mut owners = vec![0; LOOKAHEAD * words];
    let mut device_owners = vec![0; LOOKAHEAD * words];
    let mut depths = Depths::new(inner.sources.len());
    let mut walked = 0;
    for chunk in chain.chunks(LOOKAHEAD) {
        let found = chunk_nodes(inner, chunk);
        let pages = found.iter().take_while(|n| n.is_some()).count();
        let page_owners = owners.chunks_exact_mut(words);
        let page_device = device_owners.chunks_exact_mut(words);
        for ((node, o), d) in found[..pages]
            .iter()
            .flatten()
            .zip(page_owners)
            .zip(page_device)
        {
            node.owners_by_word(spills, o, d);
        }
        for p in 0..pages {
            let (o, d) = (&owners[p * words..], &device_owners[p * words..]);
            if walked == 0 {
                for w in 0..words {
                    let trusted = !inner.degraded.get(w).copied().unwrap_or(0);
                    alive[w] = o[w] & trusted;
                    device[w] = d[w] & trusted;
                }
            }
            let mut any = 0;
            for w in 0..words {
                // Device owners are owners: a word without owners left has no device
                // owners either.
                if alive[w] == 0 {
                    continue;
                }
                depths.record(w, alive[w] & !o[w], walked, true);
                depths.record(w, device[w] & !d[w], walked, false);
                alive[w] &= o[w];
                device[w] &= d[w];
                any |= alive[w];
            }
            walked += 1;
            if any == 0 {
                return (walked, depths);
            }
        }
        if pages < chunk.len() {
            break;
        }
    }
    for w in 0..words {
        depths.record(w, alive[w], walked, true);
        depths.record(w, device[w], walked, false);
    }
    (walked, depths)
}

/// Pages looked up at once by [`nodes`].
const LOOKAHEAD: usize = 16;

/// The nodes of a chunk of at most [`LOOKAHEAD`] pages, looked up together so that
/// their memory reads (each likely a cache miss in a large index) overlap instead of
/// following one another.
fn chunk_nodes<'a>(inner: &'a Inner, chunk: &[u64]) -> [Option<&'a Node>; LOOKAHEAD] {
    let mut found = [None; LOOKAHEAD];
    for (slot, hash) in found.iter_mut().zip(chunk) {
        *slot = inner.nodes.get(*hash);
    }
    found
}

/// The nodes of `chain`'s pages in order, up to the first page the index lacks,
/// looked up [`LOOKAHEAD`] at a time (see [`chunk_nodes`]); a walk ending early
/// wastes at most `LOOKAHEAD - 1` lookups.
fn nodes<'a>(inner: &'a Inner, chain: &'a [u64]) -> impl Iterator<Item = &'a Node> + 'a {
    chain
        .chunks(LOOKAHEAD)
        .flat_map(move |chunk| chunk_nodes(inner, chunk).into_iter().take(chunk.len()))
        .map_while(|node| node)
}
