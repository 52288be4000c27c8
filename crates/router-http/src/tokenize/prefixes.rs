//! The token ids of long prompts' prefixes, kept so that the next turn of a
//! conversation, which sends the whole history again, tokenizes only what is new.
//!
//! A prompt is only ever split right after an added token (a chat template's
//! `<|im_start|>`, `<|eot_id|>` ...): added tokens are split out before anything else,
//! and no normalization, pre-tokenization or merge crosses one, so the ids of the text
//! up to such a point, followed by the ids of the rest encoded alone, are exactly the
//! ids of the whole. A prompt's prefix up to its last added token is kept, keyed by a
//! keyed hash of its bytes (and its length): the hash's keys are drawn per process,
//! so a client cannot make its prompt collide with another's. Prompts shorter than
//! [`MIN_PROMPT_BYTES`] are encoded whole, without hashing.
//!
//! The cache is bounded in bytes (the ids' size plus [`ENTRY_OVERHEAD`] an entry) and
//! forgets the least recently used prefix first.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::bytelevel::ByteLevelBpe;

/// Prompts shorter than this are encoded whole: a few thousand tokens at most, a
/// fraction of a millisecond, while their prefixes would crowd the cache.
const MIN_PROMPT_BYTES: usize = 8 << 10;

/// What an entry costs beyond its ids: the map's and the order's slots and the
/// shared slice's counts.
const ENTRY_OVERHEAD: usize = 128;

/// A prefix's key: its length and its bytes' keyed hash.
type Key = (usize, u64);

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct PrefixCache {
    /// The most bytes the entries may take.
    budget: usize,
    /// Prompts shorter than this are encoded whole ([`MIN_PROMPT_BYTES`]).
    min_prompt_bytes: usize,
    hashing: RandomState,
    entries: Mutex<Entries>,
    hits: AtomicU64,
    misses: AtomicU64,
    reused_tokens: AtomicU64,
}

#[derive(Debug, Default)]
struct Entries {
    by_key: HashMap<Key, Entry>,
    /// Keys by last use, oldest first.
    by_use: BTreeMap<u64, Key>,
    clock: u64,
    bytes: usize,
}

#[derive(Debug)]
struct Entry {
    ids: Arc<[u32]>,
    used: u64,
}

/// What the cache has done since it was made, and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompts long enough to look up whose prefix was found.
    pub hits: u64,
    /// Prompts long enough to look up whose prefix was not.
    pub misses: u64,
    /// Token ids taken from the cache instead of encoded.
    pub reused_tokens: u64,
    /// Prefixes held.
    pub entries: u64,
    /// Bytes they take.
    pub bytes: u64,
}

impl PrefixCache {
    /// A cache of at most `budget` bytes.
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            budget,
            min_prompt_bytes: MIN_PROMPT_BYTES,
            hashing: RandomState::new(),
            entries: Mutex::default(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            reused_tokens: AtomicU64::new(0),
        }
    }

    /// The counts so far.
    pub(crate) fn stats(&self) -> PrefixCacheStats {
        let entries = self.entries.lock();
        PrefixCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            reused_tokens: self.reused_tokens.load(Ordering::Relaxed),
            entries: entries.by_key.len() as u64,
            bytes: entries.bytes as u64,
        }
    }

    /// The ids of `text` (see [`ByteLevelBpe::encode`]), starting from the longest
    /// prefix of it the cache holds, and keeping its own longest prefix.
    pub(super) fn encode(&self, encoder: &ByteLevelBpe, text: &str) -> (Vec<u32>, usize) {
        if text.len() < self.min_prompt_bytes || self.budget == 0 {
            return encoder.encode(text);
        }
        let keys = self.keys(text, &encoder.added_ends(text));
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut start = 0;
        match self.longest(&keys) {
            Some((end, prefix)) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.reused_tokens
                    .fetch_add(prefix.len() as u64, Ordering::Relaxed);
                ids.extend_from_slice(&prefix);
                start = end;
            }
            None => drop(self.misses.fetch_add(1, Ordering::Relaxed)),
        }
        if let Some(&(end, hash)) = keys.last()
            && end > start
        {
            let left = encoder.encode_into(&text[start..end], &mut ids);
            if left > 0 {
                return (ids, left + (text.len() - end));
            }
            self.insert((end, hash), Arc::from(&ids[..]));
            start = end;
        }
        let left = encoder.encode_into(&text[start..], &mut ids);
        (ids, left)
    }

    /// The keys of the prefixes of `text` that end at `ends` and are long enough to
    /// keep, shortest first.
    fn keys(&self, text: &str, ends: &[usize]) -> Vec<Key> {
        let mut hasher = self.hashing.build_hasher();
        let mut hashed = 0;
        let mut keys = Vec::new();
        for &end in ends {
            hasher.write(&text.as_bytes()[hashed..end]);
            hashed = end;
            if end >= self.min_prompt_bytes {
                keys.push((end, hasher.clone().finish()));
            }
        }
        keys
    }

    /// The longest of `keys` held, its end and its ids.
    fn longest(&self, keys: &[Key]) -> Option<(usize, Arc<[u32]>)> {
        let mut entries = self.entries.lock();
        let key = *keys.iter().rev().find(|k| entries.by_key.contains_key(k))?;
        let ids = entries.touch(key);
        Some((key.0, ids))
    }

    /// Keeps `ids` under `key`, forgetting the least recently used prefixes while
    /// the budget is exceeded; a prefix over a quarter of the budget is not kept
    /// (it would push out most of the others).
    fn insert(&self, key: Key, ids: Arc<[u32]>) {
        let size = cost(&ids);
        if size > self.budget / 4 {
            return;
        }
        let mut entries = self.entries.lock();
        if entries.by_key.contains_key(&key) {
            entries.touch(key);
            return;
        }
        while entries.bytes + size > self.budget {
            let Some((_, oldest)) = entries.by_use.pop_first() else {
                break;
            };
            if let Some(gone) = entries.by_key.remove(&oldest) {
                entries.bytes -= cost(&gone.ids);
            }
        }
        entries.clock += 1;
        let used = entries.clock;
        entries.by_use.insert(used, key);
        entries.by_key.insert(key, Entry { ids, used });
        entries.bytes += size;
    }
}

impl Entries {
    /// Marks `key` (held) as just used; returns its ids.
    fn touch(&mut self, key: Key) -> Arc<[u32]> {
        self.clock += 1;
        let now = self.clock;
        let entry = self.by_key.get_mut(&key).expect("the key is held");
        let before = std::mem::replace(&mut entry.used, now);
        let ids = Arc::clone(&entry.ids);
        self.by_use.remove(&before);
        self.by_use.insert(now, key);
        ids
    }
}

/// The bytes an entry of `ids` takes.
fn cost(ids: &[u32]) -> usize {
    std::mem::size_of_val(ids) + ENTRY_OVERHEAD
}

#[cfg(test)]
#[path = "prefixes/tests.rs"]
mod tests;
