//! One priority band: start-time fair queueing across the band's tenants, with
//! integer virtual time.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::sync::Arc;

/// Virtual time a grant of weight 1 costs; a grant of weight `w` costs `SCALE / w`.
/// Weights are at most [`MAX_WEIGHT`](super::MAX_WEIGHT), so the cost keeps at least
/// six significant digits.
pub(super) const SCALE: u64 = 1_000_000_000;

/// The entries of one tenant in one band, in arrival order (sequence numbers), and
/// by kind.
#[derive(Debug)]
struct TenantQueue {
    /// Start tag of the tenant's head entry.
    start: u64,
    seqs: BTreeSet<u64>,
    kinds: HashMap<u64, BTreeSet<u64>>,
}

impl TenantQueue {
    fn insert(&mut self, seq: u64, kind: u64) {
        self.seqs.insert(seq);
        self.kinds.entry(kind).or_default().insert(seq);
    }

    fn remove(&mut self, seq: u64, kind: u64) -> bool {
        if !self.seqs.remove(&seq) {
            return false;
        }
        if let Some(of_kind) = self.kinds.get_mut(&kind) {
            of_kind.remove(&seq);
            if of_kind.is_empty() {
                self.kinds.remove(&kind);
            }
        }
        true
    }
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

/// One grant, as the band charges it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Grant {
    pub(super) seq: u64,
    pub(super) kind: u64,
    pub(super) weight: u32,
}

impl Band {
    /// Entries waiting in the band.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Adds entry `seq` of `kind` at the back of `tenant`'s queue. A tenant that
    /// becomes backlogged starts at `max(vclock, its remembered finish tag)`.
    pub(super) fn push(&mut self, tenant: &Arc<str>, seq: u64, kind: u64) {
        self.len += 1;
        if let Some(queue) = self.tenants.get_mut(tenant) {
            queue.insert(seq, kind);
            return;
        }
        let finish = self.forget_idle(tenant).unwrap_or(0);
        let start = self.vclock.max(finish);
        self.order.insert((start, seq, Arc::clone(tenant)));
        let mut queue = TenantQueue {
            start,
            seqs: BTreeSet::new(),
            kinds: HashMap::new(),
        };
        queue.insert(seq, kind);
        self.tenants.insert(Arc::clone(tenant), queue);
    }

    /// Removes entry `seq` (of `kind`) of `tenant` without charging anything. A tenant
    /// left idle remembers its start tag as its finish tag. False when the entry is not
    /// here.
    pub(super) fn remove(
        &mut self,
        tenant: &Arc<str>,
        seq: u64,
        kind: u64,
        idle_cap: usize,
    ) -> bool {
        let Some(queue) = self.tenants.get_mut(tenant) else {
            return false;
        };
        let Some(&head) = queue.seqs.first() else {
            return false;
        };
        if !queue.remove(seq, kind) {
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

    /// Grants entry `grant.seq` of `tenant` (its head, or an entry of another kind
    /// behind it): the virtual clock moves to the tenant's start tag (never back) and
    /// the tenant's next head starts `SCALE / weight` later.
    pub(super) fn grant(&mut self, tenant: &Arc<str>, grant: Grant, idle_cap: usize) {
        let Grant { seq, kind, weight } = grant;
        let Some(queue) = self.tenants.get_mut(tenant) else {
            return;
        };
        let Some(&head) = queue.seqs.first() else {
            return;
        };
        if !queue.remove(seq, kind) {
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

    /// Visits the live heads of the band's tenants in fair order (smallest start tag,
    /// then earliest live head) until `visit` returns false.
    pub(super) fn heads(&self, live: impl Fn(u64) -> bool, mut visit: impl FnMut(u64) -> bool) {
        // Tenants whose stored head is dead, keyed by their live head: their key only
        // grows, so merging them into the ordered walk keeps the order exact.
        let mut displaced = BinaryHeap::new();
        for (start, head, tenant) in &self.order {
            let Some(live_head) = self.live_head(tenant, &live) else {
                continue;
            };
            if live_head != *head {
                displaced.push(Reverse((*start, live_head)));
                continue;
            }
            while let Some(&Reverse(key)) = displaced.peek() {
                if key >= (*start, *head) {
                    break;
                }
                displaced.pop();
                if !visit(key.1) {
                    return;
                }
            }
            if !visit(live_head) {
                return;
            }
        }
        while let Some(Reverse((_, seq))) = displaced.pop() {
            if !visit(seq) {
                return;
            }
        }
    }

    /// The first live entry of each kind of `tenant`'s, in arrival order.
    pub(super) fn kind_heads(&self, tenant: &str, live: impl Fn(u64) -> bool) -> Vec<u64> {
        let Some(queue) = self.tenants.get(tenant) else {
            return Vec::new();
        };
        let mut heads: Vec<u64> = queue
            .kinds
            .values()
            .filter_map(|of_kind| of_kind.iter().copied().find(|&seq| live(seq)))
            .collect();
        heads.sort_unstable();
        heads
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
