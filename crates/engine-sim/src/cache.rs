//! The prefix cache of one rank: KV pages in a radix structure with LRU eviction.
//!
//! A page is `page_size` prompt tokens. Its key is SGLang's page hash: SHA-256 over the
//! previous page's full digest (none for the first page) and the page's tokens as
//! little-endian `u32`; the published block hash is the digest's first eight bytes,
//! big-endian, as a signed 64-bit integer. A page can be evicted only when it is a
//! leaf (no cached page extends it) and no running request holds it.

use std::collections::{BTreeSet, HashMap};

use sha2::{Digest, Sha256};

/// One full page of a prompt: its chained digest and published hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageKey {
    digest: [u8; 32],
    /// The block hash engines publish for this page.
    pub(crate) hash: i64,
}

/// The keys of every full page of `tokens`, in prompt order, for LoRA adapter
/// `adapter` (`None`: the base model): its name goes into every page's key (through
/// the first page's, which every later one chains), so an adapter's pages are never
/// the base model's or another adapter's.
pub fn page_keys(tokens: &[u32], page_size: usize, adapter: Option<&str>) -> Vec<PageKey> {
    let mut keys = Vec::with_capacity(tokens.len() / page_size);
    extend_page_keys(&mut keys, tokens, page_size, adapter);
    keys
}

/// Appends the keys of `tokens`' full pages after the first `keys.len()`, whose keys
/// `keys` already holds (the caller vouches for that): a prompt that extends one whose
/// keys are known hashes only its new pages.
pub fn extend_page_keys(
    keys: &mut Vec<PageKey>,
    tokens: &[u32],
    page_size: usize,
    adapter: Option<&str>,
) {
    let known = keys.len();
    let mut previous: Option<[u8; 32]> = keys.last().map(|k| k.digest);
    for page in tokens.chunks_exact(page_size).skip(known) {
        let mut hasher = Sha256::new();
        match (previous, adapter) {
            (Some(previous), _) => hasher.update(previous),
            (None, Some(adapter)) => hasher.update(adapter.as_bytes()),
            (None, None) => {}
        }
        for token in page {
            hasher.update(token.to_le_bytes());
        }
        let digest: [u8; 32] = hasher.finalize().into();
        let hash = i64::from_be_bytes(digest[..8].try_into().expect("eight bytes"));
        keys.push(PageKey { digest, hash });
        previous = Some(digest);
    }
}

impl PageKey {
    /// The block hash engines publish for this page.
    pub fn hash(&self) -> i64 {
        self.hash
    }
}

#[derive(Debug)]
struct Page {
    parent: Option<[u8; 32]>,
    hash: i64,
    children: u32,
    holders: u32,
    last_used: u64,
}

impl Page {
    fn evictable(&self) -> bool {
        self.children == 0 && self.holders == 0
    }
}

/// What a cache change means for the KV-event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheChange {
    /// Hashes of evicted pages.
    pub removed: Vec<i64>,
    /// Newly cached pages: their hashes, in chain order.
    pub stored: Vec<i64>,
    /// Hash of the cached page the stored chain extends, if any.
    pub parent: Option<i64>,
    /// The request now holds its pages `..held` and must release exactly those.
    pub held: usize,
}

/// One rank's prefix cache.
#[derive(Debug)]
pub struct PrefixCache {
    capacity_pages: usize,
    pages: HashMap<[u8; 32], Page>,
    /// Evictable pages by last use: the LRU order.
    evictable: BTreeSet<(u64, [u8; 32])>,
    clock: u64,
}

impl PrefixCache {
    /// An empty cache of `capacity_pages` pages.
    pub fn new(capacity_pages: usize) -> Self {
        Self {
            capacity_pages,
            pages: HashMap::new(),
            evictable: BTreeSet::new(),
            clock: 0,
        }
    }

    /// The most pages it holds.
    pub(crate) fn capacity_pages(&self) -> usize {
        self.capacity_pages
    }

    /// Cached pages.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pages.len()
    }

    /// How many leading pages of `keys` are cached, without touching them.
    pub fn peek(&self, keys: &[PageKey]) -> usize {
        keys.iter()
            .take_while(|k| self.pages.contains_key(&k.digest))
            .count()
    }

    /// Holds the cached leading pages of `keys` for a running request and marks them
    /// used; returns how many were cached.
    pub fn hold_prefix(&mut self, keys: &[PageKey]) -> usize {
        let matched = self.peek(keys);
        for key in &keys[..matched] {
            self.clock += 1;
            let clock = self.clock;
            self.update(&key.digest, |page| {
                page.holders += 1;
                page.last_used = clock;
            });
        }
        matched
    }

    /// Caches `keys[from..]` (the request already holds `keys[..from]`), evicting
    /// least recently used free leaves to make room. The new pages are held by the
    /// request. Stops early when nothing more can be evicted.
    pub fn insert(&mut self, keys: &[PageKey], from: usize) -> CacheChange {
        let mut change = CacheChange {
            removed: Vec::new(),
            stored: Vec::new(),
            parent: from.checked_sub(1).map(|i| keys[i].hash),
            held: from,
        };
        for (i, key) in keys.iter().enumerate().skip(from) {
            if self.pages.contains_key(&key.digest) {
                // Cached by a concurrent request since this one matched: hold it, and
                // store what follows under it.
                self.update(&key.digest, |page| page.holders += 1);
                change.held = i + 1;
                if change.stored.is_empty() {
                    change.parent = Some(key.hash);
                }
                continue;
            }
            if self.pages.len() >= self.capacity_pages && !self.evict_one(&mut change.removed) {
                break;
            }
            let parent = i.checked_sub(1).map(|p| keys[p].digest);
            if let Some(parent) = &parent {
                self.update(parent, |page| page.children += 1);
            }
            self.clock += 1;
            self.pages.insert(
                key.digest,
                Page {
                    parent,
                    hash: key.hash,
                    children: 0,
                    holders: 1,
                    last_used: self.clock,
                },
            );
            change.stored.push(key.hash);
            change.held = i + 1;
        }
        change
    }

    /// Releases a request's hold on `keys` (pages cleared meanwhile are skipped).
    pub fn release(&mut self, keys: &[PageKey]) {
        for key in keys {
            self.update(&key.digest, |page| {
                page.holders = page.holders.saturating_sub(1)
            });
        }
    }

    /// Drops every page; returns how many there were.
    pub fn clear(&mut self) -> usize {
        let n = self.pages.len();
        self.pages.clear();
        self.evictable.clear();
        n
    }

    fn evict_one(&mut self, removed: &mut Vec<i64>) -> bool {
        let Some((_, digest)) = self.evictable.pop_first() else {
            return false;
        };
        let page = self
            .pages
            .remove(&digest)
            .expect("evictable pages are cached");
        removed.push(page.hash);
        if let Some(parent) = page.parent {
            self.update(&parent, |p| p.children -= 1);
        }
        true
    }

    /// Applies `f` to a cached page and keeps the evictable set in step.
    fn update(&mut self, digest: &[u8; 32], f: impl FnOnce(&mut Page)) {
        let Some(page) = self.pages.get_mut(digest) else {
            return;
        };
        if page.evictable() {
            self.evictable.remove(&(page.last_used, *digest));
        }
        f(page);
        if page.evictable() {
            self.evictable.insert((page.last_used, *digest));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: u32, salt: u32) -> Vec<u32> {
        (0..n).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn page_hashes_chain_like_sglang() {
        let keys = page_keys(&[1, 2, 3, 4, 5], 2, None);
        assert_eq!(keys.len(), 2, "only full pages");
        let first: [u8; 32] = Sha256::digest([1u32, 2].map(u32::to_le_bytes).concat()).into();
        let mut second = Sha256::new();
        second.update(first);
        second.update([3u32, 4].map(u32::to_le_bytes).concat());
        let second: [u8; 32] = second.finalize().into();
        assert_eq!(
            keys[0].hash,
            i64::from_be_bytes(first[..8].try_into().unwrap())
        );
        assert_eq!(
            keys[1].hash,
            i64::from_be_bytes(second[..8].try_into().unwrap())
        );
        assert_ne!(
            page_keys(&[3, 4], 2, None)[0].hash,
            keys[1].hash,
            "a page's hash depends on its prefix"
        );
    }

    #[test]
    fn a_second_request_with_the_same_prefix_hits_the_cache() {
        let mut cache = PrefixCache::new(100);
        let keys = page_keys(&tokens(64, 0), 16, None);
        assert_eq!(cache.hold_prefix(&keys), 0);
        let change = cache.insert(&keys, 0);
        assert_eq!(
            (change.stored.len(), change.parent, change.removed.len()),
            (4, None, 0)
        );
        cache.release(&keys);
        let longer = page_keys(&tokens(96, 0), 16, None);
        assert_eq!(cache.hold_prefix(&longer), 4);
        let change = cache.insert(&longer, 4);
        assert_eq!(change.stored, [longer[4].hash, longer[5].hash]);
        assert_eq!(change.parent, Some(longer[3].hash));
    }

    #[test]
    fn evicts_least_recently_used_free_leaves_only() {
        let mut cache = PrefixCache::new(4);
        let a = page_keys(&tokens(32, 1), 16, None);
        let b = page_keys(&tokens(32, 2), 16, None);
        cache.insert(&a, 0);
        cache.release(&a);
        cache.insert(&b, 0);
        let held_b = b.clone();
        let c = page_keys(&tokens(32, 3), 16, None);
        let change = cache.insert(&c, 0);
        assert_eq!(
            change.removed,
            [a[1].hash, a[0].hash],
            "a's leaf goes first, then its parent"
        );
        assert_eq!(change.stored.len(), 2);
        let d = page_keys(&tokens(16, 4), 16, None);
        let change = cache.insert(&d, 0);
        assert!(
            change.stored.is_empty() && change.removed.is_empty(),
            "held pages are never evicted"
        );
        assert_eq!(change.held, 0);
        cache.release(&held_b);
        let change = cache.insert(&d, 0);
        assert_eq!(change.removed, [b[1].hash]);
        assert_eq!(cache.len(), 4);
    }

    #[test]
    fn clearing_tolerates_later_releases() {
        let mut cache = PrefixCache::new(10);
        let keys = page_keys(&tokens(48, 0), 16, None);
        cache.insert(&keys, 0);
        assert_eq!(cache.clear(), 3);
        cache.release(&keys);
        assert_eq!(cache.peek(&keys), 0);
        assert_eq!(cache.insert(&keys, 0).stored.len(), 3);
    }
}
