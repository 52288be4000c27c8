//! Affinity: bindings from a session or routing key to the engine that serves it.
//!
//! A binding is scoped by model, bucket id and stage, so one session may be bound to
//! a prefill engine and a decode engine, and to different engines in different
//! buckets. The store only keeps and updates bindings (atomic create-or-get and
//! compare-and-replace); policies decide when to reuse or replace one.
//!
//! Memory is bounded however keys arrive from the network: keys longer than
//! [`AffinityConfig::max_key_bytes`] are refused, and past
//! [`AffinityConfig::max_entries`] the longest-idle binding is evicted. Bindings idle
//! longer than [`AffinityConfig::idle_timeout`] are gone for lookups at once and freed
//! by [`AffinityStore::sweep`], which the owner runs (see
//! [`AffinityStore::spawn_sweeper`]).

use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::Arc;
use std::time::Duration;

use lru::LruCache;
use parking_lot::Mutex;
use rustc_hash::FxHasher;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::engine::{EngineId, Role};

/// Shards of the store: bindings of different keys rarely contend.
const SHARDS: usize = 16;

/// Limits of an [`AffinityStore`].
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

#[derive(Debug)]
struct Binding {
    engine: EngineId,
    last_used: Instant,
}

type Shard = LruCache<Box<str>, Binding, BuildHasherDefault<FxHasher>>;

/// Scoped key-to-engine bindings with idle expiry and a hard size bound. Share it
/// behind an `Arc`; every method takes `&self`.
pub struct AffinityStore {
    config: AffinityConfig,
    /// Bindings each shard may hold.
    per_shard: usize,
    shards: Box<[Mutex<Shard>]>,
}

impl fmt::Debug for AffinityStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AffinityStore")
            .field("config", &self.config)
            .field("len", &self.len())
            .finish()
    }
}

impl AffinityStore {
    /// An empty store.
    pub fn new(config: AffinityConfig) -> Self {
        // Shards grow with use (a bounded LRU would reserve its whole capacity up
        // front); the bound is enforced on insert.
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(LruCache::unbounded_with_hasher(
                    BuildHasherDefault::default(),
                ))
            })
            .collect();
        Self {
            config,
            per_shard: config.max_entries.div_ceil(SHARDS).max(1),
            shards,
        }
    }

    /// The store's limits.
    pub fn config(&self) -> AffinityConfig {
        self.config
    }

    /// The engine `key` is bound to in `scope`, refreshing the binding; `None` when
    /// unbound or idle past the timeout.
    ///
    /// # Errors
    /// An empty or over-long key.
    pub fn get(
        &self,
        scope: AffinityScope<'_>,
        key: &str,
    ) -> Result<Option<EngineId>, AffinityKeyError> {
        let composed = self.compose(scope, key)?;
        let now = Instant::now();
        let mut shard = self.shard(&composed).lock();
        let expired = match shard.get_mut(composed.as_str()) {
            Some(binding) if !self.expired(binding, now) => {
                binding.last_used = now;
                return Ok(Some(binding.engine.clone()));
            }
            Some(_) => true,
            None => false,
        };
        if expired {
            shard.pop(composed.as_str());
        }
        Ok(None)
    }

    /// Binds `key` to `engine` unless a live binding exists; returns the binding in
    /// force afterwards (the existing one wins, refreshed).
    ///
    /// # Errors
    /// An empty or over-long key.
    pub fn bind_if_absent(
        &self,
        scope: AffinityScope<'_>,
        key: &str,
        engine: &EngineId,
    ) -> Result<EngineId, AffinityKeyError> {
        self.update(scope, key, engine, |_| false)
    }

    /// Rebinds `key` to `engine` if it is still bound to `expected` (or unbound or
    /// expired); returns the binding in force afterwards, which is another engine
    /// when a concurrent rebinding won.
    ///
    /// # Errors
    /// An empty or over-long key.
    pub fn replace(
        &self,
        scope: AffinityScope<'_>,
        key: &str,
        expected: &EngineId,
        engine: &EngineId,
    ) -> Result<EngineId, AffinityKeyError> {
        self.update(scope, key, engine, |current| current == expected)
    }

    /// Sets the binding to `engine` when there is none (or it expired) or when
    /// `overwrite(current)` says so; otherwise refreshes and returns the current one.
    fn update(
        &self,
        scope: AffinityScope<'_>,
        key: &str,
        engine: &EngineId,
        overwrite: impl FnOnce(&EngineId) -> bool,
    ) -> Result<EngineId, AffinityKeyError> {
        let composed = self.compose(scope, key)?;
        let now = Instant::now();
        let mut shard = self.shard(&composed).lock();
        if let Some(binding) = shard.get_mut(composed.as_str())
            && !self.expired(binding, now)
            && !overwrite(&binding.engine)
        {
            binding.last_used = now;
            return Ok(binding.engine.clone());
        }
        shard.push(
            composed.into_boxed_str(),
            Binding {
                engine: engine.clone(),
                last_used: now,
            },
        );
        while shard.len() > self.per_shard {
            shard.pop_lru();
        }
        Ok(engine.clone())
    }

    /// Drops every binding to `engine` (it left the fleet); returns how many.
    pub fn remove_engine(&self, engine: &EngineId) -> usize {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let keys: Vec<Box<str>> = shard
                .iter()
                .filter(|(_, b)| &b.engine == engine)
                .map(|(k, _)| k.clone())
                .collect();
            for key in keys {
                shard.pop(&key);
                removed += 1;
            }
        }
        removed
    }

    /// Frees every binding idle past the timeout; returns how many.
    pub fn sweep(&self) -> usize {
        let now = Instant::now();
        let mut swept = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            // Least recently used first: stop at the first binding still live.
            while shard
                .peek_lru()
                .is_some_and(|(_, binding)| self.expired(binding, now))
            {
                shard.pop_lru();
                swept += 1;
            }
        }
        swept
    }

    /// Runs [`sweep`](Self::sweep) every `every` until the handle is dropped.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) -> SweeperHandle {
        let store = Arc::clone(self);
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

    /// Bindings held, live or awaiting a sweep.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no binding is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn expired(&self, binding: &Binding, now: Instant) -> bool {
        now.saturating_duration_since(binding.last_used) >= self.config.idle_timeout
    }

    fn compose(&self, scope: AffinityScope<'_>, key: &str) -> Result<String, AffinityKeyError> {
        if key.is_empty() {
            return Err(AffinityKeyError::Empty);
        }
        if key.len() > self.config.max_key_bytes {
            return Err(AffinityKeyError::TooLong {
                len: key.len(),
                max: self.config.max_key_bytes,
            });
        }
        let stage = scope.stage.as_str();
        let mut composed = String::with_capacity(
            scope.model.len() + scope.bucket.len() + stage.len() + key.len() + 3,
        );
        for part in [scope.model, scope.bucket, stage, key] {
            composed.push_str(part);
            composed.push('\0');
        }
        composed.pop();
        Ok(composed)
    }

    fn shard(&self, composed: &str) -> &Mutex<Shard> {
        let hash = BuildHasherDefault::<FxHasher>::default().hash_one(composed);
        &self.shards[(hash >> 32) as usize % SHARDS]
    }
}

/// The store's sweeper task; dropping the handle stops it.
#[derive(Debug)]
pub struct SweeperHandle(JoinHandle<()>);

impl Drop for SweeperHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests;
