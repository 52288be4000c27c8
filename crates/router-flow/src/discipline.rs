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

use self::band::{Band, Grant};
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

/// Most tenant heads [`Discipline::candidates`] looks at in one band while it looks
/// for kinds it has not listed yet.
const SCAN_HEADS: usize = 256;

/// One waiting entry.
#[derive(Debug)]
struct Entry<T> {
    band: u8,
    tenant: Arc<str>,
    weight: u32,
    kind: u64,
    deadline: Instant,
    item: T,
}

/// A bounded set of waiting entries and the order in which they are granted.
///
/// # Order
///
/// **Bands.** Band 0 is served before band 1, and so on, with a starvation bound: each
/// band counts the grants made to higher-priority bands while it was non-empty since
/// its own last grant; a band whose count reached `starvation_limit` is starved.
/// Starved bands go first, in priority order, then the other non-empty bands in
/// priority order. A grant to band `g` resets `g`'s count and adds one to every
/// non-empty band below `g`; a band that empties resets its count. So while band `b`
/// stays non-empty and every grant takes the first candidate that can be served, at
/// most `starvation_limit + b` grants to higher-priority bands separate two grants to
/// `b` while `b` holds an entry that can be served among the candidates (or `b`'s
/// first entry from its first grant): `starvation_limit` of them make it starved, and
/// then only starved bands above it go before it, each at most once, as a grant
/// leaves a band unstarved.
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
/// **Kinds.** Each entry has a kind: entries of one kind are served by the same
/// capacity. Candidates list one entry of each kind, so a head whose kind cannot be
/// served does not hold back entries of other kinds behind it; within a tenant, band
/// and kind, entries are offered strictly in arrival order.
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
    /// Entries queued per kind.
    kinds: HashMap<u64, usize>,
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
            kinds: HashMap::new(),
            next_seq: 0,
        })
    }

    /// The settings the discipline was built with.
    pub fn settings(&self) -> &DisciplineSettings {
        &self.settings
    }

    /// Queues `item` of `kind` at the back of `tenant`'s entries in `band`. A band at
    /// or beyond the configured number of bands is clamped to the lowest-priority band;
    /// a weight above [`MAX_WEIGHT`] is clamped to it. Entries of one kind are ones the
    /// same capacity would serve (the same buckets): when one cannot be served now,
    /// neither can the others.
    ///
    /// # Errors
    /// [`Full`], with the item, when `capacity` entries already wait.
    pub fn push(
        &mut self,
        band: u8,
        tenant: Arc<str>,
        weight: NonZeroU32,
        kind: u64,
        deadline: Instant,
        item: T,
    ) -> Result<EntryId, Full<T>> {
        if self.entries.len() >= self.settings.capacity {
            return Err(Full(item));
        }
        let band = band.min(self.settings.bands - 1);
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.bands[usize::from(band)].push(&tenant, seq, kind);
        *self.kinds.entry(kind).or_default() += 1;
        self.entries.insert(
            seq,
            Entry {
                band,
                tenant,
                weight: weight.get().min(MAX_WEIGHT),
                kind,
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
        self.forget_kind(entry.kind);
        let band = &mut self.bands[usize::from(entry.band)];
        band.remove(&entry.tenant, id.0, entry.kind, self.settings.capacity);
        if band.len() == 0 {
            band.skipped = 0;
        }
        Some(entry.item)
    }

    /// Entries of `kind` queued, expired ones included.
    pub fn kind_len(&self, kind: u64) -> usize {
        self.kinds.get(&kind).copied().unwrap_or(0)
    }

    fn forget_kind(&mut self, kind: u64) {
        if let Some(n) = self.kinds.get_mut(&kind) {
            *n -= 1;
            if *n == 0 {
                self.kinds.remove(&kind);
            }
        }
    }

    /// The entries to offer capacity to, in order, at most `limit`, one of each kind:
    /// element 0 goes next; the others are alternatives to try when it cannot be
    /// served, each of a kind no earlier one has (an entry of a kind that could not be
    /// served would not be either). The order walks the bands, starved ones first (in
    /// priority order), then the others in priority order; within a band, the tenants'
    /// heads in fair order, then for each of those tenants, in the same order, its
    /// first entry of each other kind, in arrival order. So an entry whose bucket has
    /// room is not held back by a head whose bucket is full, and a tenant's entry is
    /// never listed before an earlier live one of the same kind, tenant and band. The
    /// walk looks at most at [`SCAN_HEADS`] heads in a band; entries whose deadline is
    /// at or before `now` are skipped.
    pub fn candidates(&self, now: Instant, limit: usize) -> Vec<EntryId> {
        let mut out: Vec<u64> = Vec::with_capacity(limit.min(self.kinds.len()));
        let mut listed: Vec<u64> = Vec::new();
        let all = self.kinds.len();
        let live = |seq: u64| self.entries.get(&seq).is_some_and(|e| e.deadline > now);
        // Lists `seq` unless its kind is listed; whether to go on looking.
        let offer = |seq: u64, out: &mut Vec<u64>, listed: &mut Vec<u64>| {
            if let Some(entry) = self.entries.get(&seq)
                && out.len() < limit
                && !listed.contains(&entry.kind)
            {
                listed.push(entry.kind);
                out.push(seq);
            }
            out.len() < limit && listed.len() < all
        };
        let starved = |b: usize| {
            let band = &self.bands[b];
            band.len() > 0 && band.skipped >= self.settings.starvation_limit
        };
        let bands = self.bands.len();
        let order = (0..bands)
            .filter(|&b| starved(b))
            .chain((0..bands).filter(|&b| !starved(b) && self.bands[b].len() > 0));
        let mut more = limit > 0 && all > 0;
        for b in order {
            if !more {
                break;
            }
            let band = &self.bands[b];
            let mut heads = Vec::new();
            band.heads(live, |seq| {
                heads.push(seq);
                more = offer(seq, &mut out, &mut listed);
                more && heads.len() < SCAN_HEADS
            });
            for head in heads {
                if !more {
                    break;
                }
                let tenant = &self.entries[&head].tenant;
                for seq in band.kind_heads(tenant, live) {
                    more = offer(seq, &mut out, &mut listed);
                    if !more {
                        break;
                    }
                }
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
        self.forget_kind(entry.kind);
        let grant = Grant {
            seq: id.0,
            kind: entry.kind,
            weight: entry.weight,
        };
        self.bands[g].grant(&entry.tenant, grant, self.settings.capacity);
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
}
