//! Affinity: bindings from a session or routing key to the engine that serves it.
//!
//! A binding is scoped by model, bucket id and stage, so one session may be bound to
//! a prefill engine and a decode engine, and to different engines in different
//! buckets. A store only keeps and updates bindings (atomic create-or-get and
//! compare-and-replace); policies decide when to reuse or replace one.
//!
//! [`AffinityStore`] is what policies bind in. Two stores implement it:
//! - [`LocalAffinityStore`]: the process's own bindings, in memory.
//! - `RedisAffinityStore` (feature `redis`): bindings shared by router replicas in a
//!   Redis server, with a short local cache in front and local bindings while the
//!   server cannot be reached.
//!
//! [`rendezvous`] needs no store: every replica computes the same engine for a key.
//!
//! Memory is bounded however keys arrive from the network: keys longer than
//! [`AffinityConfig::max_key_bytes`] are refused, and past
//! [`AffinityConfig::max_entries`] the longest-idle binding is evicted. Bindings idle
//! longer than [`AffinityConfig::idle_timeout`] are gone for lookups at once and freed
//! by [`AffinityStore::sweep`], which the owner runs (see [`spawn_sweeper`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::engine::{EngineId, Role};

mod local;
#[cfg(feature = "redis")]
mod redis;
pub mod rendezvous;

pub use local::LocalAffinityStore;
#[cfg(feature = "redis")]
pub use redis::{RedisAffinityStore, RedisSettings, RedisUrlError};

/// Limits of an affinity store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffinityConfig {
    /// A binding unused this long is gone.
    pub idle_timeout: Duration,
    /// Most bindings kept; past it the longest-idle one is evicted.
    pub max_entries: usize,
    /// Longest key accepted, in bytes.
    pub max_key_bytes: usize,
}

impl Default for AffinityConfig {
    /// Ten minutes idle, 1,048,576 bindings, 256-byte keys.
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(600),
            max_entries: 1 << 20,
            max_key_bytes: 256,
        }
    }
}

/// What a binding is scoped by, besides its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffinityScope<'a> {
    /// The model.
    pub model: &'a str,
    /// The bucket id.
    pub bucket: &'a str,
    /// The stage picked.
    pub stage: Role,
}

/// A key the store refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AffinityKeyError {
    /// An empty key binds nothing.
    #[error("the affinity key is empty")]
    Empty,
    /// Longer than the configured bound.
    #[error("the affinity key is {len} bytes, more than the {max} allowed")]
    TooLong {
        /// The key's length in bytes.
        len: usize,
        /// The bound.
        max: usize,
    },
}

/// When the backend calls of one pick must be over: every call of the pick is given
/// the time left, so the pick waits for a shared store at most its timeout in all,
/// however many calls it makes. A store's [`AffinityStore::deadline`] starts one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// No deadline: each call waits at most the store's own timeout.
    pub const NONE: Self = Self(None);

    /// Calls are over at `at`.
    pub fn at(at: Instant) -> Self {
        Self(Some(at))
    }

    /// How long a call may wait: `timeout`, or the time left when that is less
    /// (zero once the deadline passed).
    pub fn wait(self, timeout: Duration) -> Duration {
        self.0.map_or(timeout, |at| {
            timeout.min(at.saturating_duration_since(Instant::now()))
        })
    }
}

/// The future of an [`AffinityStore`] operation.
pub type StoreFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, AffinityKeyError>> + Send + 'a>>;

/// Scoped key-to-engine bindings. Every operation answers: a store that cannot reach
/// its backend keeps bindings of its own instead of failing the request. The
/// operations of one pick share the [`Deadline`] [`deadline`](Self::deadline) gave
/// at its start.
pub trait AffinityStore: fmt::Debug + Send + Sync {
    /// The deadline of a pick starting now: a shared store's timeout from now; none
    /// for a store without a backend to wait for.
    fn deadline(&self) -> Deadline {
        Deadline::NONE
    }

    /// The engine `key` is bound to in `scope`, refreshing the binding; `None` when
    /// unbound or idle past the timeout.
    ///
    /// # Errors
    /// An empty or over-long key.
    fn get<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        deadline: Deadline,
    ) -> StoreFuture<'a, Option<EngineId>>;

    /// The engine `key` is bound to in `scope`, as [`get`](Self::get) would answer
    /// it, changing nothing: no refresh, no recency, no write-back of a binding kept
    /// through an outage, no error counted. For dry runs (explanations).
    ///
    /// # Errors
    /// An empty or over-long key.
    fn peek<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        deadline: Deadline,
    ) -> StoreFuture<'a, Option<EngineId>>;

    /// Binds `key` to `engine` unless a live binding exists; answers the binding in
    /// force afterwards (the existing one wins, refreshed).
    ///
    /// # Errors
    /// An empty or over-long key.
    fn bind_if_absent<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        engine: &'a EngineId,
        deadline: Deadline,
    ) -> StoreFuture<'a, EngineId>;

    /// Rebinds `key` to `engine` if it is still bound to `expected` (or unbound or
    /// expired); answers the binding in force afterwards, which is another engine
    /// when a concurrent rebinding won.
    ///
    /// # Errors
    /// An empty or over-long key.
    fn replace<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        expected: &'a EngineId,
        engine: &'a EngineId,
        deadline: Deadline,
    ) -> StoreFuture<'a, EngineId>;

    /// Drops every binding to `engine` this process holds (it left the fleet);
    /// returns how many. A shared store's bindings to it are replaced on their next
    /// use, as the engine is no longer a candidate.
    fn remove_engine(&self, engine: &EngineId) -> usize;

    /// Frees every binding this process holds that is idle past the timeout; returns
    /// how many.
    fn sweep(&self) -> usize;

    /// Bindings this process holds, live or awaiting a sweep.
    fn len(&self) -> usize;

    /// Whether this process holds no binding.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connects a shared store to its backend within its timeout; answers whether the
    /// backend can be used (a local store has none to wait for). Startup calls it so
    /// a replica's first requests share bindings.
    fn connect(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(std::future::ready(true))
    }

    /// The shared backend's state, for a store that has one.
    fn backend(&self) -> Option<BackendStatus> {
        None
    }
}

/// The state of a store's shared backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendStatus {
    /// Whether the backend answered its last command (or connection attempt).
    pub reachable: bool,
    /// Commands that failed or timed out, and connection attempts that failed.
    pub errors: u64,
    /// Operations answered from local bindings because the backend was unreachable.
    pub local_fallbacks: u64,
    /// Commands not sent (the operation answered from local bindings, and counted in
    /// `local_fallbacks` too): the backoff after a command timed out, or the pick's
    /// deadline already passed.
    pub skipped: u64,
}

/// Runs [`AffinityStore::sweep`] every `every` until the handle is dropped.
pub fn spawn_sweeper(store: Arc<dyn AffinityStore>, every: Duration) -> SweeperHandle {
    SweeperHandle(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            store.sweep();
        }
    }))
}

/// A store's sweeper task; dropping the handle stops it.
#[derive(Debug)]
pub struct SweeperHandle(JoinHandle<()>);

impl Drop for SweeperHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `key` within `scope` as one string (its parts joined by NUL), once the key is
/// checked against `max_key_bytes`.
fn compose(
    scope: AffinityScope<'_>,
    key: &str,
    max_key_bytes: usize,
) -> Result<String, AffinityKeyError> {
    if key.is_empty() {
        return Err(AffinityKeyError::Empty);
    }
    if key.len() > max_key_bytes {
        return Err(AffinityKeyError::TooLong {
            len: key.len(),
            max: max_key_bytes,
        });
    }
    let stage = scope.stage.as_str();
    let mut composed =
        String::with_capacity(scope.model.len() + scope.bucket.len() + stage.len() + key.len() + 3);
    for part in [scope.model, scope.bucket, stage, key] {
        composed.push_str(part);
        composed.push('\0');
    }
    composed.pop();
    Ok(composed)
}
