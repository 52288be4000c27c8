//! Per-tenant in-flight counts with optional caps.

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::settings::LedgerSettings;

/// The name under which tenants beyond `max_tracked` are counted together (for
/// metrics). A tenant actually named so is still counted by name when tracked.
pub const OVERFLOW_TENANT: &str = "other";

/// A tenant already has `cap` requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the tenant has {in_flight} requests in flight, its cap is {cap}")]
pub struct OverCap {
    /// Requests of the tenant in flight.
    pub in_flight: u64,
    /// The tenant's cap.
    pub cap: u64,
}

/// Where a tenant's requests are counted.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    Named(Arc<str>),
    Overflow,
}

/// The counts behind the ledger's lock.
#[derive(Debug, Default)]
struct Counts {
    named: HashMap<Arc<str>, u64>,
    overflow: u64,
}

/// In-flight requests per tenant, with optional per-tenant caps.
///
/// Checking a cap and counting the request is one step under a lock, so a tenant's
/// count never exceeds its cap under any concurrency. A tenant with nothing in flight
/// is forgotten. At most `max_tracked` tenants are counted by name, the ones the
/// ledger was told to [always name](Self::always_naming) (those with a cap of their
/// own in the configuration) among them and counted even beyond it; while that many
/// are tracked, a new tenant is
/// counted under the shared overflow entry ([`OVERFLOW_TENANT`]) and its cap is not
/// applied (the overflow entry has no cap), so memory stays bounded whatever the
/// number of tenants.
#[derive(Debug, Clone)]
pub struct TenantLedger {
    settings: LedgerSettings,
    always: HashSet<Arc<str>>,
    counts: Arc<Mutex<Counts>>,
}

impl TenantLedger {
    /// An empty ledger.
    pub fn new(settings: LedgerSettings) -> Self {
        Self {
            settings,
            always: HashSet::new(),
            counts: Arc::default(),
        }
    }

    /// The same ledger, counting `tenants` by name (so under their caps) however many
    /// other tenants are tracked.
    pub fn always_naming(mut self, tenants: impl IntoIterator<Item = Arc<str>>) -> Self {
        self.always.extend(tenants);
        self
    }

    /// Counts one more request of `tenant` in flight unless that would exceed `cap`;
    /// the guard uncounts it on drop. `cap` applies only while the tenant is counted by
    /// name (see the type's documentation).
    ///
    /// # Errors
    /// [`OverCap`] when the tenant already has `cap` requests in flight.
    pub fn try_acquire(&self, tenant: &str, cap: Option<u64>) -> Result<TenantGuard, OverCap> {
        let mut counts = self.counts.lock();
        let tracked = counts.named.len();
        let slot = match counts.named.get_mut(tenant) {
            Some(in_flight) => {
                if let Some(cap) = cap
                    && *in_flight >= cap
                {
                    return Err(OverCap {
                        in_flight: *in_flight,
                        cap,
                    });
                }
                *in_flight += 1;
                Slot::Named(self.key(&counts, tenant))
            }
            None if tracked < self.settings.max_tracked || self.always.contains(tenant) => {
                if cap == Some(0) {
                    return Err(OverCap {
                        in_flight: 0,
                        cap: 0,
                    });
                }
                let name: Arc<str> = tenant.into();
                counts.named.insert(Arc::clone(&name), 1);
                Slot::Named(name)
            }
            None => {
                counts.overflow = counts.overflow.saturating_add(1);
                Slot::Overflow
            }
        };
        Ok(TenantGuard {
            counts: Arc::clone(&self.counts),
            slot,
        })
    }

    /// Requests of `tenant` in flight, counted by name (0 for a tenant counted under
    /// the overflow entry).
    pub fn in_flight(&self, tenant: &str) -> u64 {
        self.counts.lock().named.get(tenant).copied().unwrap_or(0)
    }

    /// Requests in flight counted under the overflow entry.
    pub fn overflow_in_flight(&self) -> u64 {
        self.counts.lock().overflow
    }

    /// Tenants counted by name; at most `max_tracked`, or more with tenants the ledger
    /// always names.
    pub fn tracked(&self) -> usize {
        self.counts.lock().named.len()
    }

    /// The map's own key for a tracked tenant, shared rather than copied.
    fn key(&self, counts: &Counts, tenant: &str) -> Arc<str> {
        counts
            .named
            .get_key_value(tenant)
            .map_or_else(|| tenant.into(), |(k, _)| Arc::clone(k))
    }
}

/// One request of a tenant in flight; dropping it uncounts the request.
#[derive(Debug)]
pub struct TenantGuard {
    counts: Arc<Mutex<Counts>>,
    slot: Slot,
}

impl TenantGuard {
    /// True when the request is counted under the overflow entry, without its cap.
    pub fn is_overflow(&self) -> bool {
        self.slot == Slot::Overflow
    }
}

impl Drop for TenantGuard {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        match &self.slot {
            Slot::Named(name) => {
                if let Some(in_flight) = counts.named.get_mut(name) {
                    *in_flight = in_flight.saturating_sub(1);
                    if *in_flight == 0 {
                        counts.named.remove(name);
                    }
                }
            }
            Slot::Overflow => counts.overflow = counts.overflow.saturating_sub(1),
        }
    }
}
