//! A waiter's place in the room.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, timeout_at};

use super::WaitingRoom;
use crate::discipline::EntryId;

/// A waiter's deadline passed before it was admitted; it has left the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("waited {waited:?} for capacity without getting it; retry after {retry_after:?}")]
pub struct Expired {
    /// When to come back, from the room's drain rate.
    pub retry_after: Duration,
    /// How long the waiter waited.
    pub waited: Duration,
}

/// A place in a [`WaitingRoom`], from [`WaitingRoom::enter`].
///
/// Await [`turn`](Self::turn); then try for capacity and report the outcome with
/// [`admitted`](Self::admitted) or [`failed`](Self::failed). Dropping the ticket (the
/// client left, or the caller gave up) removes the entry at once and passes a held
/// turn on. While a ticket holds the turn nobody else tries, so the holder reports
/// promptly (or is dropped); its own deadline does not take the turn from it until it
/// awaits [`turn`](Self::turn) again.
pub struct Ticket {
    room: Arc<WaitingRoom>,
    id: EntryId,
    notify: Arc<Notify>,
    entered: Instant,
    deadline: Instant,
    /// The entry has left the queue (admitted or expired).
    done: bool,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("id", &self.id)
            .field("entered", &self.entered)
            .field("deadline", &self.deadline)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    pub(super) fn new(
        room: Arc<WaitingRoom>,
        id: EntryId,
        notify: Arc<Notify>,
        entered: Instant,
        deadline: Instant,
    ) -> Self {
        Self {
            room,
            id,
            notify,
            entered,
            deadline,
            done: false,
        }
    }

    /// The deadline after which the entry expires.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// True when this ticket holds the turn now.
    pub fn holds_turn(&self) -> bool {
        !self.done && self.room.holds_turn(self.id)
    }

    /// Resolves when this ticket holds the turn: the caller may try for capacity now.
    ///
    /// Cancel-safe: dropping the future leaves the ticket queued (holding the turn if
    /// it was given meanwhile), and awaiting `turn` again picks up from there.
    ///
    /// # Errors
    /// [`Expired`] once the deadline has passed; the entry has then left the queue
    /// (and a turn it held has passed on).
    pub async fn turn(&mut self) -> Result<(), Expired> {
        loop {
            let now = Instant::now();
            if self.done || now >= self.deadline {
                return Err(self.expire(now));
            }
            let notified = self.notify.notified();
            if self.room.holds_turn(self.id) {
                return Ok(());
            }
            // A wake-up given between the check and the wait is kept as a permit; a
            // stale permit only costs one more check.
            let _ = timeout_at(self.deadline, notified).await;
        }
    }

    /// The holder tried and found no capacity: the turn passes to the next waiter of
    /// the pass. The ticket stays queued and can await [`turn`](Self::turn) again. No
    /// effect when this ticket does not hold the turn.
    pub fn failed(&mut self) {
        if !self.done {
            self.room.failed(self.id);
        }
    }

    /// The holder got capacity: its tenant is charged, it leaves the queue and a new
    /// pass starts at once if others wait (more capacity may be free). Returns how
    /// long it waited.
    ///
    /// A ticket that does not hold the turn (its request found capacity on its own)
    /// may be admitted too: it is charged alike, and the pass in progress goes on.
    pub fn admitted(mut self) -> Duration {
        let now = Instant::now();
        if !self.done {
            self.done = true;
            self.room.admitted(self.id);
        }
        now.saturating_duration_since(self.entered)
    }

    /// Leaves the queue because the deadline passed.
    fn expire(&mut self, now: Instant) -> Expired {
        if !self.done {
            self.done = true;
            self.room.leave(self.id, now);
        }
        Expired {
            retry_after: self.room.retry_after(),
            waited: now.saturating_duration_since(self.entered),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.room.leave(self.id, Instant::now());
        }
    }
}
