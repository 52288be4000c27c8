//! The process's own bindings: sharded LRU maps in memory.

use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault};

use lru::LruCache;
use parking_lot::Mutex;
use rustc_hash::FxHasher;
use tokio::time::Instant;

use super::{
    AffinityConfig, AffinityKeyError, AffinityScope, AffinityStore, Deadline, StoreFuture, compose,
};
use crate::engine::EngineId;

/// Shards of the store: bindings of different keys rarely contend.
const SHARDS: usize = 16;

#[derive(Debug)]
struct Binding {
    engine: EngineId,
    last_used: Instant,
}

type Shard = LruCache<Box<str>, Binding, BuildHasherDefault<FxHasher>>;

/// Scoped key-to-engine bindings of this process, with idle expiry and a hard size
/// bound. Share it behind an `Arc`; every method takes `&self`.
pub struct LocalAffinityStore {
    config: AffinityConfig,
    /// Bindings each shard may hold.
    per_shard: usize,
    shards: Box<[Mutex<Shard>]>,
}

impl fmt::Debug for LocalAffinityStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalAffinityStore")
            .field("config", &self.config)
            .field("len", &self.len())
            .finish()
    }
}

impl LocalAffinityStore {
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
        Ok(self.lookup(&self.compose(scope, key)?, true))
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
        Ok(self.update(self.compose(scope, key)?, engine, |_| false))
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
        Ok(self.update(self.compose(scope, key)?, engine, |current| {
            current == expected
        }))
    }

    /// The live binding of a composed key; `refresh` marks it used.
    pub(super) fn lookup(&self, composed: &str, refresh: bool) -> Option<EngineId> {
        let now = Instant::now();
        let mut shard = self.shard(composed).lock();
        let expired = match shard.get_mut(composed) {
            Some(binding) if !self.expired(binding, now) => {
                if refresh {
                    binding.last_used = now;
                }
                return Some(binding.engine.clone());
            }
            Some(_) => true,
            None => false,
        };
        if expired {
            shard.pop(composed);
        }
        None
    }

    /// The live binding of a composed key, read without marking it used or moving it
    /// in the eviction order.
    pub(super) fn peek_composed(&self, composed: &str) -> Option<EngineId> {
        let now = Instant::now();
        let shard = self.shard(composed).lock();
        shard
            .peek(composed)
            .filter(|binding| !self.expired(binding, now))
            .map(|binding| binding.engine.clone())
    }

    /// Drops the binding of a composed key; returns the engine it was bound to,
    /// unless it was idle past the timeout.
    #[cfg(feature = "redis")]
    pub(super) fn forget(&self, composed: &str) -> Option<EngineId> {
        let now = Instant::now();
        self.shard(composed)
            .lock()
            .pop(composed)
            .filter(|binding| !self.expired(binding, now))
            .map(|binding| binding.engine)
    }

    /// Sets the binding of a composed key to `engine` when there is none (or it
    /// expired) or when `overwrite(current)` says so; otherwise refreshes and returns
    /// the current one.
    pub(super) fn update(
        &self,
        composed: String,
        engine: &EngineId,
        overwrite: impl FnOnce(&EngineId) -> bool,
    ) -> EngineId {
        let now = Instant::now();
        let mut shard = self.shard(&composed).lock();
        if let Some(binding) = shard.get_mut(composed.as_str())
            && !self.expired(binding, now)
            && !overwrite(&binding.engine)
        {
            binding.last_used = now;
            return binding.engine.clone();
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
        engine.clone()
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

    /// Bindings held, live or awaiting a sweep.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no binding is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn compose(
        &self,
        scope: AffinityScope<'_>,
        key: &str,
    ) -> Result<String, AffinityKeyError> {
        compose(scope, key, self.config.max_key_bytes)
    }

    fn expired(&self, binding: &Binding, now: Instant) -> bool {
        now.saturating_duration_since(binding.last_used) >= self.config.idle_timeout
    }

    fn shard(&self, composed: &str) -> &Mutex<Shard> {
        let hash = BuildHasherDefault::<FxHasher>::default().hash_one(composed);
        &self.shards[(hash >> 32) as usize % SHARDS]
    }
}

impl AffinityStore for LocalAffinityStore {
    fn get<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        _: Deadline,
    ) -> StoreFuture<'a, Option<EngineId>> {
        Box::pin(std::future::ready(LocalAffinityStore::get(
            self, scope, key,
        )))
    }

    fn peek<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        _: Deadline,
    ) -> StoreFuture<'a, Option<EngineId>> {
        Box::pin(std::future::ready(
            self.compose(scope, key)
                .map(|composed| self.peek_composed(&composed)),
        ))
    }

    fn bind_if_absent<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        engine: &'a EngineId,
        _: Deadline,
    ) -> StoreFuture<'a, EngineId> {
        Box::pin(std::future::ready(LocalAffinityStore::bind_if_absent(
            self, scope, key, engine,
        )))
    }

    fn replace<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        expected: &'a EngineId,
        engine: &'a EngineId,
        _: Deadline,
    ) -> StoreFuture<'a, EngineId> {
        Box::pin(std::future::ready(LocalAffinityStore::replace(
            self, scope, key, expected, engine,
        )))
    }

    fn remove_engine(&self, engine: &EngineId) -> usize {
        LocalAffinityStore::remove_engine(self, engine)
    }

    fn sweep(&self) -> usize {
        LocalAffinityStore::sweep(self)
    }

    fn len(&self) -> usize {
        LocalAffinityStore::len(self)
    }
}

#[cfg(test)]
mod tests;
