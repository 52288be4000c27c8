//! The queue discipline: which waiting entry goes next.
//!
//! Entries wait in priority bands (band 0 first). Within a band, tenants share grants
//! by weight (start-time fair queueing over integer virtual time); within a tenant and
//! band, entries are offered in arrival order, a later one going first only when the
//! earlier ones cannot be served. A starvation bound keeps a backlogged lower band from
//! waiting forever behind busy higher bands.

mod band;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use tokio::time::Instant;

use self::band::Band;
use crate::settings::{DisciplineSettings, SettingsError};

/// Most priority bands a discipline has.
pub const MAX_BANDS: u8 = 8;

/// Largest weight that counts; larger weights are clamped to it.
pub const MAX_WEIGHT: u32 = 1000;

/// Identifies one pushed entry; unique per push within a discipline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryId(u64);

/// A push refused because the discipline holds its capacity; the item comes back.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("the waiting queue is full")]
pub struct Full<T>(pub T);

impl<T> fmt::Debug for Full<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Full(..)")
    }
}

/// One waiting entry.
#[derive(Debug)]
struct Entry<T> {
    band: u8,
    tenant: Arc<str>,
    weight: u32,
    deadline: Instant,
    item: T,
}

/// A bounded set of waiting entries and the order in which they are granted.
///
/// # Order
///
/// **Bands.** Band 0 is served before band 1, and so on, with a starvation bound: each
/// band counts the grants made to higher-priority bands while it was non-empty since
/// its own last grant. The next band is the highest-priority non-empty band whose count
/// reached `starvation_limit`, if any, else the highest-priority non-empty band. A grant
/// to band `g` resets `g`'s count and adds one to every non-empty band below `g`; a band
/// that empties resets its count. So while band `b` stays non-empty and every grant
/// takes the first candidate, at most `starvation_limit + b` grants to higher-priority
/// bands separate two grants to `b` (or `b`'s first entry from its first grant):
/// `starvation_limit` of them make it starved, and then each band above it can be
/// served at most once ahead of it, as the highest starved band only moves down.
///
/// **Tenants.** Within a band each backlogged tenant carries a start tag for its head
/// entry; the tenant with the smallest start tag goes first, ties to the earliest
/// arrival of its head. Granting a tenant's head moves the band's virtual clock up to
/// the tenant's start tag and gives its next head the start tag
/// `start + 1_000_000_000 / weight`, with the granted entry's weight (saturating);
/// granting an entry behind the head (an alternative, when the head could not be
/// served) charges the tenant alike. A
/// tenant that becomes backlogged starts at `max(virtual clock, its last finish tag)`.
/// Removing an entry charges nothing. Two continuously backlogged tenants of weights
/// 3 and 1 thus get 75 % and 25 % of the band's grants, whatever load each offers.
///
/// **Deadlines.** An entry whose deadline is at or before `now` is never listed or
/// granted; the tenant's next entry counts as its head. Expired entries stay queued
/// (and count in [`len`](Self::len)) until [`remove`](Self::remove)d.
///
/// # Bounds
///
/// At most `capacity` entries wait at once. Each band remembers the finish tags of at
/// most `capacity` idle tenants, only while they are ahead of its virtual clock
/// (dropping those least ahead first), so memory stays `O(capacity)` whatever the
/// number of distinct tenants. Push, remove and grant take `O(log n)`;
/// [`candidates`](Self::candidates) takes `O(limit · log n)` plus the expired entries
/// it skips.
pub struct Discipline<T> {
    settings: DisciplineSettings,
    entries: HashMap<u64, Entry<T>>,
    bands: Vec<Band>,
    next_seq: u64,
}

impl<T> fmt::Debug for Discipline<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Discipline")
            .field("settings", &self.settings)
            .field("len", &self.entries.len())
            .field("bands", &self.bands)
            .finish_non_exhaustive()
    }
}

impl<T> Discipline<T> {
    /// An empty discipline.
    ///
    /// # Errors
    /// A setting out of range.
    pub fn new(settings: DisciplineSettings) -> Result<Self, SettingsError> {
        settings.validate()?;
        Ok(Self {
            settings,
            entries: HashMap::new(),
            bands: (0..settings.bands).map(|_| Band::default()).collect(),
            next_seq: 0,
        })
    }

    /// The settings the discipline was built with.
    pub fn settings(&self) -> &DisciplineSettings {
        &self.settings
    }

    /// Queues `item` at the back of `tenant`'s entries in `band`. A band at or beyond
    /// the configured number of bands is clamped to the lowest-priority band; a weight
    /// above [`MAX_WEIGHT`] is clamped to it.
    ///
    /// # Errors
    /// [`Full`], with the item, when `capacity` entries already wait.
    pub fn push(
        &mut self,
        band: u8,
        tenant: Arc<str>,
        weight: NonZeroU32,
        deadline: Instant,
        item: T,
    ) -> Result<EntryId, Full<T>> {
        if self.entries.len() >= self.settings.capacity {
            return Err(Full(item));
        }
        let band = band.min(self.settings.bands - 1);
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.bands[usize::from(band)].push(&tenant, seq);
        self.entries.insert(
            seq,
            Entry {
                band,
                tenant,
                weight: weight.get().min(MAX_WEIGHT),
                deadline,
                item,
            },
        );
        Ok(EntryId(seq))
    }

    /// Removes entry `id` without charging its tenant (its client left or its deadline
    /// passed). None when it is not queued.
    pub fn remove(&mut self, id: EntryId) -> Option<T> {
        let entry = self.entries.remove(&id.0)?;
        let band = &mut self.bands[usize::from(entry.band)];
        band.remove(&entry.tenant, id.0, self.settings.capacity);
        if band.len() == 0 {
            band.skipped = 0;
        }
        Some(entry.item)
    }

    /// The grant order, at most `limit` entries. Element 0 is the entry that goes next;
    /// the others are alternatives to try when it cannot be served: the heads of the
    /// other tenants of its band in fair order, then the other non-empty bands in
    /// priority order, each band's tenant heads in fair order; then, when the heads
    /// leave room, the entries behind each head in the same order of heads, each
    /// tenant's in arrival order, so that a head no engine can take (its bucket is
    /// full, others are not) does not hold back the entries queued behind it. A
    /// tenant's entry is thus never listed before an earlier live one of the same
    /// tenant and band. Entries whose deadline is at or before `now` are skipped.
    pub fn candidates(&self, now: Instant, limit: usize) -> Vec<EntryId> {
        let mut out = Vec::with_capacity(limit.min(self.entries.len()));
        let live = |seq: u64| self.entries.get(&seq).is_some_and(|e| e.deadline > now);
        let starved = self.starved_band();
        let rest = (0..self.bands.len()).filter(|&b| Some(b) != starved);
        for b in starved.into_iter().chain(rest) {
            if out.len() >= limit {
                break;
            }
            let band = &self.bands[b];
            if band.len() > 0 {
                band.heads(limit, live, &mut out);
            }
        }
        let heads = out.len();
        for i in 0..heads {
            if out.len() >= limit {
                break;
            }
            let head = out[i];
            if let Some(entry) = self.entries.get(&head) {
                self.bands[usize::from(entry.band)].followers(
                    &entry.tenant,
                    head,
                    limit,
                    live,
                    &mut out,
                );
            }
        }
        out.into_iter().map(EntryId).collect()
    }

    /// Grants entry `id`: removes it and charges its tenant and band as for a grant
    /// of the tenant's head. The entry's deadline must be after `now`; otherwise
    /// nothing changes and the answer is None.
    pub fn grant(&mut self, id: EntryId, now: Instant) -> Option<T> {
        let entry = self.entries.get(&id.0)?;
        if entry.deadline <= now {
            return None;
        }
        let g = usize::from(entry.band);
        let entry = self.entries.remove(&id.0)?;
        self.bands[g].grant(&entry.tenant, id.0, entry.weight, self.settings.capacity);
        for band in &mut self.bands[g + 1..] {
            if band.len() > 0 {
                band.skipped = band.skipped.saturating_add(1);
            }
        }
        Some(entry.item)
    }

    /// The item of entry `id`, if queued.
    pub fn get(&self, id: EntryId) -> Option<&T> {
        self.entries.get(&id.0).map(|e| &e.item)
    }

    /// The deadline of entry `id`, if queued.
    pub fn deadline(&self, id: EntryId) -> Option<Instant> {
        self.entries.get(&id.0).map(|e| e.deadline)
    }

    /// Entries queued, expired ones included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no entry is queued.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries queued in `band`, expired ones included; 0 for a band beyond the
    /// configured ones.
    pub fn band_len(&self, band: u8) -> usize {
        self.bands.get(usize::from(band)).map_or(0, Band::len)
    }

    /// The highest-priority non-empty band whose starvation count reached the limit.
    fn starved_band(&self) -> Option<usize> {
        self.bands
            .iter()
            .position(|b| b.len() > 0 && b.skipped >= self.settings.starvation_limit)
    }
}
