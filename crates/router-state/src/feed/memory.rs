//! One byte budget for what every feed subscription of a process holds: the frames of
//! messages still arriving (charged by the socket's decoder from each frame's header,
//! before anything is allocated for it) and a live batch kept while its gap is being
//! repaired. A frame the budget cannot take closes its connection (the feed
//! reconnects after its backoff); a batch it cannot keep makes the repair give up, as
//! for history that cannot be replayed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// What every feed of one process may hold at once unless configured otherwise:
/// 256 MiB, sixteen messages of the largest size accepted by default.
pub const DEFAULT_FEED_MEMORY_BYTES: usize = 256 << 20;

/// A byte budget shared by feed subscriptions; clones are the same budget.
#[derive(Debug, Clone)]
pub struct FeedMemory(Arc<Budget>);

#[derive(Debug)]
struct Budget {
    limit: usize,
    used: AtomicUsize,
    refused: AtomicU64,
}

impl FeedMemory {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self(Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        }))
    }

    /// The budget's size in bytes.
    pub fn limit(&self) -> usize {
        self.0.limit
    }

    /// Bytes held now.
    pub fn in_use(&self) -> usize {
        self.0.used.load(Ordering::Relaxed)
    }

    /// Frames and batches refused because the budget was spent, since start.
    pub fn refused(&self) -> u64 {
        self.0.refused.load(Ordering::Relaxed)
    }

    /// Keeps `bytes` charged until the returned guard drops; `None` (counted as
    /// refused) when they do not fit.
    #[cfg(feature = "zmq")]
    pub(crate) fn hold(&self, bytes: usize) -> Option<Held> {
        self.0.take(bytes).then(|| Held {
            budget: Arc::clone(&self.0),
            bytes,
        })
    }

    /// A share of the budget for one connection, which knows what it holds.
    #[cfg(feature = "zmq")]
    pub(crate) fn connection(&self) -> Arc<ConnectionMemory> {
        Arc::new(ConnectionMemory {
            budget: Arc::clone(&self.0),
            held: AtomicUsize::new(0),
        })
    }
}

impl Default for FeedMemory {
    /// A budget of [`DEFAULT_FEED_MEMORY_BYTES`] of its own.
    fn default() -> Self {
        Self::new(DEFAULT_FEED_MEMORY_BYTES)
    }
}

/// Handles are equal when they are the same budget.
impl PartialEq for FeedMemory {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for FeedMemory {}

#[cfg(feature = "zmq")]
impl Budget {
    fn take(&self, bytes: usize) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&after| after <= self.limit)
            })
            .is_ok();
        if !taken {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// One connection's charges to a [`FeedMemory`], as its ZeroMQ decoder makes them.
#[cfg(feature = "zmq")]
#[derive(Debug)]
pub(crate) struct ConnectionMemory {
    budget: Arc<Budget>,
    held: AtomicUsize,
}

#[cfg(feature = "zmq")]
impl ConnectionMemory {
    /// Bytes this connection holds now: a message past its uncharged part, still
    /// arriving.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

#[cfg(feature = "zmq")]
impl zeromq::BufferBudget for ConnectionMemory {
    fn take(&self, bytes: usize) -> bool {
        let taken = self.budget.take(bytes);
        if taken {
            self.held.fetch_add(bytes, Ordering::Relaxed);
        }
        taken
    }

    fn give_back(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
        self.budget.give_back(bytes);
    }
}

/// Bytes charged to a [`FeedMemory`] until dropped.
#[cfg(feature = "zmq")]
#[derive(Debug)]
pub(crate) struct Held {
    budget: Arc<Budget>,
    bytes: usize,
}

#[cfg(feature = "zmq")]
impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(all(test, feature = "zmq"))]
mod tests {
    use super::*;

    #[test]
    fn holds_up_to_the_limit_and_gives_back_on_drop() {
        let memory = FeedMemory::new(100);
        let first = memory.hold(60).expect("fits");
        assert!(memory.hold(41).is_none());
        assert_eq!((memory.in_use(), memory.refused()), (60, 1));
        let second = memory.hold(40).expect("fits exactly");
        assert_eq!(memory.in_use(), 100);
        drop((first, second));
        assert_eq!(memory.in_use(), 0);
        assert_eq!(memory.clone(), memory);
        assert_ne!(FeedMemory::new(100), memory);
    }
}
