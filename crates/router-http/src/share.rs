//! A share of a sequence taken exactly: every `1 / ratio`-th item (rounded), counted,
//! so what is taken depends on nothing a client sends. Decision records and spans
//! sample requests so.

use std::sync::atomic::{AtomicU64, Ordering};

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Share {
    ratio: f64,
    seen: AtomicU64,
}

impl Share {
    /// A share of `ratio`, above 0 and at most 1.
    pub(crate) fn new(ratio: f64) -> Self {
        Self {
            ratio,
            seen: AtomicU64::new(0),
        }
    }

    /// Whether the next item is taken.
    pub(crate) fn take(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) as f64;
        ((n + 1.0) * self.ratio).floor() > (n * self.ratio).floor()
    }
}
