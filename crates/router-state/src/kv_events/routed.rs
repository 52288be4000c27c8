//! Pages the router routed: for each engine, the chain hashes of the prompts the
//! router sent it, oldest first, bounded per engine and in all.
//!
//! Cache-aware routing reads them in two ways. For an engine that publishes KV
//! events they are *pending*: a prompt's pages count on the engine it went to from
//! the moment it is routed until the engine's events announce them
//! ([`confirm`](RoutedPages::confirm)) or a short time passes, so requests sharing a
//! new prefix follow the first one instead of scattering while its events are on the
//! way. For an engine that publishes none they are the only *estimate* there is:
//! pages count until they age out or newer ones push them out of the engine's share
//! (oldest first, as an engine's cache evicts its least recently used pages).
//!
//! How old a mark may be and still count is the reader's rule, per engine (the
//! `max_age` argument of [`extend`](RoutedPages::extend)); this table only keeps
//! them, with the time each page was last routed to each engine.

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::engine::EngineId;

/// The bounds of a [`RoutedPages`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutedPagesConfig {
    /// Pages kept per engine when the caller names no capacity for it.
    pub pages_per_engine: usize,
    /// Pages kept in all, across engines (a page routed to two engines counts
    /// twice); past it, the engine keeping the most loses its oldest.
    pub max_pages: usize,
    /// Engines tracked; past it, the one routed to least recently is forgotten.
    pub max_engines: usize,
}

impl Default for RoutedPagesConfig {
    fn default() -> Self {
        Self {
            pages_per_engine: 16_384,
            max_pages: 1 << 20,
            max_engines: 4_096,
        }
    }
}

/// One engine's mark on a page: when the page was last routed to it.
#[derive(Debug, Clone, Copy)]
struct Mark {
    slot: u32,
    at_ms: u64,
}

/// One engine's marks in routing order; entries whose page was routed again since
/// (a newer mark) are stale and skipped.
#[derive(Debug)]
struct Marks {
    engine: EngineId,
    order: VecDeque<(u64, u64)>,
    live: usize,
    last_ms: u64,
}

#[derive(Debug, Default)]
struct Inner {
    pages: FxHashMap<u64, SmallVec<[Mark; 2]>>,
    engines: Vec<Option<Marks>>,
    slots: FxHashMap<EngineId, u32>,
    total: usize,
}

/// The pages routed to each engine; see the module documentation.
pub struct RoutedPages {
    config: RoutedPagesConfig,
    epoch: Instant,
    inner: Mutex<Inner>,
}

impl RoutedPages {
    /// An empty table bounded by `config`.
    pub fn new(config: RoutedPagesConfig) -> Self {
        Self {
            config,
            epoch: Instant::now(),
            inner: Mutex::default(),
        }
    }

    /// Its bounds.
    pub fn config(&self) -> RoutedPagesConfig {
        self.config
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records that a prompt whose page hashes are `chain` was routed to `engine`,
    /// which holds at most `capacity_pages` pages (the configured share when `None`);
    /// its marks older than `max_age` go first.
    pub fn record(
        &self,
        engine: &EngineId,
        chain: &[u64],
        capacity_pages: Option<usize>,
        max_age: Duration,
    ) {
        if chain.is_empty() {
            return;
        }
        let now = self.now_ms();
        let capacity = capacity_pages
            .unwrap_or(self.config.pages_per_engine)
            .min(self.config.max_pages);
        let mut inner = self.inner.lock();
        let slot = inner.slot(engine, self.config.max_engines, now);
        // A prompt longer than the engine's share keeps its leading pages.
        for &page in chain.iter().take(capacity) {
            inner.mark(slot, page, now);
        }
        let oldest = now.saturating_sub(u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX));
        while inner.marks(slot).live > capacity || inner.front_before(slot, oldest) {
            inner.pop_oldest(slot);
        }
        while inner.total > self.config.max_pages {
            let fullest = inner.fullest();
            inner.pop_oldest(fullest);
        }
        inner.compact(slot);
    }

    /// Drops `engine`'s marks on the pages of `chain`, a prompt's leading pages its
    /// events announced: from the last page back while it has marks there (marks are
    /// made on a prompt's pages past those already held, a run ending where the
    /// prompt did), so the cost is the marks dropped. Marks below a page without
    /// one are left to age; they are under what the events show and count for
    /// nothing.
    pub fn confirm(&self, engine: &EngineId, chain: &[u64]) {
        let mut inner = self.inner.lock();
        let Some(&slot) = inner.slots.get(engine) else {
            return;
        };
        for page in chain.iter().rev() {
            if !inner.unmark(slot, *page) {
                break;
            }
        }
        inner.compact(slot);
    }

    /// Forgets `engine` (it left the fleet).
    pub fn forget(&self, engine: &EngineId) {
        let mut inner = self.inner.lock();
        if let Some(slot) = inner.slots.get(engine).copied() {
            inner.drop_slot(slot);
        }
    }

    /// How far each engine's routed pages carry a prompt whose page hashes are
    /// `chain`: an engine starting at the depth `start` gives it (0 when absent)
    /// continues while it has a mark younger than `max_age(engine)` on the next page
    /// (`None`: its marks do not count). Engines whose marks add nothing are left
    /// out; sorted by engine id.
    pub fn extend(
        &self,
        chain: &[u64],
        start: &[(EngineId, usize)],
        max_age: impl Fn(&EngineId) -> Option<Duration>,
    ) -> Vec<(EngineId, usize)> {
        let Some(first) = chain.first() else {
            return Vec::new();
        };
        let now = self.now_ms();
        let inner = self.inner.lock();
        let mut candidates: SmallVec<[(u32, usize); 8]> = SmallVec::new();
        for (engine, depth) in start {
            if let Some(&slot) = inner.slots.get(engine) {
                candidates.push((slot, *depth));
            }
        }
        for mark in inner.pages.get(first).into_iter().flatten() {
            if !candidates.iter().any(|(slot, _)| *slot == mark.slot) {
                candidates.push((mark.slot, 0));
            }
        }
        let mut extended = Vec::new();
        for (slot, start) in candidates {
            let engine = &inner.marks(slot).engine;
            let Some(max_age) = max_age(engine) else {
                continue;
            };
            let max_age_ms = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
            let mut depth = start;
            while chain
                .get(depth)
                .and_then(|page| inner.marked_at(slot, *page))
                .is_some_and(|at| now.saturating_sub(at) < max_age_ms)
            {
                depth += 1;
            }
            if depth > start {
                extended.push((engine.clone(), depth));
            }
        }
        extended.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        extended
    }

    /// Pages kept, across engines.
    pub fn len(&self) -> usize {
        self.inner.lock().total
    }

    /// Whether no page is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pages kept for `engine`.
    pub fn pages_of(&self, engine: &EngineId) -> usize {
        let inner = self.inner.lock();
        inner
            .slots
            .get(engine)
            .map_or(0, |&slot| inner.marks(slot).live)
    }
}

impl std::fmt::Debug for RoutedPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutedPages")
            .field("config", &self.config)
            .field("pages", &self.len())
            .finish()
    }
}

impl Inner {
    fn marks(&self, slot: u32) -> &Marks {
        self.engines[slot as usize]
            .as_ref()
            .expect("a live slot has marks")
    }

    fn marks_mut(&mut self, slot: u32) -> &mut Marks {
        self.engines[slot as usize]
            .as_mut()
            .expect("a live slot has marks")
    }

    fn slot(&mut self, engine: &EngineId, max_engines: usize, now: u64) -> u32 {
        if let Some(&slot) = self.slots.get(engine) {
            self.marks_mut(slot).last_ms = now;
            return slot;
        }
        if self.slots.len() >= max_engines.max(1) {
            let stalest = self
                .slots
                .values()
                .copied()
                .min_by_key(|&slot| (self.marks(slot).last_ms, slot));
            if let Some(slot) = stalest {
                self.drop_slot(slot);
            }
        }
        let slot = match self.engines.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.engines.push(None);
                self.engines.len() - 1
            }
        };
        self.engines[slot] = Some(Marks {
            engine: engine.clone(),
            order: VecDeque::new(),
            live: 0,
            last_ms: now,
        });
        let slot = slot as u32;
        self.slots.insert(engine.clone(), slot);
        slot
    }

    fn mark(&mut self, slot: u32, page: u64, now: u64) {
        let marks = self.pages.entry(page).or_default();
        match marks.iter_mut().find(|m| m.slot == slot) {
            // Its entry in the order is this one already.
            Some(mark) if mark.at_ms == now => return,
            Some(mark) => mark.at_ms = now,
            None => {
                marks.push(Mark { slot, at_ms: now });
                self.total += 1;
                self.marks_mut(slot).live += 1;
            }
        }
        self.marks_mut(slot).order.push_back((page, now));
    }

    /// Removes `slot`'s mark on `page`, if any; its entry in the order goes stale.
    fn unmark(&mut self, slot: u32, page: u64) -> bool {
        let Some(marks) = self.pages.get_mut(&page) else {
            return false;
        };
        let Some(i) = marks.iter().position(|m| m.slot == slot) else {
            return false;
        };
        marks.swap_remove(i);
        if marks.is_empty() {
            self.pages.remove(&page);
        }
        self.total -= 1;
        self.marks_mut(slot).live -= 1;
        true
    }

    /// The time `slot` last routed `page`, if it holds a mark on it.
    fn marked_at(&self, slot: u32, page: u64) -> Option<u64> {
        self.pages
            .get(&page)
            .and_then(|marks| marks.iter().find(|m| m.slot == slot))
            .map(|m| m.at_ms)
    }

    /// Whether `slot`'s oldest live mark was made before `oldest_ms`.
    fn front_before(&mut self, slot: u32, oldest_ms: u64) -> bool {
        self.skip_stale(slot);
        self.marks(slot)
            .order
            .front()
            .is_some_and(|(_, at)| *at < oldest_ms)
    }

    /// Drops the order's leading entries that no longer name a live mark.
    fn skip_stale(&mut self, slot: u32) {
        while let Some(&(page, at)) = self.marks(slot).order.front() {
            if self.marked_at(slot, page) == Some(at) {
                return;
            }
            self.marks_mut(slot).order.pop_front();
        }
    }

    fn pop_oldest(&mut self, slot: u32) {
        self.skip_stale(slot);
        if let Some((page, _)) = self.marks_mut(slot).order.pop_front() {
            self.unmark(slot, page);
        }
    }

    /// The slot keeping the most marks.
    fn fullest(&self) -> u32 {
        self.slots
            .values()
            .copied()
            .max_by_key(|&slot| (self.marks(slot).live, std::cmp::Reverse(slot)))
            .unwrap_or(0)
    }

    /// Rebuilds `slot`'s order without its stale entries once they outnumber the
    /// live ones, so the order stays within twice the marks.
    fn compact(&mut self, slot: u32) {
        let marks = self.marks(slot);
        if marks.order.len() <= 2 * marks.live + 64 {
            return;
        }
        let order = std::mem::take(&mut self.marks_mut(slot).order);
        let kept: VecDeque<(u64, u64)> = order
            .into_iter()
            .filter(|&(page, at)| self.marked_at(slot, page) == Some(at))
            .collect();
        self.marks_mut(slot).order = kept;
    }

    fn drop_slot(&mut self, slot: u32) {
        let Some(marks) = self.engines[slot as usize].take() else {
            return;
        };
        for (page, _) in &marks.order {
            if let Some(list) = self.pages.get_mut(page)
                && let Some(i) = list.iter().position(|m| m.slot == slot)
            {
                list.swap_remove(i);
                self.total -= 1;
                if list.is_empty() {
                    self.pages.remove(page);
                }
            }
        }
        self.slots.remove(&marks.engine);
    }
}

#[cfg(test)]
mod tests;
