//! Bindings shared by router replicas in a Redis server.
//!
//! A binding is a Redis string under `key_prefix` + the scoped key, holding the engine
//! id, with a TTL of the idle timeout that every use refreshes (`GETEX ... PX`).
//! Create-or-get and compare-and-replace run on the server as one Lua script, so two
//! replicas binding a new session at once agree on the first binding. A short local
//! cache answers repeated lookups of a key without a round trip; it is refreshed from
//! the server once older than `cache_ttl`, so a rebinding made by another replica is
//! seen within that time.
//!
//! The server is never in the way of a request: each command has a timeout, and
//! while the server cannot be reached (refused, timed out, an error reply) the store
//! binds in a local store of its own, counts each such operation, and logs once when
//! the server goes and once when it returns. Reconnection runs in the background, at
//! most once per `reconnect_interval`. A key bound locally during an outage is
//! written to the server on its first lookup after it returns, unless another replica
//! bound it there first.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Script};
use tokio::time::Instant;

use super::{
    AffinityConfig, AffinityScope, AffinityStore, BackendStatus, LocalAffinityStore, StoreFuture,
};
use crate::engine::EngineId;
use crate::names::check_name;

/// Sets `KEYS[1]` to `ARGV[1]` with a TTL of `ARGV[2]` ms unless it holds a value
/// other than `ARGV[3]` (the expected engine, or empty: bind only if absent); a kept
/// value has its TTL refreshed. Returns the value in force.
const BIND: &str = r"
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return current
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
";

/// How the store reaches its server.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// `redis://[user:password@]host[:port][/db]`.
    pub url: String,
    /// Prepended to every key the store writes.
    pub key_prefix: String,
    /// Longest wait for a connection or a command's answer.
    pub timeout: Duration,
    /// How long a binding read from the server is answered locally; zero: always
    /// asked.
    pub cache_ttl: Duration,
    /// Least time between connection attempts.
    pub reconnect_interval: Duration,
}

impl fmt::Debug for RedisSettings {
    /// The URL is left out: it may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSettings")
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .field("cache_ttl", &self.cache_ttl)
            .field("reconnect_interval", &self.reconnect_interval)
            .finish_non_exhaustive()
    }
}

/// A Redis URL the store cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("is not a usable redis:// URL: {0}")]
pub struct RedisUrlError(String);

/// Bindings in a Redis server, shared by every replica that names it. See the module
/// documentation.
pub struct RedisAffinityStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: AffinityConfig,
    settings: RedisSettings,
    client: Client,
    connection: Mutex<Option<MultiplexedConnection>>,
    connecting: AtomicBool,
    /// No connection attempt before this instant.
    retry_at: Mutex<Instant>,
    /// Whether the last command or connection attempt succeeded.
    reachable: AtomicBool,
    script: Script,
    cache: LocalAffinityStore,
    local: LocalAffinityStore,
    errors: AtomicU64,
    local_fallbacks: AtomicU64,
}

impl fmt::Debug for RedisAffinityStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisAffinityStore")
            .field("settings", &self.inner.settings)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

/// Why a command gave no answer.
enum Failure {
    /// No connection (the server is unreachable, or a connection is being made).
    Unavailable,
    /// The command failed or timed out.
    Failed(String),
    /// The server holds a value under the key that is not an engine id.
    Invalid,
}

impl RedisAffinityStore {
    /// A store for `settings.url`; no connection is made until
    /// [`AffinityStore::connect`] or the first operation.
    ///
    /// # Errors
    /// The URL is not a `redis://` URL the client can use.
    pub fn new(config: AffinityConfig, settings: RedisSettings) -> Result<Self, RedisUrlError> {
        if !settings.url.starts_with("redis://") {
            return Err(RedisUrlError("the scheme must be redis://".into()));
        }
        let client =
            Client::open(settings.url.as_str()).map_err(|e| RedisUrlError(e.to_string()))?;
        let cache = LocalAffinityStore::new(AffinityConfig {
            idle_timeout: settings.cache_ttl.max(Duration::from_nanos(1)),
            ..config
        });
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                settings,
                client,
                connection: Mutex::new(None),
                connecting: AtomicBool::new(false),
                retry_at: Mutex::new(Instant::now()),
                reachable: AtomicBool::new(false),
                script: Script::new(BIND),
                cache,
                local: LocalAffinityStore::new(config),
                errors: AtomicU64::new(0),
                local_fallbacks: AtomicU64::new(0),
            }),
        })
    }

    /// The server's state and the store's counts.
    pub fn status(&self) -> BackendStatus {
        BackendStatus {
            reachable: self.inner.reachable.load(Ordering::Relaxed),
            errors: self.inner.errors.load(Ordering::Relaxed),
            local_fallbacks: self.inner.local_fallbacks.load(Ordering::Relaxed),
        }
    }

    async fn lookup(&self, composed: String) -> Option<EngineId> {
        let inner = &self.inner;
        if !inner.settings.cache_ttl.is_zero()
            && let Some(engine) = inner.cache.lookup(&composed, false)
        {
            return Some(engine);
        }
        let mut command = redis::cmd("GETEX");
        command
            .arg(inner.redis_key(&composed))
            .arg("PX")
            .arg(inner.ttl_ms());
        match inner.query::<Option<Vec<u8>>>(&command).await {
            Ok(Some(value)) => {
                let engine = inner.engine_id(value)?;
                inner.cache_put(composed, &engine);
                Some(engine)
            }
            // Bound here during an outage: shared now, unless another replica bound
            // the key first.
            Ok(None) => match inner.local.forget(&composed) {
                Some(engine) => Some(self.bind(composed, &engine, None).await),
                None => None,
            },
            Err(failure) => {
                inner.failed(failure);
                inner.local.lookup(&composed, true)
            }
        }
    }

    async fn bind(
        &self,
        composed: String,
        engine: &EngineId,
        expected: Option<&EngineId>,
    ) -> EngineId {
        let inner = &self.inner;
        let mut invocation = inner.script.prepare_invoke();
        invocation
            .key(inner.redis_key(&composed))
            .arg(engine.as_str())
            .arg(inner.ttl_ms())
            .arg(expected.map_or("", EngineId::as_str));
        let answer = match inner.connection() {
            Some(mut connection) => {
                match tokio::time::timeout(
                    inner.settings.timeout,
                    invocation.invoke_async::<Vec<u8>>(&mut connection),
                )
                .await
                {
                    Ok(Ok(value)) => Ok(value),
                    Ok(Err(e)) => Err(Failure::Failed(e.to_string())),
                    Err(_) => Err(Failure::Failed("timed out".into())),
                }
            }
            None => Err(Failure::Unavailable),
        };
        match answer.map(|value| inner.engine_id(value)) {
            Ok(Some(bound)) => {
                inner.succeeded();
                inner.cache_put(composed, &bound);
                bound
            }
            Ok(None) => {
                inner.failed(Failure::Invalid);
                inner.local_update(composed, engine, expected)
            }
            Err(failure) => {
                inner.failed(failure);
                inner.local_update(composed, engine, expected)
            }
        }
    }
}

impl Inner {
    fn redis_key(&self, composed: &str) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.settings.key_prefix.len() + composed.len());
        key.extend_from_slice(self.settings.key_prefix.as_bytes());
        key.extend_from_slice(composed.as_bytes());
        key
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.config.idle_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// An engine id the server answered, if it is one.
    fn engine_id(&self, value: Vec<u8>) -> Option<EngineId> {
        let id = String::from_utf8(value).ok()?;
        check_name(&id).is_ok().then(|| EngineId::from(id))
    }

    fn cache_put(&self, composed: String, engine: &EngineId) {
        if !self.settings.cache_ttl.is_zero() {
            self.cache.update(composed, engine, |_| true);
        }
    }

    fn local_update(
        &self,
        composed: String,
        engine: &EngineId,
        expected: Option<&EngineId>,
    ) -> EngineId {
        self.local
            .update(composed, engine, |current| Some(current) == expected)
    }

    /// A connection to use now; `None` (and a connection attempt in the background,
    /// when one is due) while there is none.
    fn connection(self: &Arc<Self>) -> Option<MultiplexedConnection> {
        if let Some(connection) = self.connection.lock().clone() {
            return Some(connection);
        }
        if Instant::now() >= *self.retry_at.lock() && !self.connecting.swap(true, Ordering::AcqRel)
        {
            let inner = Arc::clone(self);
            tokio::spawn(async move {
                inner.attempt().await;
                inner.connecting.store(false, Ordering::Release);
            });
        }
        None
    }

    /// Connects unless a connection exists or another attempt is under way.
    async fn connect(self: &Arc<Self>) {
        if self.connection.lock().is_some() || self.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        self.attempt().await;
        self.connecting.store(false, Ordering::Release);
    }

    async fn attempt(&self) {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.settings.timeout))
            .set_response_timeout(Some(self.settings.timeout));
        let connected = tokio::time::timeout(
            self.settings.timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await;
        match connected {
            Ok(Ok(connection)) => {
                *self.connection.lock() = Some(connection);
                self.succeeded();
            }
            Ok(Err(e)) => self.failed(Failure::Failed(e.to_string())),
            Err(_) => self.failed(Failure::Failed("connecting timed out".into())),
        }
    }

    async fn query<T: redis::FromRedisValue>(
        self: &Arc<Self>,
        command: &redis::Cmd,
    ) -> Result<T, Failure> {
        let mut connection = self.connection().ok_or(Failure::Unavailable)?;
        match tokio::time::timeout(
            self.settings.timeout,
            command.query_async::<T>(&mut connection),
        )
        .await
        {
            Ok(Ok(value)) => {
                self.succeeded();
                Ok(value)
            }
            Ok(Err(e)) => Err(Failure::Failed(e.to_string())),
            Err(_) => Err(Failure::Failed("timed out".into())),
        }
    }

    fn succeeded(&self) {
        if !self.reachable.swap(true, Ordering::AcqRel) {
            tracing::info!(prefix = %self.settings.key_prefix, "the Redis affinity store is reachable: bindings are shared");
        }
    }

    /// Counts an operation answered locally; a failed command also drops the
    /// connection, so the next attempt waits out the reconnect interval.
    fn failed(&self, failure: Failure) {
        self.local_fallbacks.fetch_add(1, Ordering::Relaxed);
        let error = match failure {
            Failure::Unavailable => return,
            Failure::Invalid => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Failure::Failed(error) => error,
        };
        self.errors.fetch_add(1, Ordering::Relaxed);
        *self.connection.lock() = None;
        *self.retry_at.lock() = Instant::now() + self.settings.reconnect_interval;
        if self.reachable.swap(false, Ordering::AcqRel) || self.errors.load(Ordering::Relaxed) == 1
        {
            tracing::warn!(%error, "the Redis affinity store is unreachable: bindings are local until it answers");
        }
    }
}

impl AffinityStore for RedisAffinityStore {
    fn get<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
    ) -> StoreFuture<'a, Option<EngineId>> {
        Box::pin(async move {
            let composed = self.inner.local.compose(scope, key)?;
            Ok(self.lookup(composed).await)
        })
    }

    fn bind_if_absent<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        engine: &'a EngineId,
    ) -> StoreFuture<'a, EngineId> {
        Box::pin(async move {
            let composed = self.inner.local.compose(scope, key)?;
            Ok(self.bind(composed, engine, None).await)
        })
    }

    fn replace<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        expected: &'a EngineId,
        engine: &'a EngineId,
    ) -> StoreFuture<'a, EngineId> {
        Box::pin(async move {
            let composed = self.inner.local.compose(scope, key)?;
            Ok(self.bind(composed, engine, Some(expected)).await)
        })
    }

    fn remove_engine(&self, engine: &EngineId) -> usize {
        self.inner.cache.remove_engine(engine) + self.inner.local.remove_engine(engine)
    }

    fn sweep(&self) -> usize {
        self.inner.cache.sweep() + self.inner.local.sweep()
    }

    fn len(&self) -> usize {
        self.inner.cache.len() + self.inner.local.len()
    }

    fn connect(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(async move {
            Inner::connect(&self.inner).await;
            self.inner.connection.lock().is_some()
        })
    }

    fn backend(&self) -> Option<BackendStatus> {
        Some(self.status())
    }
}

#[cfg(test)]
mod tests;
