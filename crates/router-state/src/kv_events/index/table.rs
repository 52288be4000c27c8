//! The index's nodes by chain hash: open addressing in one array of (chain hash,
//! node) slots, probed linearly from a slot the hash picks; a chain hash of 0 marks a
//! free slot (0 is "no page" throughout the index: a first page's parent is 0).
//!
//! Finding a page reads its slot and maybe the next, one place in memory, where a
//! general hash map reads a control byte and then the slot, two places (in a table of
//! millions of pages, two cache and TLB misses instead of one). A removal shifts the
//! slots after it back instead of leaving a tombstone, so pages coming and going never
//! grow the table (a general map's tombstones doubled it at the default budget): it
//! is at most three quarters full and grows only with the pages it holds.

use super::node::Node;

/// Fibonacci hashing: the high bits of the chain hash times this pick the home slot.
const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;
/// The fewest slots of a table that has any.
const MIN_SLOTS: usize = 16;

/// The chain hash first, then the node (see [`Node`]'s layout).
#[derive(Debug)]
#[repr(C)]
struct Slot {
    chain: u64,
    node: Node,
}

impl Slot {
    fn free() -> Self {
        Self {
            chain: 0,
            node: Node::new(0, 0),
        }
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct Nodes {
    /// A power of two of them, or none.
    slots: Vec<Slot>,
    len: usize,
}

/// Slots for a table of `pages`: at most three quarters full.
fn slots_for(pages: usize) -> usize {
    (pages + pages / 3).next_power_of_two().max(MIN_SLOTS)
}

impl Nodes {
    /// Pages held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes of the slots.
    pub(super) fn slot_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
    }

    /// Heap bytes of the slots of a table fitted to `pages` pages.
    pub(super) fn bound(pages: usize) -> usize {
        slots_for(pages) * size_of::<Slot>()
    }

    fn home(&self, chain: u64) -> usize {
        let bits = self.slots.len().trailing_zeros();
        (chain.wrapping_mul(SPREAD) >> (64 - bits)) as usize
    }

    fn find(&self, chain: u64) -> Option<usize> {
        if chain == 0 || self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut at = self.home(chain);
        loop {
            match self.slots[at].chain {
                c if c == chain => return Some(at),
                0 => return None,
                _ => at = (at + 1) & mask,
            }
        }
    }

    pub(super) fn get(&self, chain: u64) -> Option<&Node> {
        self.find(chain).map(|at| &self.slots[at].node)
    }

    pub(super) fn get_mut(&mut self, chain: u64) -> Option<&mut Node> {
        self.find(chain).map(|at| &mut self.slots[at].node)
    }

    pub(super) fn contains(&self, chain: u64) -> bool {
        self.find(chain).is_some()
    }

    /// Adds the page `chain` (not 0, not held).
    pub(super) fn insert(&mut self, chain: u64, node: Node) {
        debug_assert!(chain != 0 && !self.contains(chain));
        if self.slots.len() < slots_for(self.len + 1) {
            self.resize(slots_for(self.len + 1));
        }
        self.place(Slot { chain, node });
        self.len += 1;
    }

    /// Puts `slot` in the first free slot from its home.
    fn place(&mut self, slot: Slot) {
        let mask = self.slots.len() - 1;
        let mut at = self.home(slot.chain);
        while self.slots[at].chain != 0 {
            at = (at + 1) & mask;
        }
        self.slots[at] = slot;
    }

    /// Takes the page `chain` out, moving back the slots after it that its place
    /// would have held.
    pub(super) fn remove(&mut self, chain: u64) -> Option<Node> {
        let mut hole = self.find(chain)?;
        let taken = std::mem::replace(&mut self.slots[hole], Slot::free());
        self.len -= 1;
        let mask = self.slots.len() - 1;
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let next = self.slots[at].chain;
            if next == 0 {
                break;
            }
            // A slot stays when its home lies cyclically after the hole, up to it.
            let home = self.home(next);
            let stays = if hole <= at {
                hole < home && home <= at
            } else {
                hole < home || home <= at
            };
            if !stays {
                self.slots.swap(hole, at);
                hole = at;
            }
        }
        Some(taken.node)
    }

    /// Shrinks the table to the size for `pages` pages (or for those it holds, if
    /// more) when it is larger: after a batch far past the budget.
    pub(super) fn fit(&mut self, pages: usize) {
        let size = slots_for(pages.max(self.len));
        if self.slots.len() > size {
            self.resize(size);
        }
    }

    fn resize(&mut self, size: usize) {
        let mut slots = Vec::with_capacity(size);
        slots.resize_with(size, Slot::free);
        let old = std::mem::replace(&mut self.slots, slots);
        for slot in old.into_iter().filter(|s| s.chain != 0) {
            self.place(slot);
        }
    }

    /// The pages, in no particular order.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Node)> {
        self.slots
            .iter()
            .filter(|s| s.chain != 0)
            .map(|s| (s.chain, &s.node))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn the_table_agrees_with_a_map(
            ops in proptest::collection::vec((any::<bool>(), 1u64..200, any::<u64>()), 1..400),
        ) {
            // Keys crowd onto few home slots when their products share high bits:
            // multiples of a large power of two do.
            let mut table = Nodes::default();
            let mut map: HashMap<u64, u64> = HashMap::new();
            for (insert, key, parent) in ops {
                let chain = if key % 3 == 0 { key << 50 } else { key };
                if insert && !map.contains_key(&chain) {
                    table.insert(chain, Node::new(parent, 0));
                    map.insert(chain, parent);
                } else {
                    let removed = table.remove(chain).map(|n| n.parent);
                    prop_assert_eq!(removed, map.remove(&chain));
                }
                prop_assert_eq!(table.len(), map.len());
                prop_assert!(table.slots.len() >= slots_for(map.len()) || map.is_empty());
                for probe in 1..200 {
                    let chain = if probe % 3 == 0 { probe << 50 } else { probe };
                    prop_assert_eq!(table.get(chain).map(|n| n.parent), map.get(&chain).copied());
                }
            }
            prop_assert_eq!(table.get(0).map(|n| n.parent), None, "0 is no page");
            table.fit(0);
            prop_assert!(table.slots.len() <= slots_for(map.len()), "fitted to what it holds");
            prop_assert_eq!(table.iter().count(), map.len());
        }
    }
}
