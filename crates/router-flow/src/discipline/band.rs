//! One priority band: start-time fair queueing across the band's tenants, with
//! integer virtual time.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::sync::Arc;

/// Virtual time a grant of weight 1 costs; a grant of weight `w` costs `SCALE / w`.
/// Weights are at most [`MAX_WEIGHT`](super::MAX_WEIGHT), so the cost keeps at least
/// six significant digits.
pub(super) const SCALE: u64 = 1_000_000_000;

/// The entries of one tenant in one band, in arrival order (sequence numbers).
#[derive(Debug)]
struct TenantQueue {
    /// Start tag of the tenant's head entry.
    start: u64,
    seqs: BTreeSet<u64>,
}

/// The waiting entries of one priority band, by tenant, in fair order.
///
/// The band holds sequence numbers only; the owner keeps the entries themselves.
#[derive(Debug, Default)]
pub(super) struct Band {
    /// Virtual clock: the largest start tag granted so far.
    vclock: u64,
    /// Grants made to higher-priority bands while this band was non-empty, since its
    /// own last grant.
    pub(super) skipped: u32,
    len: usize,
    tenants: HashMap<Arc<str>, TenantQueue>,
    /// Backlogged tenants by (start tag, sequence number of the head, tenant).
    order: BTreeSet<(u64, u64, Arc<str>)>,
    /// Finish tags of idle tenants that are still ahead of the virtual clock.
    idle: HashMap<Arc<str>, u64>,
    /// The same idle tenants by (finish tag, tenant), smallest first, for pruning.
    idle_order: BTreeSet<(u64, Arc<str>)>,
}

impl Band {
    /// Entries waiting in the band.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Adds entry `seq` at the back of `tenant`'s queue. A tenant that becomes
    /// backlogged starts at `max(vclock, its remembered finish tag)`.
    pub(super) fn push(&mut self, tenant: &Arc<str>, seq: u64) {
        self.len += 1;
        if let Some(queue) = self.tenants.get_mut(tenant) {
            queue.seqs.insert(seq);
            return;
        }
        let finish = self.forget_idle(tenant).unwrap_or(0);
        let start = self.vclock.max(finish);
        self.order.insert((start, seq, Arc::clone(tenant)));
        self.tenants.insert(
            Arc::clone(tenant),
            TenantQueue {
                start,
                seqs: BTreeSet::from([seq]),
            },
        );
    }

    /// Removes entry `seq` of `tenant` without charging anything. A tenant left idle
    /// remembers its start tag as its finish tag. False when the entry is not here.
    pub(super) fn remove(&mut self, tenant: &Arc<str>, seq: u64, idle_cap: usize) -> bool {
        let Some(queue) = self.tenants.get_mut(tenant) else {
            return false;
        };
        let Some(&head) = queue.seqs.first() else {
            return false;
        };
        if !queue.seqs.remove(&seq) {
            return false;
        }
        self.len -= 1;
        let start = queue.start;
        match queue.seqs.first().copied() {
            None => {
                self.order.remove(&(start, head, Arc::clone(tenant)));
                self.tenants.remove(tenant);
                self.remember_idle(tenant, start, idle_cap);
            }
            Some(next) if head == seq => {
                self.order.remove(&(start, head, Arc::clone(tenant)));
                self.order.insert((start, next, Arc::clone(tenant)));
            }
            Some(_) => {}
        }
        true
    }

    /// Grants entry `seq` of `tenant` (its head, or an entry behind it): the virtual clock moves to the tenant's start tag (never back) and
    /// the tenant's next head starts `SCALE / weight` later.
    pub(super) fn grant(&mut self, tenant: &Arc<str>, seq: u64, weight: u32, idle_cap: usize) {
        let Some(queue) = self.tenants.get_mut(tenant) else {
            return;
        };
        let Some(&head) = queue.seqs.first() else {
            return;
        };
        if !queue.seqs.remove(&seq) {
            return;
        }
        self.len -= 1;
        self.skipped = 0;
        let start = queue.start;
        let finish = start.saturating_add(SCALE / u64::from(weight.max(1)));
        self.vclock = self.vclock.max(start);
        self.order.remove(&(start, head, Arc::clone(tenant)));
        match queue.seqs.first().copied() {
            None => {
                self.tenants.remove(tenant);
                self.remember_idle(tenant, finish, idle_cap);
            }
            Some(next) => {
                queue.start = finish;
                self.order.insert((finish, next, Arc::clone(tenant)));
            }
        }
        self.prune_idle(idle_cap);
    }

    /// The first entry of `tenant` for which `live` holds: its head as far as the
    /// discipline is concerned.
    pub(super) fn live_head(&self, tenant: &str, live: impl Fn(u64) -> bool) -> Option<u64> {
        self.tenants
            .get(tenant)?
            .seqs
            .iter()
            .copied()
            .find(|&seq| live(seq))
    }

    /// Appends the live heads of the band's tenants in fair order (smallest start tag,
    /// then earliest live head) to `out`, until `out` holds `limit` entries.
    pub(super) fn heads(&self, limit: usize, live: impl Fn(u64) -> bool, out: &mut Vec<u64>) {
        // Tenants whose stored head is dead, keyed by their live head: their key only
        // grows, so merging them into the ordered walk keeps the order exact.
        let mut displaced = BinaryHeap::new();
        for (start, head, tenant) in &self.order {
            if out.len() >= limit {
                return;
            }
            let Some(live_head) = self.live_head(tenant, &live) else {
                continue;
            };
            if live_head != *head {
                displaced.push(Reverse((*start, live_head)));
                continue;
            }
            while let Some(&Reverse(key)) = displaced.peek() {
                if key >= (*start, *head) || out.len() >= limit {
                    break;
                }
                displaced.pop();
                out.push(key.1);
            }
            if out.len() < limit {
                out.push(live_head);
            }
        }
        while out.len() < limit {
            let Some(Reverse((_, seq))) = displaced.pop() else {
                return;
            };
            out.push(seq);
        }
    }

    /// Appends `tenant`'s live entries after `head` in arrival order to `out`, until
    /// `out` holds `limit` entries.
    pub(super) fn followers(
        &self,
        tenant: &str,
        head: u64,
        limit: usize,
        live: impl Fn(u64) -> bool,
        out: &mut Vec<u64>,
    ) {
        let Some(queue) = self.tenants.get(tenant) else {
            return;
        };
        let room = limit.saturating_sub(out.len());
        out.extend(
            queue
                .seqs
                .range(head.saturating_add(1)..)
                .copied()
                .filter(|&seq| live(seq))
                .take(room),
        );
    }

    /// Takes `tenant`'s remembered finish tag, if any.
    fn forget_idle(&mut self, tenant: &Arc<str>) -> Option<u64> {
        let finish = self.idle.remove(tenant)?;
        self.idle_order.remove(&(finish, Arc::clone(tenant)));
        Some(finish)
    }

    /// Remembers an idle tenant's finish tag while it is ahead of the virtual clock,
    /// keeping at most `idle_cap` idle tenants (those furthest ahead).
    fn remember_idle(&mut self, tenant: &Arc<str>, finish: u64, idle_cap: usize) {
        if finish > self.vclock {
            self.idle.insert(Arc::clone(tenant), finish);
            self.idle_order.insert((finish, Arc::clone(tenant)));
        }
        self.prune_idle(idle_cap);
    }

    /// Forgets idle tenants whose finish tag the virtual clock has reached, and the
    /// ones least ahead beyond `idle_cap`.
    fn prune_idle(&mut self, idle_cap: usize) {
        while let Some((finish, tenant)) = self.idle_order.first() {
            if *finish > self.vclock && self.idle_order.len() <= idle_cap {
                return;
            }
            let tenant = Arc::clone(tenant);
            self.idle_order.pop_first();
            self.idle.remove(&tenant);
        }
    }
}
