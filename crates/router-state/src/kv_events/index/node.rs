//! One page of the index: its parent, its owners (source slots), each owner's engine
//! hash for the page and the tiers of copies that are not exactly one device copy.
//!
//! Owners are words of 64 slots, and only the words with an owner in them are kept.
//! One word (whichever 64 slots its owners fall in) and one owner's engine hash live
//! in the node, so a page one engine rank holds on the device is a 40-byte node
//! whatever the rank. A page's further words and further owners are its spill, kept
//! in the index's [`Spills`] (see `spill`).

use std::sync::atomic::AtomicU32;

use super::DEVICE;
use super::spill::Spills;

/// In declaration order (`repr(C)`): what a lookup reads first, next to the chain
/// hash that precedes the node in its slot of the table (see `table`), so a lookup
/// reads the first 28 bytes of a slot, one cache line for three slots in four.
#[derive(Debug)]
#[repr(C)]
pub(super) struct Node {
    /// Owners among slots `64 * word..64 * (word + 1)`; 0 only for a page without
    /// owners (the spill then has no words either).
    bits: u64,
    word: u32,
    /// The number of children, or for a leaf [`LEAF`] with its position in the
    /// index's pool of leaves (a leaf has no children to count); and the flags
    /// [`TIERED`] and [`WORDS`].
    link: u32,
    /// Where the page's spill is in [`Spills`] (0: none).
    spill: u32,
    pub(super) last_used: AtomicU32,
    /// The engine hash of the one owner the spill does not list (at most one is not
    /// listed: the first to hold exactly a device copy while no other such owner did).
    hash: u64,
    pub(super) parent: u64,
}

// A page one rank holds on the device is this node and its chain hash: 48 bytes.
const _: () = assert!(size_of::<Node>() == 40);

/// The bit of [`Node::link`] that marks a leaf.
const LEAF: u32 = 1 << 31;
/// The bit of [`Node::link`] set while some owner's copies are not exactly one device
/// copy, so a lookup reads the spill for the device tier only then.
const TIERED: u32 = 1 << 30;
/// The bit of [`Node::link`] set while the spill holds owner words, so a lookup reads
/// the spill for a word other than the node's only then.
const WORDS: u32 = 1 << 29;
/// The bits of [`Node::link`] holding the count or position.
const COUNT: u32 = WORDS - 1;

impl Node {
    pub(super) fn new(parent: u64, now: u32) -> Self {
        Self {
            parent,
            hash: 0,
            bits: 0,
            word: 0,
            spill: 0,
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
            .expect("fewer than 2^29 leaves (over 20 GiB of pages)");
        self.link = LEAF | (self.link & (TIERED | WORDS)) | at;
    }

    /// Sets how many pages continue this one (at least one: a page without children
    /// is a leaf, placed by [`Node::set_leaf_at`]).
    pub(super) fn set_children(&mut self, children: u32) {
        debug_assert!(children > 0 && children <= COUNT);
        self.link = (self.link & (TIERED | WORDS)) | children;
    }

    /// Owners among slots `64 * word..64 * (word + 1)`.
    pub(super) fn owner_word(&self, spills: &Spills, word: usize) -> u64 {
        if self.word as usize == word {
            self.bits
        } else if self.link & WORDS == 0 {
            0
        } else {
            spills.get(self.spill).map_or(0, |s| s.word(word))
        }
    }

    /// The words with owners, as (word, owners): the node's, then the spill's by word.
    pub(super) fn words<'a>(&self, spills: &'a Spills) -> impl Iterator<Item = (usize, u64)> + 'a {
        let own = (self.bits != 0).then_some((self.word as usize, self.bits));
        let spilled = spills
            .get(self.spill)
            .filter(|_| self.link & WORDS != 0)
            .map_or(&[][..], |s| s.words());
        own.into_iter()
            .chain(spilled.iter().map(|&(w, bits)| (w as usize, bits)))
    }

    pub(super) fn has_owners(&self) -> bool {
        self.bits != 0
    }

    pub(super) fn owner_count(&self, spills: &Spills) -> usize {
        self.words(spills)
            .map(|(_, bits)| bits.count_ones() as usize)
            .sum()
    }

    /// The owner slots, the node's word first, then the spill's by word.
    pub(super) fn owner_slots<'a>(&self, spills: &'a Spills) -> impl Iterator<Item = u32> + 'a {
        self.words(spills).flat_map(|(w, mut bits)| {
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

    fn is_owner(&self, spills: &Spills, slot: u32) -> bool {
        self.owner_word(spills, slot as usize / 64) & (1 << (slot % 64)) != 0
    }

    /// `slot`'s (tiers, engine hash) when the spill lists it.
    fn listed(&self, spills: &Spills, slot: u32) -> Option<(u8, u64)> {
        spills.get(self.spill)?.listed(slot)
    }

    /// The engine hash under which `slot` announced this page, when it holds it.
    pub(super) fn engine_hash(&self, spills: &Spills, slot: u32) -> Option<u64> {
        if !self.is_owner(spills, slot) {
            return None;
        }
        Some(
            self.listed(spills, slot)
                .map_or(self.hash, |(_, hash)| hash),
        )
    }

    /// The tier mask of `slot`'s copies (0 = none).
    pub(super) fn tiers_of(&self, spills: &Spills, slot: u32) -> u8 {
        if !self.is_owner(spills, slot) {
            return 0;
        }
        self.listed(spills, slot).map_or(DEVICE, |(tiers, _)| tiers)
    }

    /// Whether an owner is not listed in the spill (its engine hash is the node's).
    fn has_unlisted(&self, spills: &Spills) -> bool {
        self.owner_count(spills) > spills.get(self.spill).map_or(0, |s| s.listed_count())
    }

    /// Makes `slot` an owner with tiers `mask` (not 0) under `engine_hash`, or
    /// changes the tiers and engine hash it holds the page under.
    pub(super) fn own(&mut self, spills: &mut Spills, slot: u32, mask: u8, engine_hash: u64) {
        debug_assert!(mask != 0);
        if !self.is_owner(spills, slot) {
            let unlisted_free = !self.has_unlisted(spills);
            self.add_bit(spills, slot);
            if mask == DEVICE && unlisted_free {
                self.hash = engine_hash;
            } else {
                spills.edit(&mut self.spill, |s| s.list(slot, mask, engine_hash));
            }
        } else if self.listed(spills, slot).is_none() && mask == DEVICE {
            self.hash = engine_hash;
        } else {
            spills.edit(&mut self.spill, |s| s.list(slot, mask, engine_hash));
        }
        self.settle(spills);
    }

    /// Sets the tier mask of `slot`'s copies (not 0: [`Node::disown`] drops them all),
    /// keeping its engine hash.
    pub(super) fn set_tiers(&mut self, spills: &mut Spills, slot: u32, mask: u8) {
        if let Some(hash) = self.engine_hash(spills, slot) {
            self.own(spills, slot, mask, hash);
        }
    }

    /// Drops `slot`'s copies and engine hash.
    pub(super) fn disown(&mut self, spills: &mut Spills, slot: u32) {
        if !self.is_owner(spills, slot) {
            return;
        }
        if self.listed(spills, slot).is_some() {
            spills.edit(&mut self.spill, |s| s.unlist(slot));
        }
        self.remove_bit(spills, slot);
        self.settle(spills);
    }

    /// Gives the page's spill back to `spills` (the page is leaving the index).
    pub(super) fn release(&mut self, spills: &mut Spills) {
        spills.release(&mut self.spill);
        self.bits = 0;
        self.link &= !(TIERED | WORDS);
    }

    /// Sets `owners[w]` to the owners of word `w` and `device[w]` to those of them
    /// whose copy includes the device tier, for every word of `owners` (which
    /// `device` is as long as): one pass over the page's words.
    pub(super) fn owners_by_word(&self, spills: &Spills, owners: &mut [u64], device: &mut [u64]) {
        owners.fill(0);
        for (w, bits) in self.words(spills) {
            if let Some(word) = owners.get_mut(w) {
                *word = bits;
            }
        }
        device.copy_from_slice(owners);
        if self.link & TIERED != 0
            && let Some(spill) = spills.get(self.spill)
        {
            for slot in spill.off_device_slots() {
                if let Some(word) = device.get_mut(slot as usize / 64) {
                    *word &= !(1 << (slot % 64));
                }
            }
        }
    }

    /// The owners of word `word`, and those of them whose copy includes the device
    /// tier.
    pub(super) fn owners_in(&self, spills: &Spills, word: usize) -> (u64, u64) {
        let owners = self.owner_word(spills, word);
        if self.link & TIERED == 0 || owners == 0 {
            return (owners, owners);
        }
        let device = spills
            .get(self.spill)
            .map_or(owners, |s| owners & !s.off_device(word));
        (owners, device)
    }

    fn add_bit(&mut self, spills: &mut Spills, slot: u32) {
        let (word, bit) = (slot / 64, 1u64 << (slot % 64));
        if self.bits == 0 {
            (self.word, self.bits) = (word, bit);
        } else if self.word == word {
            self.bits |= bit;
        } else {
            spills.edit(&mut self.spill, |s| s.add_bit(word, bit));
        }
        self.sync_flags(spills);
    }

    fn remove_bit(&mut self, spills: &mut Spills, slot: u32) {
        let (word, bit) = (slot / 64, 1u64 << (slot % 64));
        if self.word == word && self.bits & bit != 0 {
            self.bits &= !bit;
            if self.bits == 0
                && self.spill != 0
                && let Some((word, bits)) = spills.edit(&mut self.spill, |s| s.pop_word())
            {
                (self.word, self.bits) = (word, bits);
            }
        } else if self.spill != 0 {
            spills.edit(&mut self.spill, |s| s.remove_bit(word, bit));
        }
        self.sync_flags(spills);
    }

    /// Keeps an owner unlisted while one holds exactly a device copy, so a page left
    /// with one such owner needs no spill; then sets the flags.
    fn settle(&mut self, spills: &mut Spills) {
        if let Some(spill) = spills.get(self.spill)
            && spill.has_device_only()
            && !self.has_unlisted(spills)
            && let Some((slot, hash)) = spill.device_only()
        {
            spills.edit(&mut self.spill, |s| s.unlist(slot));
            self.hash = hash;
        }
        self.sync_flags(spills);
    }

    fn sync_flags(&mut self, spills: &Spills) {
        let spill = spills.get(self.spill);
        self.link &= !(TIERED | WORDS);
        if spill.is_some_and(|s| s.tiered()) {
            self.link |= TIERED;
        }
        if spill.is_some_and(|s| !s.words().is_empty()) {
            self.link |= WORDS;
        }
    }
}
