//! Synthetic KV traffic: ranks caching pages at a set rate without requests, so a
//! fleet of simulated engines publishes as many KV events as a busy one.
//!
//! Each rank grows a document of its own a few pages at a time, through its prefix
//! cache as a request's pages are cached: stored pages extend the document's cached
//! chain (their parent is its last page), evictions keep the cache within its
//! capacity, and both are published as the events a request's pages cause. A document
//! stops at [`DOCUMENT_PAGES`] pages (or half the cache) and a new one starts; one
//! whose pages were evicted or cleared starts over.

use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior, interval};

use super::{Rank, SimEngine, change_events};
use crate::cache::{PageKey, extend_page_keys};

/// How often synthetic pages are cached: each tick caches the pages due since the
/// last one.
pub(crate) const SYNTHETIC_TICK: Duration = Duration::from_millis(100);

/// The longest synthetic document, in pages.
const DOCUMENT_PAGES: usize = 32;

/// Token ids of synthetic documents are below this (a vocabulary's size).
const VOCABULARY: u64 = 100_000;

/// The synthetic document a rank is caching.
#[derive(Debug, Default)]
struct Document {
    /// Documents this rank started before this one.
    number: u64,
    tokens: Vec<u32>,
    keys: Vec<PageKey>,
}

impl Document {
    fn start_next(&mut self) {
        self.number += 1;
        self.tokens.clear();
        self.keys.clear();
    }

    /// Appends `pages` pages of tokens, unique to `salt`, the rank and the document.
    fn extend(&mut self, pages: usize, page_size: usize, salt: u64, rank: u32) {
        let start = self.tokens.len() as u64;
        let seed = mix(mix(salt ^ u64::from(rank).rotate_left(32)) ^ self.number);
        self.tokens.extend(
            (start..start + (pages * page_size) as u64)
                .map(|position| (mix(seed ^ position) % VOCABULARY) as u32),
        );
        extend_page_keys(&mut self.keys, &self.tokens, page_size, None);
    }
}

/// SplitMix64's finaliser: a well-spread 64-bit value of `x`.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rank {
    /// Caches `pages` more pages of the rank's synthetic document `doc` and publishes
    /// what changed as one batch (fewer pages when running requests hold every page
    /// the cache could evict).
    fn store_synthetic(&self, doc: &mut Document, pages: usize, page_size: usize, salt: u64) {
        let mut events = Vec::new();
        let mut stored = 0;
        {
            let mut state = self.state.lock();
            let longest = DOCUMENT_PAGES.min(state.cache.capacity_pages() / 2).max(1);
            while stored < pages {
                if doc.keys.len() >= longest {
                    doc.start_next();
                }
                let matched = state.cache.hold_prefix(&doc.keys);
                if matched < doc.keys.len() {
                    state.cache.release(&doc.keys[..matched]);
                    doc.start_next();
                    continue;
                }
                let want = (pages - stored).min(longest - doc.keys.len());
                doc.extend(want, page_size, salt, self.index);
                let change = state.cache.insert(&doc.keys, matched);
                state.cache.release(&doc.keys[..change.held]);
                let new = change.stored.len();
                let held = change.held;
                events.extend(change_events(change, &doc.tokens, page_size as u32, None));
                stored += new;
                if held < doc.keys.len() {
                    doc.keys.truncate(held);
                    doc.tokens.truncate(held * page_size);
                    if new == 0 {
                        break;
                    }
                }
            }
        }
        self.emit(events);
    }
}

impl SimEngine {
    /// Caches `blocks_per_sec` new pages a second on every rank, without requests,
    /// until dropped: every 100 ms the pages due since start less those
    /// already cached, published (with the evictions they cause) exactly as a
    /// request's pages are. `salt` keeps engines' documents apart.
    pub async fn synthetic_kv(&self, blocks_per_sec: f64, salt: u64) {
        let page_size = self.spec.page_size as usize;
        let mut docs: Vec<Document> = self.ranks.iter().map(|_| Document::default()).collect();
        let mut tick = interval(SYNTHETIC_TICK);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let start = Instant::now();
        let mut done: u64 = 0;
        loop {
            tick.tick().await;
            let due = (blocks_per_sec * start.elapsed().as_secs_f64()).floor() as u64;
            let pages = due.saturating_sub(done) as usize;
            done = due;
            if pages == 0 {
                continue;
            }
            for (rank, doc) in self.ranks.iter().zip(&mut docs) {
                rank.store_synthetic(doc, pages, page_size, salt);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use tokio::sync::mpsc;

    use super::*;
    use crate::engine::{EngineSpec, PublisherMsg};
    use crate::events::KvEvent;
    use crate::faults::{FaultConfig, FaultSet};

    /// Every rank's events so far: (stored hashes with their parents, removed hashes).
    fn drain(
        rx: &mut mpsc::UnboundedReceiver<PublisherMsg>,
    ) -> (Vec<(i64, Option<i64>)>, Vec<i64>) {
        let (mut stored, mut removed) = (Vec::new(), Vec::new());
        while let Ok(PublisherMsg::Batch(events)) = rx.try_recv() {
            for event in events {
                match event {
                    KvEvent::Stored {
                        hashes,
                        parent,
                        tokens,
                        block_size,
                        ..
                    } => {
                        assert_eq!(tokens.len(), hashes.len() * block_size as usize);
                        let mut previous = parent;
                        for hash in hashes {
                            stored.push((hash, previous));
                            previous = Some(hash);
                        }
                    }
                    KvEvent::Removed { hashes, .. } => removed.extend(hashes),
                    KvEvent::Cleared => panic!("synthetic traffic never clears"),
                }
            }
        }
        (stored, removed)
    }

    #[tokio::test(start_paused = true)]
    async fn every_rank_stores_the_configured_pages_a_second_within_its_capacity() {
        let spec = EngineSpec {
            kv_capacity_tokens: 8 * 16,
            page_size: 16,
            dp_size: 2,
            ..EngineSpec::default()
        };
        let (senders, mut receivers): (Vec<_>, Vec<_>) =
            (0..2).map(|_| mpsc::unbounded_channel()).unzip();
        let faults = Arc::new(FaultSet::new(FaultConfig::default()));
        let engine = SimEngine::build(spec, faults, senders);
        tokio::select! {
            () = engine.synthetic_kv(25.0, 7) => unreachable!("runs until dropped"),
            () = tokio::time::sleep(Duration::from_millis(2_050)) => {}
        }
        let mut all_stored = HashSet::new();
        for (rank, rx) in receivers.iter_mut().enumerate() {
            let (stored, removed) = drain(rx);
            assert_eq!(stored.len(), 50, "rank {rank}: 25 pages a second for 2 s");
            let hashes: HashSet<i64> = stored.iter().map(|(h, _)| *h).collect();
            assert_eq!(hashes.len(), 50, "every stored page is new");
            for (hash, parent) in &stored {
                if let Some(parent) = parent {
                    assert!(
                        hashes.contains(parent),
                        "{hash} extends a page stored before"
                    );
                }
            }
            assert!(removed.iter().all(|h| hashes.contains(h)));
            assert_eq!(
                stored.len() - removed.len(),
                engine.ranks[rank].cached_pages(),
                "stored less removed is what the cache holds"
            );
            assert!(
                engine.ranks[rank].cached_pages() <= 8,
                "within the capacity"
            );
            all_stored.extend(hashes);
        }
        assert_eq!(all_stored.len(), 100, "the ranks' documents differ");
    }
}
