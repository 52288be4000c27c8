//! The budgets of pages and entries: a pool of the index's leaves, sampled to find the least recently
//! matched one, which goes with the ancestors no later use reached.
//!
//! Every leaf is in the pool exactly once and knows its position, so pages enter and
//! leave it in O(1). An eviction samples [`SAMPLES`] leaves at random (all of them
//! when the pool is that small) and evicts the one matched longest ago, then its
//! parent while that parent became a leaf and was not matched later: a whole cold
//! conversation goes for one sample. The cost is per evicted page, never per page
//! held, and [`super::PrefixIndex::apply`] evicts at most [`EVICT_STEP`] pages per
//! hold of the write lock.

use std::sync::atomic::Ordering;

use super::{IndexConfig, Inner, Node};

/// Leaves compared per eviction.
const SAMPLES: usize = 16;

/// Most pages evicted per hold of the write lock.
pub(super) const EVICT_STEP: usize = 256;

impl Inner {
    /// Adds the page `hash` under `parent` (0 = none) as a leaf.
    pub(super) fn insert_leaf(&mut self, hash: u64, parent: u64, now: u32) {
        if let Some(p) = self.nodes.get_mut(parent) {
            match p.leaf_at() {
                Some(at) => {
                    p.set_children(1);
                    self.unpool(at);
                }
                None => p.set_children(p.children() + 1),
            }
        }
        let mut node = Node::new(parent, now);
        node.set_leaf_at(self.leaves.len());
        self.leaves.push(hash);
        self.nodes.insert(hash, node);
    }

    /// Deletes the leaf `hash`: its owners forget their engine hashes of it, and its
    /// parent becomes a leaf when it was the last child.
    pub(super) fn remove_node(&mut self, hash: u64) -> Option<Node> {
        let mut node = self.nodes.remove(hash)?;
        if let Some(at) = node.leaf_at() {
            self.unpool(at);
        }
        for slot in node.owner_slots(&self.spills) {
            self.entries -= 1;
            let engine_hash = node.engine_hash(&self.spills, slot);
            if let (Some(engine_hash), Some(source)) =
                (engine_hash, self.sources[slot as usize].as_mut())
            {
                source.forget(engine_hash);
            }
        }
        node.release(&mut self.spills);
        if let Some(p) = self
            .nodes
            .get_mut(node.parent)
            .filter(|p| p.leaf_at().is_none())
        {
            match p.children() {
                0 | 1 => {
                    p.set_leaf_at(self.leaves.len());
                    self.leaves.push(node.parent);
                }
                n => p.set_children(n - 1),
            }
        }
        Some(node)
    }

    /// Removes position `at` from the pool, moving the last leaf there.
    fn unpool(&mut self, at: usize) {
        self.leaves.swap_remove(at);
        if let Some(moved) = self.leaves.get(at) {
            self.nodes
                .get_mut(*moved)
                .expect("pooled leaves exist")
                .set_leaf_at(at);
        }
    }

    /// Whether the index holds more pages or (page, source) entries than `config`
    /// allows.
    pub(super) fn over(&self, config: &IndexConfig) -> bool {
        self.nodes.len() > config.max_nodes || self.entries > config.max_entries
    }

    /// Evicts least recently matched pages, at most `limit`, until the index is
    /// within `config`'s budgets; returns how many went.
    pub(super) fn evict(&mut self, config: &IndexConfig, limit: usize) -> usize {
        let mut evicted = 0;
        while self.over(config) && evicted < limit {
            let Some(mut hash) = self.oldest_sampled_leaf() else {
                break;
            };
            loop {
                let node = self.remove_node(hash).expect("pooled leaves exist");
                evicted += 1;
                let used = node.last_used.load(Ordering::Relaxed);
                let Some(parent) = self.nodes.get(node.parent) else {
                    break;
                };
                // The parent inherits the recency of its deepest use; it goes too
                // when nothing matched it later.
                let own = parent.last_used.fetch_max(used, Ordering::Relaxed);
                if parent.leaf_at().is_none()
                    || own > used
                    || !self.over(config)
                    || evicted >= limit
                {
                    break;
                }
                hash = node.parent;
            }
        }
        evicted
    }

    /// The least recently matched of [`SAMPLES`] leaves drawn at random.
    fn oldest_sampled_leaf(&mut self) -> Option<u64> {
        let pool = self.leaves.len();
        let mut oldest: Option<(u32, u64)> = None;
        for i in 0..pool.min(SAMPLES) {
            let at = if pool <= SAMPLES {
                i
            } else {
                (self.next_random() % pool as u64) as usize
            };
            let hash = self.leaves[at];
            let used = self
                .nodes
                .get(hash)
                .expect("pooled leaves exist")
                .last_used
                .load(Ordering::Relaxed);
            if oldest.is_none_or(|(u, _)| used < u) {
                oldest = Some((used, hash));
            }
        }
        oldest.map(|(_, hash)| hash)
    }

    /// splitmix64: uniform enough to sample leaves, and deterministic.
    fn next_random(&mut self) -> u64 {
        self.random = self.random.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.random;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
impl super::PrefixIndex {
    /// Whether the pool holds exactly the leaves, each once at the position its node
    /// names, and every node counts its children right.
    pub(super) fn pool_is_exact(&self) -> bool {
        let inner = self.inner.read();
        let mut children: std::collections::HashMap<u64, u32> = Default::default();
        for (_, node) in inner.nodes.iter().filter(|(_, n)| n.parent != 0) {
            *children.entry(node.parent).or_default() += 1;
        }
        let leaves = inner
            .nodes
            .iter()
            .filter(|(_, n)| n.leaf_at().is_some())
            .count();
        leaves == inner.leaves.len()
            && inner.nodes.iter().all(|(hash, node)| {
                let counted = children.get(&hash).copied().unwrap_or(0);
                node.children() == counted
                    && match node.leaf_at() {
                        Some(at) => counted == 0 && inner.leaves.get(at) == Some(&hash),
                        None => counted > 0,
                    }
            })
    }
}
