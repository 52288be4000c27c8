//! Flow control for requests that find every fitting engine at its admission caps.
//!
//! When no engine has room, a request does not get a 503 at once: it enters its
//! model's [`WaitingRoom`] and waits, up to a deadline, for capacity to free. Waiting
//! requests are served in order of priority band (band 0 first, with a starvation
//! bound for lower bands), then weighted fair share across tenants within a band, then
//! arrival order within a tenant; a request of a kind (the buckets that could serve
//! it) other than those ahead of it is offered capacity too, so a request whose
//! buckets are full does not hold back one whose buckets have room.
//!
//! - [`Discipline`] is the queue discipline: a bounded, synchronous data structure that
//!   says which waiting entry goes next and which ones to try instead when the first
//!   cannot be served.
//! - [`WaitingRoom`] is the async layer around it: many request tasks wait, one at a
//!   time holds the turn (the right to try for capacity), and capacity events start a
//!   new pass over the queue.
//! - [`TenantLedger`] counts in-flight requests per tenant and enforces optional
//!   per-tenant caps, exactly under any concurrency.
//!
//! Every structure is bounded: the discipline and the room hold at most their
//! capacity in entries and remember at most that many idle tenants per band; the
//! ledger tracks at most `max_tracked` tenants by name.
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use router_flow::{DisciplineSettings, RoomSettings, WaitingRoom};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
//! let room = WaitingRoom::new(RoomSettings {
//!     max_wait: Duration::from_secs(5),
//!     discipline: DisciplineSettings { bands: 2, starvation_limit: 4, capacity: 64 },
//!     tries_per_pass: 8,
//! })?;
//! let mut ticket = room.enter(0, "tenant-a".into(), NonZeroU32::MIN, 0)?;
//! // Entering an idle room starts a pass: the only waiter holds the turn at once.
//! ticket.turn().await?;
//! // ... try the engines again; on success:
//! let waited = ticket.admitted();
//! assert!(waited <= Duration::from_secs(5));
//! assert!(room.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod discipline;
mod room;
mod settings;
mod tenants;

pub use discipline::{Discipline, EntryId, Full, MAX_BANDS, MAX_WEIGHT};
pub use room::{Expired, Refused, Ticket, WaitingRoom};
pub use settings::{
    DisciplineSettings, LedgerSettings, MAX_WAIT_LIMIT, RoomSettings, SettingsError,
};
pub use tenants::{OVERFLOW_TENANT, OverCap, TenantGuard, TenantLedger};
