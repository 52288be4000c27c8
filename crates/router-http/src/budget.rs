//! The memory request bodies may take at once: every body being read or held is
//! charged against one budget as its bytes arrive, twice their size (the body, and
//! as much again for parsing and tokenizing it), and released when its request is
//! answered. A body that would pass the budget is refused at once, so the router's
//! memory stays bounded however many clients send large bodies together.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many bytes a body's byte is charged: itself and its parsing.
const CHARGE: usize = 2;

/// The budget shared by every request.
#[derive(Debug)]
pub(crate) struct BodyBudget {
    bytes: Arc<Semaphore>,
}

/// What one body holds of the budget; given back when dropped.
#[derive(Debug, Default)]
pub(crate) struct Charge(Option<OwnedSemaphorePermit>);

impl BodyBudget {
    /// A budget of `bytes` (at most what a semaphore holds).
    pub(crate) fn new(bytes: usize) -> Self {
        Self {
            bytes: Arc::new(Semaphore::new(bytes.min(Semaphore::MAX_PERMITS))),
        }
    }

    /// Adds `bytes` of a body to its `charge`; `false`, charging nothing, when the
    /// budget has not that much left.
    pub(crate) fn charge(&self, charge: &mut Charge, bytes: usize) -> bool {
        let Ok(n) = u32::try_from(bytes.saturating_mul(CHARGE)) else {
            return false;
        };
        if n == 0 {
            return true;
        }
        match Arc::clone(&self.bytes).try_acquire_many_owned(n) {
            Ok(permit) => {
                match &mut charge.0 {
                    Some(held) => held.merge(permit),
                    None => charge.0 = Some(permit),
                }
                true
            }
            Err(_) => false,
        }
    }

    /// The bytes left.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.bytes.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_charged_twice_and_given_back_when_dropped() {
        let budget = BodyBudget::new(100);
        let mut first = Charge::default();
        assert!(budget.charge(&mut first, 20));
        assert!(budget.charge(&mut first, 20));
        assert_eq!(budget.available(), 20);
        let mut second = Charge::default();
        assert!(!budget.charge(&mut second, 11), "22 bytes are not left");
        assert_eq!(budget.available(), 20, "a refused charge takes nothing");
        assert!(budget.charge(&mut second, 10));
        drop(first);
        assert_eq!(budget.available(), 80);
        drop(second);
        assert_eq!(budget.available(), 100);
    }
}
