//! A plain model of the discipline's rules for the property tests: a list of entries
//! in push order and linear scans, each rule written out as stated.

use std::collections::HashMap;

use tokio::time::Instant;

use super::band::SCALE;

/// One queued entry of the model.
#[derive(Debug, Clone)]
pub(super) struct RefEntry {
    pub(super) seq: u64,
    pub(super) band: usize,
    pub(super) tenant: String,
    pub(super) weight: u32,
    pub(super) kind: u64,
    pub(super) deadline: Instant,
}

/// One band of the model.
#[derive(Debug, Default)]
struct RefBand {
    vclock: u64,
    skipped: u32,
    /// Start tags of backlogged tenants.
    start: HashMap<String, u64>,
    /// Finish tags of idle tenants still remembered.
    finish: HashMap<String, u64>,
}

/// The model.
#[derive(Debug)]
pub(super) struct Reference {
    bands: Vec<RefBand>,
    starvation_limit: u32,
    capacity: usize,
    pub(super) entries: Vec<RefEntry>,
    next_seq: u64,
}

impl Reference {
    pub(super) fn new(bands: u8, starvation_limit: u32, capacity: usize) -> Self {
        Self {
            bands: (0..bands).map(|_| RefBand::default()).collect(),
            starvation_limit,
            capacity,
            entries: Vec::new(),
            next_seq: 0,
        }
    }

    fn band_has(&self, band: usize, tenant: &str) -> bool {
        self.entries
            .iter()
            .any(|e| e.band == band && e.tenant == tenant)
    }

    pub(super) fn band_len(&self, band: usize) -> usize {
        self.entries.iter().filter(|e| e.band == band).count()
    }

    /// Pushes an entry; None when full. Returns the sequence number.
    pub(super) fn push(
        &mut self,
        band: u8,
        tenant: &str,
        weight: u32,
        kind: u64,
        deadline: Instant,
    ) -> Option<u64> {
        if self.entries.len() >= self.capacity {
            return None;
        }
        let band = usize::from(band).min(self.bands.len() - 1);
        if !self.band_has(band, tenant) {
            let b = &mut self.bands[band];
            let last = b.finish.remove(tenant).unwrap_or(0);
            b.start.insert(tenant.to_owned(), b.vclock.max(last));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.push(RefEntry {
            seq,
            band,
            tenant: tenant.to_owned(),
            weight: weight.min(super::MAX_WEIGHT),
            kind,
            deadline,
        });
        Some(seq)
    }

    /// Removes an entry without charging; the tenant left idle remembers its start tag.
    pub(super) fn remove(&mut self, seq: u64) -> bool {
        let Some(i) = self.entries.iter().position(|e| e.seq == seq) else {
            return false;
        };
        let e = self.entries.remove(i);
        if !self.band_has(e.band, &e.tenant) {
            let b = &mut self.bands[e.band];
            let start = b.start.remove(&e.tenant).unwrap_or(0);
            if start > b.vclock {
                b.finish.insert(e.tenant.clone(), start);
            }
            self.prune(e.band);
        }
        if self.band_len(e.band) == 0 {
            self.bands[e.band].skipped = 0;
        }
        true
    }

    /// The first live entry of a tenant in a band.
    fn live_head(&self, band: usize, tenant: &str, now: Instant) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| e.band == band && e.tenant == tenant && e.deadline > now)
            .map(|e| e.seq)
    }

    pub(super) fn candidates(&self, now: Instant, limit: usize) -> Vec<u64> {
        let nonempty: Vec<usize> = (0..self.bands.len())
            .filter(|&b| self.band_len(b) > 0)
            .collect();
        let starved = |b: &usize| self.bands[*b].skipped >= self.starvation_limit;
        let mut order: Vec<usize> = nonempty.iter().copied().filter(starved).collect();
        order.extend(nonempty.iter().copied().filter(|b| !starved(b)));
        let mut walk = Vec::new();
        for b in order {
            let mut heads: Vec<(u64, u64, String)> = self.bands[b]
                .start
                .iter()
                .filter_map(|(t, &s)| self.live_head(b, t, now).map(|h| (s, h, t.clone())))
                .collect();
            heads.sort_unstable();
            walk.extend(heads.iter().map(|(_, h, _)| *h));
            for (_, _, tenant) in &heads {
                walk.extend(
                    self.entries
                        .iter()
                        .filter(|e| e.band == b && &e.tenant == tenant && e.deadline > now)
                        .map(|e| e.seq),
                );
            }
        }
        let mut kinds = Vec::new();
        let mut out = Vec::new();
        for seq in walk {
            let kind = self.entries.iter().find(|e| e.seq == seq).unwrap().kind;
            if !kinds.contains(&kind) {
                kinds.push(kind);
                out.push(seq);
            }
        }
        out.truncate(limit);
        out
    }

    pub(super) fn grant(&mut self, seq: u64, now: Instant) -> bool {
        let Some(i) = self.entries.iter().position(|e| e.seq == seq) else {
            return false;
        };
        let e = self.entries[i].clone();
        if e.deadline <= now {
            return false;
        }
        self.entries.remove(i);
        let still = self.band_has(e.band, &e.tenant);
        let b = &mut self.bands[e.band];
        let start = b.start.get(&e.tenant).copied().unwrap_or(0);
        b.vclock = b.vclock.max(start);
        let finish = start.saturating_add(SCALE / u64::from(e.weight));
        if still {
            b.start.insert(e.tenant.clone(), finish);
        } else {
            b.start.remove(&e.tenant);
            if finish > b.vclock {
                b.finish.insert(e.tenant.clone(), finish);
            }
        }
        b.skipped = 0;
        self.prune(e.band);
        for lower in e.band + 1..self.bands.len() {
            if self.band_len(lower) > 0 {
                self.bands[lower].skipped += 1;
            }
        }
        true
    }

    /// Forgets idle tenants the clock reached, then the least-ahead ones beyond capacity.
    fn prune(&mut self, band: usize) {
        let capacity = self.capacity;
        let b = &mut self.bands[band];
        let vclock = b.vclock;
        b.finish.retain(|_, f| *f > vclock);
        while b.finish.len() > capacity {
            let least = b
                .finish
                .iter()
                .map(|(t, &f)| (f, t.clone()))
                .min()
                .map(|(_, t)| t);
            if let Some(t) = least {
                b.finish.remove(&t);
            }
        }
    }
}
