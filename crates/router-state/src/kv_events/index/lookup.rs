//! Prefix lookup: walk a request's chain hashes and record, per source, how deep its
//! contiguous match goes (any tier, and on the device).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Bits, EngineMatch, Inner, PrefixIndex, PrefixMatch};

/// `(slot, pages of any tier, pages on the device)` per source that matched.
type Depths = Vec<(u32, usize, usize)>;

impl PrefixIndex {
    /// Each engine's contiguous matched depth for a request's chain hashes (a
    /// multi-rank engine reports its best rank). Degraded sources are ignored. The
    /// deepest matched page counts as used (eviction keeps recent paths).
    pub fn lookup(&self, chain: &[u64]) -> PrefixMatch {
        self.matched(chain, true)
    }

    /// What [`lookup`](Self::lookup) answers, without counting the path as used: for
    /// dry runs, which must leave eviction order as it was.
    pub fn peek(&self, chain: &[u64]) -> PrefixMatch {
        self.matched(chain, false)
    }

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
                .and_then(|i| inner.nodes.get(&chain[i]))
        {
            let now = self.clock.fetch_add(1, Ordering::Relaxed);
            node.last_used.store(now, Ordering::Relaxed);
        }
        let mut engines: Vec<EngineMatch> = Vec::with_capacity(depths.len());
        for (slot, blocks, device_blocks) in depths {
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
            match engines.iter_mut().find(|m| m.engine == source.engine) {
                Some(m) if better(&matched) > better(m) => *m = matched,
                Some(_) => {}
                None => engines.push(matched),
            }
        }
        engines.sort_by(|a, b| {
            b.blocks
                .cmp(&a.blocks)
                .then_with(|| a.engine.cmp(&b.engine))
        });
        PrefixMatch {
            query_blocks: chain.len(),
            engines,
        }
    }
}

/// The walk when every source fits one 64-bit word (up to 64 engine ranks).
fn walk_narrow(inner: &Inner, chain: &[u64]) -> (usize, Depths) {
    let mut depths = Depths::new();
    let Some(first) = chain.first().and_then(|h| inner.nodes.get(h)) else {
        return (0, depths);
    };
    let trusted = !inner.degraded.first().copied().unwrap_or(0);
    let mut alive = first.owner_word(0) & trusted;
    let mut device = first.device_word(0) & trusted;
    let mut walked = 1;
    while alive != 0 && walked < chain.len() {
        let Some(node) = inner.nodes.get(&chain[walked]) else {
            break;
        };
        let owners = node.owner_word(0);
        let device_owners = node.device_word(0);
        let (left, left_device) = (alive & !owners, device & !device_owners);
        if left | left_device != 0 {
            record(&mut depths, 0, left, walked, true);
            record(&mut depths, 0, left_device, walked, false);
            alive &= owners;
            device &= device_owners;
        }
        walked += 1;
    }
    record(&mut depths, 0, alive, walked, true);
    record(&mut depths, 0, device, walked, false);
    (walked, depths)
}

/// The walk over any number of sources, one word of 64 slots at a time.
fn walk_wide(inner: &Inner, chain: &[u64]) -> (usize, Depths) {
    let mut alive: Bits = Bits::new();
    let mut device: Bits = Bits::new();
    let mut depths = Depths::new();
    let mut walked = 0;
    for (i, hash) in chain.iter().enumerate() {
        let Some(node) = inner.nodes.get(hash) else {
            break;
        };
        if i == 0 {
            let trusted = |w: usize| !inner.degraded.get(w).copied().unwrap_or(0);
            alive = (0..node.owner_words())
                .map(|w| node.owner_word(w) & trusted(w))
                .collect();
            device = (0..node.owner_words())
                .map(|w| node.device_word(w) & trusted(w))
                .collect();
        }
        let mut any = 0;
        for w in 0..alive.len() {
            let owners = node.owner_word(w);
            let device_owners = node.device_word(w);
            record(&mut depths, w, alive[w] & !owners, i, true);
            record(&mut depths, w, device[w] & !device_owners, i, false);
            alive[w] &= owners;
            device[w] &= device_owners;
            any |= alive[w];
        }
        walked = i + 1;
        if any == 0 {
            break;
        }
    }
    for w in 0..alive.len() {
        record(&mut depths, w, alive[w], walked, true);
        record(&mut depths, w, device[w], walked, false);
    }
    (walked, depths)
}

/// Notes that the slots set in `bits` (of word `word`) matched `depth` pages, of any
/// tier or on the device.
fn record(depths: &mut Depths, word: usize, mut bits: u64, depth: usize, any_tier: bool) {
    while bits != 0 {
        let slot = (word * 64) as u32 + bits.trailing_zeros();
        bits &= bits - 1;
        let at = match depths.iter().position(|(s, _, _)| *s == slot) {
            Some(at) => at,
            None => {
                depths.push((slot, 0, 0));
                depths.len() - 1
            }
        };
        if any_tier {
            depths[at].1 = depth;
        } else {
            depths[at].2 = depth;
        }
    }
}
