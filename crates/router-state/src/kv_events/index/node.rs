//! One page of the index: its parent, its owners (a bit per source slot), each
//! owner's engine hash for the page and the tiers of copies that are not exactly one
//! device copy. The first 64 slots and one owner's engine hash live inline, so a node
//! of a page one engine rank holds is 40 bytes.

use std::sync::atomic::AtomicU32;

use rustc_hash::FxHashMap;

use super::DEVICE;

#[derive(Debug)]
pub(super) struct Node {
    pub(super) parent: u64,
    /// Owners among slots 0..64.
    owners: u64,
    /// The engine hash of the one owner that has none in `extra` (at most one has
    /// none: the first to arrive while no owner used this field).
    hash: u64,
    /// Owners beyond slot 63, non-device tiers and the engine hashes of a page's
    /// second and later owners, present only for pages shared or kept off the device.
    extra: Option<Box<Extra>>,
    /// The number of children, or for a leaf [`LEAF`] with its position in the
    /// index's pool of leaves (a leaf has no children to count); and [`TIERED`].
    link: u32,
    pub(super) last_used: AtomicU32,
}

/// The bit of [`Node::link`] that marks a leaf.
const LEAF: u32 = 1 << 31;
/// The bit of [`Node::link`] set while some owner's copies are not exactly one device
/// copy, so a lookup reads `extra` for the device tier only then (a shared page keeps
/// its owners' engine hashes there too).
const TIERED: u32 = 1 << 30;
/// The bits of [`Node::link`] holding the count or position.
const COUNT: u32 = TIERED - 1;

#[derive(Debug, Default)]
struct Extra {
    /// Owner words for slots 64.., word `i` covering slots `64 * (i + 1)..`.
    words: Vec<u64>,
    /// Tier masks of the owners holding something other than exactly a device copy.
    tiers: FxHashMap<u32, u8>,
    /// Engine hashes of the owners but the one in `Node::hash`, sorted by slot.
    hashes: Vec<(u32, u64)>,
}

impl Extra {
    fn is_empty(&self) -> bool {
        self.tiers.is_empty() && self.hashes.is_empty() && self.words.iter().all(|w| *w == 0)
    }
}

impl Node {
    pub(super) fn new(parent: u64, now: u32) -> Self {
        Self {
            parent,
            owners: 0,
            hash: 0,
            extra: None,
            link: 0,
            last_used: AtomicU32::new(now),
        }
    }

    /// How many pages continue this one.
    pub(super) fn children(&self) -> u32 {
        if self.link & LEAF == 0 {
            self.link & COUNT
        } else {
            0
        }
    }

    /// Where this leaf is in the pool of leaves; `None` for a page with children.
    pub(super) fn leaf_at(&self) -> Option<usize> {
        (self.link & LEAF != 0).then_some((self.link & COUNT) as usize)
    }

    /// Makes this page a leaf at position `at` of the pool of leaves.
    pub(super) fn set_leaf_at(&mut self, at: usize) {
        let at = u32::try_from(at)
            .ok()
            .filter(|at| *at <= COUNT)
            .expect("fewer than 2^30 leaves (over 40 GiB of pages)");
        self.link = LEAF | (self.link & TIERED) | at;
    }

    /// Sets how many pages continue this one (at least one: a page without children
    /// is a leaf, placed by [`Node::set_leaf_at`]).
    pub(super) fn set_children(&mut self, children: u32) {
        debug_assert!(children > 0 && children <= COUNT);
        self.link = (self.link & TIERED) | children;
    }

    /// Owners among slots `64 * word..64 * (word + 1)`.
    pub(super) fn owner_word(&self, word: usize) -> u64 {
        match word {
            0 => self.owners,
            w => self
                .extra
                .as_ref()
                .and_then(|e| e.words.get(w - 1).copied())
                .unwrap_or(0),
        }
    }

    /// Words of owner bits, at least one.
    pub(super) fn owner_words(&self) -> usize {
        1 + self.extra.as_ref().map_or(0, |e| e.words.len())
    }

    pub(super) fn has_owners(&self) -> bool {
        (0..self.owner_words()).any(|w| self.owner_word(w) != 0)
    }

    pub(super) fn owner_count(&self) -> usize {
        (0..self.owner_words())
            .map(|w| self.owner_word(w).count_ones() as usize)
            .sum()
    }

    /// The owner slots, lowest first.
    pub(super) fn owner_slots(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.owner_words()).flat_map(move |w| {
            let mut bits = self.owner_word(w);
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let bit = bits.trailing_zeros();
                bits &= bits - 1;
                Some((w * 64) as u32 + bit)
            })
        })
    }

    /// The engine hash under which `slot` announced this page, when it holds it.
    pub(super) fn engine_hash(&self, slot: u32) -> Option<u64> {
        if self.tiers_of(slot) == 0 {
            return None;
        }
        let listed = self.extra.as_ref().and_then(|e| {
            let at = e.hashes.binary_search_by_key(&slot, |(s, _)| *s).ok()?;
            Some(e.hashes[at].1)
        });
        Some(listed.unwrap_or(self.hash))
    }

    /// Makes `slot` an owner with tiers `mask` (not 0) under `engine_hash`, or
    /// changes the tiers and engine hash it holds the page under.
    pub(super) fn own(&mut self, slot: u32, mask: u8, engine_hash: u64) {
        let extra_hashes = self.extra.as_ref().map_or(0, |e| e.hashes.len());
        let listed = self
            .extra
            .as_ref()
            .and_then(|e| e.hashes.binary_search_by_key(&slot, |(s, _)| *s).ok());
        let inline_taken = self.owner_count() > extra_hashes;
        let is_inline = listed.is_none() && self.tiers_of(slot) != 0;
        if let Some(at) = listed {
            let extra = self.extra.as_mut().expect("a listed hash lives in extra");
            extra.hashes[at].1 = engine_hash;
        } else if is_inline || !inline_taken {
            self.hash = engine_hash;
        } else {
            let hashes = &mut self.extra.get_or_insert_with(Default::default).hashes;
            let at = hashes.partition_point(|(s, _)| *s < slot);
            hashes.insert(at, (slot, engine_hash));
        }
        self.set_tiers(slot, mask);
    }

    /// Drops `slot`'s copies and engine hash.
    pub(super) fn disown(&mut self, slot: u32) {
        if let Some(extra) = &mut self.extra
            && let Ok(at) = extra.hashes.binary_search_by_key(&slot, |(s, _)| *s)
        {
            extra.hashes.remove(at);
        }
        self.set_tiers(slot, 0);
    }

    /// The owners of word `word` whose copy includes the device tier.
    pub(super) fn device_word(&self, word: usize) -> u64 {
        let owners = self.owner_word(word);
        match self.extra.as_ref().filter(|_| self.link & TIERED != 0) {
            None => owners,
            Some(extra) => extra
                .tiers
                .iter()
                .filter(|(slot, mask)| **slot as usize / 64 == word && **mask & DEVICE == 0)
                .fold(owners, |bits, (slot, _)| bits & !(1 << (slot % 64))),
        }
    }

    /// The tier mask of `slot`'s copies (0 = none).
    pub(super) fn tiers_of(&self, slot: u32) -> u8 {
        let word = self.owner_word(slot as usize / 64);
        if word & (1 << (slot % 64)) == 0 {
            return 0;
        }
        self.extra
            .as_ref()
            .and_then(|e| e.tiers.get(&slot).copied())
            .unwrap_or(DEVICE)
    }

    /// Sets the tier mask of `slot`'s copies; an owner's engine hash is set by
    /// [`Node::own`] and dropped by [`Node::disown`].
    pub(super) fn set_tiers(&mut self, slot: u32, mask: u8) {
        let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        if word == 0 {
            if mask == 0 {
                self.owners &= !bit;
            } else {
                self.owners |= bit;
            }
        } else if mask != 0 {
            let words = &mut self.extra.get_or_insert_with(Default::default).words;
            if words.len() < word {
                words.resize(word, 0);
            }
            words[word - 1] |= bit;
        } else if let Some(w) = self.extra.as_mut().and_then(|e| e.words.get_mut(word - 1)) {
            *w &= !bit;
        }
        if mask == DEVICE || mask == 0 {
            if let Some(extra) = &mut self.extra {
                extra.tiers.remove(&slot);
            }
        } else {
            self.extra
                .get_or_insert_with(Default::default)
                .tiers
                .insert(slot, mask);
        }
        if self.extra.as_ref().is_some_and(|e| e.is_empty()) {
            self.extra = None;
        }
        if self.extra.as_ref().is_some_and(|e| !e.tiers.is_empty()) {
            self.link |= TIERED;
        } else {
            self.link &= !TIERED;
        }
    }
}
