//! Values computed from a list of engines (a group's candidates, where each candidate
//! sits), kept for the last few lists: the same list comes back request after
//! request (engines change seldom), so the work of one pass over it is done once per
//! list rather than once per request.

use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::engine::Engine;

/// Lists whose values a memo keeps: the usual one and a few more (an adapter's
/// engines, the list while one engine flaps, a retry's).
pub const KEPT_LISTS: usize = 4;

/// Values computed from lists of engines, kept for the last [`KEPT_LISTS`] lists.
///
/// A list is found by comparing its engines with a kept one's by pointer, every one
/// (so the comparison runs wide): the same engines in the same order. A registry
/// replaces an engine's `Arc` whenever the engine changes (its health, its
/// adapters), so a kept value never outlives what it was computed from. The memo
/// holds the lists it keeps, so no other engine can take one of their addresses.
pub struct EngineListMemo<V> {
    /// Most recently computed first.
    kept: RwLock<Vec<Kept<V>>>,
}

struct Kept<V> {
    list: Vec<Arc<Engine>>,
    value: Arc<V>,
}

impl<V> EngineListMemo<V> {
    /// An empty memo.
    pub fn new() -> Self {
        Self {
            kept: RwLock::new(Vec::new()),
        }
    }

    /// The value of `list`: a kept one, else `compute(list)`, kept in place of the
    /// oldest.
    pub fn get(&self, list: &[Arc<Engine>], compute: impl FnOnce(&[Arc<Engine>]) -> V) -> Arc<V> {
        if let Some(kept) = self.kept.read().iter().find(|k| same(&k.list, list)) {
            return Arc::clone(&kept.value);
        }
        let value = Arc::new(compute(list));
        let mut kept = self.kept.write();
        kept.insert(
            0,
            Kept {
                list: list.to_vec(),
                value: Arc::clone(&value),
            },
        );
        kept.truncate(KEPT_LISTS);
        value
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
