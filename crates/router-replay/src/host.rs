//! A rank's host-memory tier: pages written through from the device cache as they are
//! computed, kept in least-recently-used order, and loaded back onto the device when
//! a prompt's prefix continues there (as vLLM's CPU offloading does).

use std::collections::{BTreeMap, HashMap};

use engine_sim::PageKey;

/// Pages held in host memory, by their published hash.
#[derive(Debug)]
pub(crate) struct HostCache {
    capacity: usize,
    /// Page hash -> when it was last used.
    pages: HashMap<i64, u64>,
    /// When -> page hash: the LRU order.
    order: BTreeMap<u64, i64>,
    clock: u64,
}

/// What writing pages through changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct HostChange {
    /// Runs of newly held pages: `(first index into the keys, how many)`.
    pub(crate) stored: Vec<(usize, usize)>,
    /// Hashes of pages evicted to make room.
    pub(crate) removed: Vec<i64>,
}

impl HostCache {
    /// An empty tier of `capacity` pages.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            pages: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
        }
    }

    /// How many of `keys[from..]` it holds in a row.
    pub(crate) fn run_from(&self, keys: &[PageKey], from: usize) -> usize {
        keys.get(from..)
            .unwrap_or_default()
            .iter()
            .take_while(|k| self.pages.contains_key(&k.hash()))
            .count()
    }

    /// Marks those of `keys` it holds used (a request found them: on the host, or
    /// on the device with their copies here).
    pub(crate) fn touch(&mut self, keys: &[PageKey]) {
        for key in keys {
            if self.pages.contains_key(&key.hash()) {
                self.mark(key.hash());
            }
        }
    }

    /// Writes `keys[from..to]` through: those not held yet are stored (in runs), those
    /// held are marked used, and the least recently used pages are evicted past the
    /// capacity.
    pub(crate) fn write(&mut self, keys: &[PageKey], from: usize, to: usize) -> HostChange {
        let mut change = HostChange::default();
        for (i, key) in keys.iter().enumerate().take(to).skip(from) {
            if !self.pages.contains_key(&key.hash()) {
                match change.stored.last_mut() {
                    Some((first, n)) if *first + *n == i => *n += 1,
                    _ => change.stored.push((i, 1)),
                }
            }
            self.mark(key.hash());
        }
        while self.pages.len() > self.capacity {
            let Some((_, hash)) = self.order.pop_first() else {
                break;
            };
            self.pages.remove(&hash);
            change.removed.push(hash);
        }
        change
    }

    fn mark(&mut self, hash: i64) {
        self.clock += 1;
        if let Some(used) = self.pages.insert(hash, self.clock) {
            self.order.remove(&used);
        }
        self.order.insert(self.clock, hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: u32) -> Vec<PageKey> {
        engine_sim::page_keys(&(0..n * 4).collect::<Vec<u32>>(), 4, None)
    }

    #[test]
    fn writes_through_in_runs_and_evicts_the_least_recently_used() {
        let keys = keys(6);
        let mut host = HostCache::new(4);
        let first = host.write(&keys, 0, 2);
        assert_eq!(first.stored, [(0, 2)]);
        assert!(first.removed.is_empty());
        let mut second = HostCache::new(4);
        second.write(&keys, 1, 2);
        assert_eq!(second.write(&keys, 0, 4).stored, [(0, 1), (2, 2)]);
        let evicting = host.write(&keys, 2, 5);
        assert_eq!(evicting.stored, [(2, 3)]);
        assert_eq!(evicting.removed, [keys[0].hash()]);
        assert_eq!(host.run_from(&keys, 0), 0);
        assert_eq!(host.run_from(&keys, 1), 4);
        host.touch(&keys[..2]);
        assert_eq!(
            host.run_from(&keys, 0),
            0,
            "touching a page not held keeps it out"
        );
        assert_eq!(host.write(&keys, 5, 6).removed, [keys[2].hash()]);
        assert_eq!(
            host.run_from(&keys, 1),
            1,
            "page 1 was used since, page 2 went"
        );
    }
}
