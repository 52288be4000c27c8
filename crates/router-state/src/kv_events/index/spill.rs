//! What a page keeps of its owners beyond its node: owner words besides the node's
//! one, as (word, bits) pairs, and owners besides the one whose engine hash the node
//! keeps, as (slot, tiers, engine hash) records. Only pages shared by several ranks,
//! or held off the device, have a spill.
//!
//! Spills live in one arena ([`Spills`]), a node naming its own by position. Their
//! lists grow by a quarter and give back their room once it is more than half again
//! their items, so a list takes at most about one and a half times what it holds;
//! the arena counts the bytes its lists take, for the index's memory estimate.

use smallvec::SmallVec;

use super::DEVICE;
use super::memory::{ALLOCATION_SLACK, allocation};

/// One page's spill.
#[derive(Debug, Default)]
pub(super) struct Spill {
    /// Owner words besides the node's, sorted by word, none empty.
    words: SmallVec<[(u32, u64); 1]>,
    /// Owners besides the one whose engine hash is the node's, sorted by slot: every
    /// owner whose copies are not exactly one device copy is here.
    owners: Vec<Listed>,
    /// Listed owners whose copies are not exactly one device copy; in an unused
    /// spill, the next unused one (see [`Spills`]).
    tiered: u32,
}

#[derive(Debug, Clone, Copy)]
struct Listed {
    slot: u32,
    tiers: u8,
    hash: u64,
}

/// Items to add to a full list of `len`: a quarter, so adding stays amortized O(1).
fn growth(len: usize) -> usize {
    len / 4 + 1
}

/// Whether a list of `len` items with room for `capacity` gives the room back: when
/// it has room for more than half again its items and one more.
fn roomy(len: usize, capacity: usize) -> bool {
    capacity > len + len / 2 + 1
}

impl Spill {
    /// Owner words besides the node's, sorted by word.
    pub(super) fn words(&self) -> &[(u32, u64)] {
        &self.words
    }

    /// Owners among slots `64 * word..64 * (word + 1)`.
    pub(super) fn word(&self, word: usize) -> u64 {
        self.words
            .binary_search_by_key(&word, |(w, _)| *w as usize)
            .map_or(0, |at| self.words[at].1)
    }

    pub(super) fn add_bit(&mut self, word: u32, bit: u64) {
        match self.words.binary_search_by_key(&word, |(w, _)| *w) {
            Ok(at) => self.words[at].1 |= bit,
            Err(at) => {
                if self.words.len() == self.words.capacity() {
                    self.words.reserve_exact(growth(self.words.len()));
                }
                self.words.insert(at, (word, bit));
            }
        }
    }

    pub(super) fn remove_bit(&mut self, word: u32, bit: u64) {
        if let Ok(at) = self.words.binary_search_by_key(&word, |(w, _)| *w) {
            self.words[at].1 &= !bit;
            if self.words[at].1 == 0 {
                self.words.remove(at);
                if roomy(self.words.len(), self.words.capacity()) {
                    self.words.shrink_to_fit();
                }
            }
        }
    }

    /// Takes out the lowest word, to become the node's.
    pub(super) fn pop_word(&mut self) -> Option<(u32, u64)> {
        if self.words.is_empty() {
            return None;
        }
        let first = self.words.remove(0);
        if roomy(self.words.len(), self.words.capacity()) {
            self.words.shrink_to_fit();
        }
        Some(first)
    }

    /// `slot`'s (tiers, engine hash) when listed.
    pub(super) fn listed(&self, slot: u32) -> Option<(u8, u64)> {
        let at = self.owners.binary_search_by_key(&slot, |l| l.slot).ok()?;
        let listed = self.owners[at];
        Some((listed.tiers, listed.hash))
    }

    pub(super) fn listed_count(&self) -> usize {
        self.owners.len()
    }

    /// Lists `slot` with `tiers` under `hash`, or updates its record.
    pub(super) fn list(&mut self, slot: u32, tiers: u8, hash: u64) {
        let record = Listed { slot, tiers, hash };
        match self.owners.binary_search_by_key(&slot, |l| l.slot) {
            Ok(at) => {
                let was = std::mem::replace(&mut self.owners[at], record);
                self.tiered -= u32::from(was.tiers != DEVICE);
            }
            Err(at) => {
                if self.owners.len() == self.owners.capacity() {
                    self.owners.reserve_exact(growth(self.owners.len()));
                }
                self.owners.insert(at, record);
            }
        }
        self.tiered += u32::from(tiers != DEVICE);
    }

    /// Drops `slot`'s record.
    pub(super) fn unlist(&mut self, slot: u32) {
        if let Ok(at) = self.owners.binary_search_by_key(&slot, |l| l.slot) {
            let was = self.owners.remove(at);
            self.tiered -= u32::from(was.tiers != DEVICE);
            if roomy(self.owners.len(), self.owners.capacity()) {
                self.owners.shrink_to_fit();
            }
        }
    }

    /// Whether a listed owner holds exactly a device copy.
    pub(super) fn has_device_only(&self) -> bool {
        (self.tiered as usize) < self.owners.len()
    }

    /// The first listed owner holding exactly a device copy, with its engine hash.
    pub(super) fn device_only(&self) -> Option<(u32, u64)> {
        self.owners
            .iter()
            .find(|l| l.tiers == DEVICE)
            .map(|l| (l.slot, l.hash))
    }

    /// Whether a listed owner's copies are not exactly one device copy.
    pub(super) fn tiered(&self) -> bool {
        self.tiered > 0
    }

    /// The listed owners of word `word` without a device copy.
    pub(super) fn off_device(&self, word: usize) -> u64 {
        let first = (word * 64) as u32;
        let from = self.owners.partition_point(|l| l.slot < first);
        self.owners[from..]
            .iter()
            .take_while(|l| (l.slot as usize) / 64 == word)
            .filter(|l| l.tiers & DEVICE == 0)
            .fold(0, |bits, l| bits | 1 << (l.slot % 64))
    }

    /// The listed owners without a device copy.
    pub(super) fn off_device_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.owners
            .iter()
            .filter(|l| l.tiers & DEVICE == 0)
            .map(|l| l.slot)
    }

    fn is_empty(&self) -> bool {
        self.words.is_empty() && self.owners.is_empty()
    }

    /// Heap bytes of the lists, with the allocator's rounding.
    fn heap_bytes(&self) -> usize {
        let words = if self.words.spilled() {
            allocation(self.words.capacity() * std::mem::size_of::<(u32, u64)>())
        } else {
            0
        };
        words + allocation(self.owners.capacity() * std::mem::size_of::<Listed>())
    }
}

/// The spills of all pages, by position; a node names its spill by position plus one
/// (0: none). Unused spills form a list through their `tiered` fields, each naming
/// the next unused one the same way.
#[derive(Debug, Default)]
pub(super) struct Spills {
    spills: Vec<Spill>,
    /// The first unused spill, named as a node names its spill.
    free: u32,
    /// Spills in use.
    used: usize,
    /// Heap bytes the spills' lists take.
    heap: usize,
}

impl Spills {
    /// The spill a node names `at`.
    pub(super) fn get(&self, at: u32) -> Option<&Spill> {
        let at = at.checked_sub(1)?;
        self.spills.get(at as usize)
    }

    /// Runs `edit` on the spill a node names `*at`, taking an unused one first when
    /// it names none, and gives the spill back when `edit` leaves it empty.
    pub(super) fn edit<R>(&mut self, at: &mut u32, edit: impl FnOnce(&mut Spill) -> R) -> R {
        if *at == 0 {
            *at = self.take();
        }
        let i = *at as usize - 1;
        let spill = &mut self.spills[i];
        let before = spill.heap_bytes();
        let out = edit(spill);
        let emptied = spill.is_empty();
        if emptied {
            *spill = Spill {
                tiered: self.free,
                ..Spill::default()
            };
        }
        self.heap = self.heap + spill.heap_bytes() - before;
        if emptied {
            self.free = *at;
            self.used -= 1;
            *at = 0;
        }
        out
    }

    /// Gives back the spill a node names `*at`, if any.
    pub(super) fn release(&mut self, at: &mut u32) {
        if *at != 0 {
            self.edit(at, |spill| *spill = Spill::default());
        }
    }

    /// An unused spill, named as a node names its spill.
    fn take(&mut self) -> u32 {
        self.used += 1;
        if self.free != 0 {
            let taken = self.free;
            let spill = &mut self.spills[taken as usize - 1];
            self.free = std::mem::take(&mut spill.tiered);
            return taken;
        }
        if self.spills.len() == self.spills.capacity() {
            self.spills.reserve_exact(growth(self.spills.len()));
        }
        self.spills.push(Spill::default());
        u32::try_from(self.spills.len()).expect("fewer than 2^32 spilled pages")
    }

    /// Heap bytes: the arena and the spills' lists.
    pub(super) fn bytes(&self) -> usize {
        allocation(self.spills.capacity() * std::mem::size_of::<Spill>()) + self.heap
    }

    /// The most heap bytes spills take between batches once at most `peak` pages
    /// have been held at once, with at most `pages` pages and `entries` entries
    /// held now: an arena of at most a quarter more spills than pages ever held,
    /// and two lists a spilled page, each with room for at most half again its
    /// items and one more, with the allocator's rounding. A page's listed owners and
    /// spilled words are at most two an entry (an owner is listed, or has the node's
    /// engine hash, and at most every owner but one is in a spilled word).
    pub(super) fn bound(peak: usize, pages: usize, entries: usize) -> usize {
        let item = std::mem::size_of::<Listed>();
        debug_assert_eq!(item, std::mem::size_of::<(u32, u64)>());
        allocation((peak + growth(peak)) * std::mem::size_of::<Spill>())
            + 2 * entries * (item + item / 2)
            + 2 * pages * (item + ALLOCATION_SLACK)
    }
}

#[cfg(test)]
impl Spills {
    /// Spills in use.
    pub(super) fn len(&self) -> usize {
        self.used
    }

    /// Whether the counted heap bytes are the lists', every list holds at most half
    /// again its items and one more, and the count of tiered owners is right.
    pub(super) fn is_exact(&self) -> bool {
        let mut free = std::collections::HashSet::new();
        let mut next = self.free;
        while next != 0 {
            free.insert(next);
            next = self.spills[next as usize - 1].tiered;
        }
        free.len() + self.used == self.spills.len()
            && self.spills.iter().map(Spill::heap_bytes).sum::<usize>() == self.heap
            && self.spills.iter().enumerate().all(|(i, s)| {
                let tiered = s.owners.iter().filter(|l| l.tiers != DEVICE).count();
                s.words.capacity() <= s.words.len() + s.words.len() / 2 + 1
                    && s.owners.capacity() <= s.owners.len() + s.owners.len() / 2 + 1
                    && (free.contains(&(i as u32 + 1)) || s.tiered as usize == tiered)
            })
    }
}

#[cfg(test)]
impl super::PrefixIndex {
    /// Spills in use.
    pub(super) fn spills_in_use(&self) -> usize {
        self.inner.read().spills.len()
    }

    /// See [`Spills::is_exact`].
    pub(super) fn spills_are_exact(&self) -> bool {
        self.inner.read().spills.is_exact()
    }
}
