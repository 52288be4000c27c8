//! The waiting room: the async layer around the discipline.
//!
//! Many request tasks wait in a model's room; one at a time holds the turn, the right
//! to try the engines again. A pass offers the turn to the discipline's first
//! `tries_per_pass` candidates in order (one of each kind); a capacity event starts a
//! pass, or marks that another one must follow the pass in progress. Only the waiter
//! given the turn is woken.

mod drain;
#[cfg(test)]
mod tests;
mod ticket;

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use self::drain::Drain;
pub use self::ticket::{Expired, Ticket};
use crate::discipline::{Discipline, EntryId, Full};
use crate::settings::{RoomSettings, SettingsError};

/// An entry refused by [`WaitingRoom::enter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The room holds its capacity.
    #[error("the waiting room is full; retry after {retry_after:?}")]
    Full {
        /// When to come back, from the room's drain rate.
        retry_after: Duration,
    },
}

/// One model's waiting room. Build it with [`WaitingRoom::new`] and share the `Arc`.
#[derive(Debug)]
pub struct WaitingRoom {
    settings: RoomSettings,
    /// Mirror of the discipline's length, so that a capacity event on an empty room
    /// costs one atomic load.
    len: AtomicUsize,
    state: Mutex<State>,
}

/// The turn: who holds it and who follows in the current pass.
#[derive(Debug)]
struct Turn {
    holder: EntryId,
    /// When the holder was given the turn; it was live then, so it is charged as of
    /// that instant.
    since: Instant,
    rest: VecDeque<EntryId>,
}

/// Everything behind the room's lock.
#[derive(Debug)]
struct State {
    discipline: Discipline<Arc<Notify>>,
    /// The pass in progress, if any.
    turn: Option<Turn>,
    /// A capacity event arrived during the pass in progress.
    event: bool,
    drain: Drain,
}

impl State {
    /// Starts a pass over the discipline's first `tries` candidates.
    fn start_pass(&mut self, now: Instant, tries: usize) {
        self.event = false;
        let rest = self.discipline.candidates(now, tries).into();
        self.hand_on(rest, now, tries);
    }

    /// Gives the turn to the next live entry of `rest`; when none is left, the pass
    /// ends, and a new one starts if a capacity event arrived meanwhile.
    fn hand_on(&mut self, mut rest: VecDeque<EntryId>, now: Instant, tries: usize) {
        loop {
            while let Some(id) = rest.pop_front() {
                if self.discipline.deadline(id).is_some_and(|d| d > now)
                    && let Some(notify) = self.discipline.get(id)
                {
                    notify.notify_one();
                    self.turn = Some(Turn {
                        holder: id,
                        since: now,
                        rest,
                    });
                    return;
                }
            }
            self.turn = None;
            if !self.event || self.discipline.is_empty() {
                self.event = false;
                return;
            }
            self.event = false;
            rest = self.discipline.candidates(now, tries).into();
        }
    }

    /// The holder of the turn, if a pass is in progress.
    fn holder(&self) -> Option<EntryId> {
        self.turn.as_ref().map(|t| t.holder)
    }
}

impl WaitingRoom {
    /// An empty room.
    ///
    /// # Errors
    /// A setting out of range.
    pub fn new(settings: RoomSettings) -> Result<Arc<Self>, SettingsError> {
        settings.validate()?;
        Ok(Arc::new(Self {
            settings,
            len: AtomicUsize::new(0),
            state: Mutex::new(State {
                discipline: Discipline::new(settings.discipline)?,
                turn: None,
                event: false,
                drain: Drain::default(),
            }),
        }))
    }

    /// The settings the room was built with.
    pub fn settings(&self) -> &RoomSettings {
        &self.settings
    }

    /// Queues a request of `tenant` in priority `band` (clamped to the lowest band)
    /// with fair-share `weight` (clamped to [`MAX_WEIGHT`](crate::MAX_WEIGHT)) and of
    /// `kind` (requests the same capacity serves, see
    /// [`Discipline::push`](crate::Discipline::push)); it expires `max_wait` from now.
    /// When no pass is in progress one starts at once: a release may have raced the
    /// caller's failed attempt just before it entered. When one is, and nothing of
    /// `kind` waits, another pass follows it: the pass may have tried only kinds that
    /// cannot be served.
    ///
    /// # Errors
    /// [`Refused::Full`] when the room holds its capacity.
    pub fn enter(
        self: &Arc<Self>,
        band: u8,
        tenant: Arc<str>,
        weight: NonZeroU32,
        kind: u64,
    ) -> Result<Ticket, Refused> {
        let now = Instant::now();
        let deadline = now + self.settings.max_wait;
        let notify = Arc::new(Notify::new());
        let mut state = self.state.lock();
        let was_empty = state.discipline.is_empty();
        let new_kind = state.discipline.kind_len(kind) == 0;
        let id =
            match state
                .discipline
                .push(band, tenant, weight, kind, deadline, Arc::clone(&notify))
            {
                Ok(id) => id,
                Err(Full(_)) => {
                    let retry_after = state.drain.retry_after(
                        state.discipline.len(),
                        self.settings.max_wait,
                        now,
                    );
                    return Err(Refused::Full { retry_after });
                }
            };
        if was_empty {
            state.drain.backlogged(now);
        }
        if state.turn.is_none() {
            state.start_pass(now, self.settings.tries_per_pass);
        } else if new_kind {
            state.event = true;
        }
        self.len.store(state.discipline.len(), Ordering::Release);
        drop(state);
        Ok(Ticket::new(Arc::clone(self), id, notify, now, deadline))
    }

    /// Capacity may have freed (an in-flight request ended, a load report arrived, the
    /// fleet changed). One atomic load when the room is empty. Otherwise starts a pass
    /// if none is in progress, or marks that a new one must follow the current one.
    pub fn capacity_freed(&self) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut state = self.state.lock();
        if state.turn.is_some() {
            state.event = true;
        } else if !state.discipline.is_empty() {
            state.start_pass(Instant::now(), self.settings.tries_per_pass);
        }
    }

    /// True when nobody waits. One atomic load.
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// Entries waiting, per band (band 0 first), expired ones not yet gone included.
    pub fn depth(&self) -> Vec<usize> {
        let state = self.state.lock();
        (0..self.settings.discipline.bands)
            .map(|b| state.discipline.band_len(b))
            .collect()
    }

    /// When a refused or expired request should come back: the time the waiting
    /// entries take to drain at the observed rate (an exponentially weighted moving
    /// average of the time between grants while the room was non-empty, or the time
    /// since the last grant when that is longer), rounded up to whole seconds; before
    /// any grant, `max_wait` rounded up. Always within [1 s, 60 s].
    pub fn retry_after(&self) -> Duration {
        let state = self.state.lock();
        state.drain.retry_after(
            state.discipline.len(),
            self.settings.max_wait,
            Instant::now(),
        )
    }

    /// Removes entry `id` (its ticket is gone or expired); a held turn passes on.
    fn leave(&self, id: EntryId, now: Instant) {
        let mut state = self.state.lock();
        state.discipline.remove(id);
        if state.holder() == Some(id) {
            self.pass_on(&mut state, now);
        }
        self.settle(&mut state);
    }

    /// The holder `id` found no capacity: the turn passes to the next of the pass.
    fn failed(&self, id: EntryId) {
        let mut state = self.state.lock();
        if state.holder() == Some(id) {
            self.pass_on(&mut state, Instant::now());
        }
    }

    /// Entry `id` got capacity: it is charged and leaves; if it held the turn, a new
    /// pass starts at once while entries remain.
    fn admitted(&self, id: EntryId) {
        let now = Instant::now();
        let mut state = self.state.lock();
        let held = state
            .turn
            .as_ref()
            .filter(|t| t.holder == id)
            .map(|t| t.since);
        let charged_at = held.unwrap_or(now);
        if state.discipline.grant(id, charged_at).is_none() {
            state.discipline.remove(id);
        }
        state.drain.granted(now);
        if held.is_some() {
            state.turn = None;
            if !state.discipline.is_empty() {
                state.start_pass(now, self.settings.tries_per_pass);
            }
        }
        self.settle(&mut state);
    }

    /// Whether `id` holds the turn.
    fn holds_turn(&self, id: EntryId) -> bool {
        self.state.lock().holder() == Some(id)
    }

    fn pass_on(&self, state: &mut State, now: Instant) {
        if let Some(turn) = state.turn.take() {
            state.hand_on(turn.rest, now, self.settings.tries_per_pass);
        }
    }

    /// Ends the pass of an empty room and publishes the length.
    fn settle(&self, state: &mut State) {
        if state.discipline.is_empty() {
            state.turn = None;
            state.event = false;
        }
        self.len.store(state.discipline.len(), Ordering::Release);
    }
}
