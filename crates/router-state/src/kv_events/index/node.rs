//! One page of the index: its parent, its owners (a bit per source slot) and the
//! tiers of copies that are not exactly one device copy. The first 64 slots live
//! inline, so a node of a fleet up to 64 engine ranks stays 32 bytes.

use std::sync::atomic::AtomicU32;

use rustc_hash::FxHashMap;

use super::DEVICE;

#[derive(Debug)]
pub(super) struct Node {
    pub(super) parent: u64,
    /// Owners among slots 0..64.
    owners: u64,
    /// Owners beyond slot 63 and non-device tiers, rarely present.
    extra: Option<Box<Extra>>,
    pub(super) children: u32,
    pub(super) last_used: AtomicU32,
}

#[derive(Debug, Default)]
struct Extra {
    /// Owner words for slots 64.., word `i` covering slots `64 * (i + 1)..`.
    words: Vec<u64>,
    /// Tier masks of the owners holding something other than exactly a device copy.
    tiers: FxHashMap<u32, u8>,
}

impl Extra {
    fn is_empty(&self) -> bool {
        self.tiers.is_empty() && self.words.iter().all(|w| *w == 0)
    }
}

impl Node {
    pub(super) fn new(parent: u64, now: u32) -> Self {
        Self {
            parent,
            owners: 0,
            extra: None,
            children: 0,
            last_used: AtomicU32::new(now),
        }
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

    /// The owners of word `word` whose copy includes the device tier.
    pub(super) fn device_word(&self, word: usize) -> u64 {
        let owners = self.owner_word(word);
        match &self.extra {
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
    }
}
