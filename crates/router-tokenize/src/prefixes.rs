//! The token ids of long prompts' prefixes, kept so that the next turn of a
//! conversation, which sends the whole history again, tokenizes only what is new.
//!
//! A prompt's first split point is kept too (its start: an agent's system turn
//! with its tool schemas, which every conversation of that agent opens with), so a
//! new conversation that opens the same way tokenizes only what follows it.
//!
//! A prompt is only ever split right after an added token (a chat template's
//! `<|im_start|>`, `<|eot_id|>` ...): added tokens are split out before anything else,
//! and no normalization, pre-tokenization or merge crosses one, so the ids of the text
//! up to such a point, followed by the ids of the rest encoded alone, are exactly the
//! ids of the whole. A prompt's prefix up to its last added token is kept, keyed by its
//! length and a keyed hash of its bytes: the hash's keys are drawn per process, so a
//! client cannot make its prompt collide with another's. Only a prompt's last
//! [`MAX_PROBES`] split points are considered, and only those where some kept prefix
//! ends are hashed and looked up, so a prompt made of added tokens costs no more than
//! any other. Prompts shorter than [`MIN_PROMPT_BYTES`] are encoded whole, without
//! hashing.
//!
//! The cache is bounded in bytes (the ids' size plus [`ENTRY_OVERHEAD`] an entry) and
//! forgets the least recently used prefix first; a prefix that a newly kept one
//! extends (the previous turn's) is forgotten before any other, as the new one holds
//! its ids too, unless it was reused more than once (a branch point: a turn answered
//! again, a shared start), which is kept by its use.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::bytelevel::ByteLevelBpe;

/// Prompts shorter than this are encoded whole: a few hundred tokens at most, tens of
/// microseconds, while their prefixes would crowd the cache. A chat carrying an
/// agent's tool schemas is past it.
const MIN_PROMPT_BYTES: usize = 1 << 10;

/// The most split points of a prompt looked up, its last ones: a conversation's
/// previous turn ends a few added tokens before the end, an agent's turn with many
/// tool calls a few hundred.
const MAX_PROBES: usize = 1024;

/// Prefixes are hashed in blocks of this size, then the bytes up to their end: the
/// same prefix is hashed the same way in every prompt.
const HASH_BLOCK: usize = 4 << 10;

/// What an entry costs beyond its ids: the map's and the order's slots and the
/// shared slice's counts.
const ENTRY_OVERHEAD: usize = 128;

/// Where the use clock starts: ticks below it are given to demoted entries, counting
/// down, so they come first in the order.
const CLOCK_START: u64 = 1 << 63;

/// A prefix's key: its length and its bytes' keyed hash.
type Key = (usize, u64);

/// See the module documentation.
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

impl fmt::Debug for PrefixCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefixCache")
            .field("budget", &self.budget)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

struct Entries {
    by_key: HashMap<Key, Entry>,
    /// How many held prefixes end at each length: only a prompt's split points at
    /// such a length are hashed and looked up.
    lengths: HashMap<usize, u32>,
    /// Keys by last use, oldest first.
    by_use: BTreeMap<u64, Key>,
    /// The last tick given to a use.
    clock: u64,
    /// The last tick given to a demoted entry.
    floor: u64,
    bytes: usize,
}

struct Entry {
    ids: Arc<[u32]>,
    used: u64,
    /// Times the prefix was reused.
    reused: u32,
}

/// What the cache has done since it was made, and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompts whose prefix was found.
    pub hits: u64,
    /// Prompts with a prefix long enough to keep whose prefix was not found.
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
            entries: Mutex::new(Entries {
                by_key: HashMap::new(),
                lengths: HashMap::new(),
                by_use: BTreeMap::new(),
                clock: CLOCK_START,
                floor: CLOCK_START,
                bytes: 0,
            }),
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
        let (ids, untokenized, _) = self.encode_reusing(encoder, text);
        (ids, untokenized)
    }

    /// [`encode`](Self::encode), with the bytes of `text` whose ids a kept prefix gave.
    pub(super) fn encode_reusing(
        &self,
        encoder: &ByteLevelBpe,
        text: &str,
    ) -> (Vec<u32>, usize, usize) {
        if text.len() < self.min_prompt_bytes || self.budget == 0 {
            let (ids, untokenized) = encoder.encode(text);
            return (ids, untokenized, 0);
        }
        let points = self.split_points(encoder, text);
        let Some(&last) = points.last() else {
            let (ids, untokenized) = encoder.encode(text);
            return (ids, untokenized, 0);
        };
        // Only the points where some kept prefix ends are hashed and looked up, and
        // the first: a shared start is kept on its own.
        let first = points[0];
        let mut ends = self.held_lengths(&points);
        ends.push(first);
        ends.push(last);
        ends.sort_unstable();
        ends.dedup();
        let mut keys = self.keys(text, &ends);
        let own = keys.pop().expect("the last point");
        let start_key = keys.iter().copied().find(|key| key.0 == first);
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut start = 0;
        let mut reused = 0;
        let found = self.longest(&keys, own);
        match &found {
            Some((key, prefix)) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.reused_tokens
                    .fetch_add(prefix.len() as u64, Ordering::Relaxed);
                ids.extend_from_slice(prefix);
                start = key.0;
                reused = key.0;
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(key) = start_key
            && key.0 > start
            && key.0 < own.0
        {
            // Its start (an agent's system turn with its tools, which its every
            // conversation opens with), kept apart from the conversation's prefix.
            let left = encoder.encode_into(&text[start..key.0], &mut ids);
            if left > 0 {
                return (ids, left + (text.len() - key.0), reused);
            }
            self.insert(key, &ids, None);
            start = key.0;
        }
        if own.0 > start {
            let left = encoder.encode_into(&text[start..own.0], &mut ids);
            if left > 0 {
                return (ids, left + (text.len() - own.0), reused);
            }
            self.insert(own, &ids, found.map(|(key, _)| key));
            start = own.0;
        }
        let left = encoder.encode_into(&text[start..], &mut ids);
        (ids, left, reused)
    }

    /// Where `text` may be split and the prefix before is long enough to keep: the
    /// last [`MAX_PROBES`] such points, ascending.
    fn split_points(&self, encoder: &ByteLevelBpe, text: &str) -> Vec<usize> {
        let mut ends = VecDeque::with_capacity(MAX_PROBES);
        for end in encoder.added_ends(text) {
            if end >= self.min_prompt_bytes {
                if ends.len() == MAX_PROBES {
                    ends.pop_front();
                }
                ends.push_back(end);
            }
        }
        ends.into()
    }

    /// Those of `points` (ascending) where a kept prefix ends.
    fn held_lengths(&self, points: &[usize]) -> Vec<usize> {
        let entries = self.entries.lock();
        points
            .iter()
            .copied()
            .filter(|end| entries.lengths.contains_key(end))
            .collect()
    }

    /// The keys of the prefixes of `text` that end at `ends` (ascending).
    fn keys(&self, text: &str, ends: &[usize]) -> Vec<Key> {
        let bytes = text.as_bytes();
        let mut blocks = self.hashing.build_hasher();
        let mut hashed = 0;
        ends.iter()
            .map(|&end| {
                while hashed + HASH_BLOCK <= end {
                    blocks.write(&bytes[hashed..hashed + HASH_BLOCK]);
                    hashed += HASH_BLOCK;
                }
                let mut prefix = blocks.clone();
                prefix.write(&bytes[hashed..end]);
                (end, prefix.finish())
            })
            .collect()
    }

    /// The longest held of `own` and `keys` (shorter, ascending), and its ids.
    fn longest(&self, keys: &[Key], own: Key) -> Option<(Key, Arc<[u32]>)> {
        let mut entries = self.entries.lock();
        let key = *std::iter::once(&own)
            .chain(keys.iter().rev())
            .find(|k| entries.by_key.contains_key(k))?;
        let ids = entries.touch(key)?;
        if let Some(entry) = entries.by_key.get_mut(&key) {
            entry.reused = entry.reused.saturating_add(1);
        }
        Some((key, ids))
    }

    /// Keeps `ids` under `key`, forgetting `extended` first (a shorter prefix of the
    /// same text, which `ids` hold too) unless it was reused more than once, then the
    /// least recently used prefixes, while the budget is exceeded. A prefix over a quarter of the budget is not kept (it
    /// would push out most of the others).
    fn insert(&self, key: Key, ids: &[u32], extended: Option<Key>) {
        let size = cost(ids.len());
        if size > self.budget / 4 {
            return;
        }
        let ids: Arc<[u32]> = Arc::from(ids);
        let mut gone = Vec::new();
        {
            let mut entries = self.entries.lock();
            if entries.by_key.contains_key(&key) {
                entries.touch(key);
                return;
            }
            while entries.bytes + size > self.budget {
                let Some((_, oldest)) = entries.by_use.pop_first() else {
                    break;
                };
                if let Some(entry) = entries.by_key.remove(&oldest) {
                    entries.bytes -= cost(entry.ids.len());
                    entries.forget_length(oldest.0);
                    gone.push(entry.ids);
                }
            }
            // After the room is made: the prefix just reused is not the one forgotten
            // for it, so a branch point has a chance to be reused again.
            if let Some(extended) = extended {
                entries.demote(extended);
            }
            entries.clock += 1;
            let used = entries.clock;
            entries.by_use.insert(used, key);
            *entries.lengths.entry(key.0).or_default() += 1;
            entries.by_key.insert(
                key,
                Entry {
                    ids,
                    used,
                    reused: 0,
                },
            );
            entries.bytes += size;
        }
        // The forgotten ids are freed after the lock is let go.
        drop(gone);
    }
}

impl Entries {
    /// Marks `key` as just used; returns its ids, `None` if it is not held.
    fn touch(&mut self, key: Key) -> Option<Arc<[u32]>> {
        self.clock += 1;
        self.reorder(key, self.clock)
    }

    /// One prefix of `length` bytes fewer.
    fn forget_length(&mut self, length: usize) {
        if let Some(count) = self.lengths.get_mut(&length) {
            *count -= 1;
            if *count == 0 {
                self.lengths.remove(&length);
            }
        }
    }

    /// Puts `key`, if held and reused at most once, first in line to be forgotten.
    fn demote(&mut self, key: Key) {
        if self.by_key.get(&key).is_some_and(|e| e.reused <= 1) {
            self.floor -= 1;
            self.reorder(key, self.floor);
        }
    }

    fn reorder(&mut self, key: Key, tick: u64) -> Option<Arc<[u32]>> {
        let entry = self.by_key.get_mut(&key)?;
        let before = std::mem::replace(&mut entry.used, tick);
        let ids = Arc::clone(&entry.ids);
        self.by_use.remove(&before);
        self.by_use.insert(tick, key);
        Some(ids)
    }
}

/// The bytes an entry of `ids` ids takes.
fn cost(ids: usize) -> usize {
    ids.saturating_mul(4).saturating_add(ENTRY_OVERHEAD)
}

#[cfg(test)]
#[path = "prefixes/tests.rs"]
mod tests;
