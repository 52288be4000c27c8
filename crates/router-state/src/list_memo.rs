//! Values computed from a list of engines (a group's candidates, where each candidate
//! sits), kept for the last few lists: the same list comes back request after
//! request (engines change seldom), so the work of one pass over it is done once per
//! list rather than once per request.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::engine::Engine;

/// Lists whose values a memo keeps: the usual one and a few more (an adapter's
/// engines, the list while one engine flaps, a retry's).
pub const KEPT_LISTS: usize = 4;

/// Values computed from lists of engines, kept for [`KEPT_LISTS`] lists: the last
/// ones found.
///
/// A list is found by comparing its engines with a kept one's by pointer, every one
/// (so the comparison runs wide): the same engines in the same order. A registry
/// replaces an engine's `Arc` whenever the engine changes (its health, its
/// adapters), so a kept value never outlives what it was computed from. The memo
/// holds the lists it keeps, so no other engine can take one of their addresses.
pub struct EngineListMemo<V> {
    /// Most recently computed first.
    kept: RwLock<Vec<Kept<V>>>,
    /// Lists computed so far: the clock of [`Kept::found`].
    misses: AtomicU64,
}

struct Kept<V> {
    list: Vec<Arc<Engine>>,
    value: Arc<V>,
    /// [`EngineListMemo::misses`] when the list was last found (or computed): the
    /// list found least recently goes first.
    found: AtomicU64,
}

impl<V> EngineListMemo<V> {
    /// An empty memo.
    pub fn new() -> Self {
        Self {
            kept: RwLock::new(Vec::new()),
            misses: AtomicU64::new(0),
        }
    }

    /// The value of `list`: a kept one, else `compute(list)`, kept in place of the
    /// one found least recently. Finding a list costs one pointer comparison an
    /// engine of each list tried, under a read lock.
    pub fn get(&self, list: &[Arc<Engine>], compute: impl FnOnce(&[Arc<Engine>]) -> V) -> Arc<V> {
        if let Some(value) = self.find(&self.kept.read(), list) {
            return value;
        }
        let entry = Kept {
            list: list.to_vec(),
            value: Arc::new(compute(list)),
            found: AtomicU64::new(self.misses.fetch_add(1, Ordering::Relaxed) + 1),
        };
        let mut kept = self.kept.write();
        // A concurrent miss may have kept the same list meanwhile.
        if let Some(value) = self.find(&kept, list) {
            return value;
        }
        if kept.len() == KEPT_LISTS
            && let Some(oldest) =
                (0..kept.len()).min_by_key(|&at| kept[at].found.load(Ordering::Relaxed))
        {
            kept.remove(oldest);
        }
        let value = Arc::clone(&entry.value);
        kept.insert(0, entry);
        value
    }

    /// The value kept for `list`, marked found now.
    fn find(&self, kept: &[Kept<V>], list: &[Arc<Engine>]) -> Option<Arc<V>> {
        let entry = kept.iter().find(|k| same(&k.list, list))?;
        entry
            .found
            .store(self.misses.load(Ordering::Relaxed), Ordering::Relaxed);
        Some(Arc::clone(&entry.value))
    }

    /// How many lists are kept.
    pub fn len(&self) -> usize {
        self.kept.read().len()
    }

    /// Whether no list is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<V> Default for EngineListMemo<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V> fmt::Debug for EngineListMemo<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineListMemo")
            .field("lists", &self.len())
            .finish()
    }
}

/// Whether two lists hold the same engines in the same order, compared without an
/// early exit.
fn same(kept: &[Arc<Engine>], list: &[Arc<Engine>]) -> bool {
    kept.len() == list.len()
        && kept
            .iter()
            .zip(list)
            .fold(true, |same, (a, b)| same & Arc::ptr_eq(a, b))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::engine::Role;
    use crate::test_util::fleet;

    #[test]
    fn a_kept_list_is_computed_once_and_a_changed_one_again() {
        let engines = fleet("m", Role::Plain, "e", 6);
        let memo = EngineListMemo::new();
        let computed = AtomicUsize::new(0);
        let len = |list: &[Arc<Engine>]| {
            computed.fetch_add(1, Ordering::Relaxed);
            list.len()
        };
        let first = memo.get(&engines, len);
        assert!(
            Arc::ptr_eq(&first, &memo.get(&engines, len)),
            "the same list"
        );
        assert_eq!(computed.load(Ordering::Relaxed), 1);
        // The same ids in another engine (a registry replacing an engine whose
        // health changed): not the kept list.
        let mut replaced = engines.clone();
        replaced[2] = Arc::new(Engine::clone(&engines[2]));
        assert!(!Arc::ptr_eq(&first, &memo.get(&replaced, len)));
        // One fewer, or reordered: lists of their own.
        assert_eq!(*memo.get(&engines[1..], len), 5);
        let mut reversed = engines.clone();
        reversed.reverse();
        memo.get(&reversed, len);
        assert_eq!(computed.load(Ordering::Relaxed), 4);
        // The first list is still kept (four are).
        assert!(Arc::ptr_eq(&first, &memo.get(&engines, len)));
        assert_eq!(computed.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn the_list_found_least_recently_goes_first() {
        let engines = fleet("m", Role::Plain, "e", KEPT_LISTS + 2);
        let memo = EngineListMemo::new();
        let usual = memo.get(&engines, <[Arc<Engine>]>::len);
        // Other lists come and go; the usual one is found between each.
        for skip in 1..=KEPT_LISTS + 1 {
            memo.get(&engines[skip..], <[Arc<Engine>]>::len);
            assert!(
                Arc::ptr_eq(&usual, &memo.get(&engines, <[Arc<Engine>]>::len)),
                "still kept"
            );
        }
        assert_eq!(memo.len(), KEPT_LISTS);
    }

    #[test]
    fn only_the_latest_lists_are_kept() {
        let engines = fleet("m", Role::Plain, "e", KEPT_LISTS + 2);
        let memo = EngineListMemo::new();
        let first = memo.get(&engines, <[Arc<Engine>]>::len);
        for skip in 1..=KEPT_LISTS {
            memo.get(&engines[skip..], <[Arc<Engine>]>::len);
        }
        assert_eq!(memo.len(), KEPT_LISTS);
        assert!(
            !Arc::ptr_eq(&first, &memo.get(&engines, <[Arc<Engine>]>::len)),
            "computed again"
        );
    }
}
