//! Bindings shared by router replicas in a Redis server (6.2 or later).
//!
//! A binding is a Redis string under `key_prefix` + the scoped key, holding the engine
//! id, with a TTL that every use refreshes: the idle timeout plus the local cache's
//! lifetime, since uses the cache answers do not reach the server. Lookups,
//! create-or-get and compare-and-replace each run on the server as one Lua script, so
//! two replicas binding a new session at once agree on the first binding, and a value
//! under a key that is not an engine id (too long, other characters, another type) is
//! never sent back: a lookup treats it as no binding and a bind overwrites it. A
//! short local cache answers repeated lookups of a key without a round trip; it is
//! refreshed from the server once older than `cache_ttl`, so a rebinding made by
//! another replica is seen within that time.
//!
//! The server is never in the way of a request. The commands of one pick share a
//! deadline, `timeout` from the pick's start ([`AffinityStore::deadline`]): each is
//! given the time left, and none is sent once it passed. A command that times out
//! opens a circuit: no command is sent for `reconnect_interval`, then a single one
//! (the trial, while the others still bind locally), and the server's answer to it
//! closes the circuit, so a server that accepts connections and never answers
//! (paused, overloaded) costs the timeout to one pick a backoff, not to every one.
//! While the server cannot be reached (refused, timed out, connection lost, or a
//! command skipped) the store binds in a local store of its own, counts each such
//! operation, and logs once when the server goes and once when it returns.
//! Reconnection runs in the background, at most once per `reconnect_interval`. An
//! error the server answers (out of memory, read-only) fails that operation alone: it
//! is answered locally and counted, and the connection stays. A key bound locally
//! during an outage is written to the server on its first lookup after it returns,
//! unless another replica bound it there first.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, Script};
use tokio::time::Instant;

use super::{
    AffinityConfig, AffinityScope, AffinityStore, BackendStatus, Deadline, LocalAffinityStore,
    StoreFuture,
};
use crate::engine::EngineId;
use crate::names::{MAX_NAME_BYTES, check_name};

/// Whether a value can be an engine id, as `check_name` says: 1 to 128 bytes of
/// visible ASCII other than `"` `\` `{` `}` `,` `=`.
const VALID: &str = r#"
local function valid(value)
  return #value >= 1 and #value <= 128 and string.find(value, '^[%w%p]+$') ~= nil
    and string.find(value, '["\\{},=]') == nil
end
"#;

/// `key`'s engine id; false when absent or not an engine id.
const READ: &str = r"
local function read(key)
  if redis.call('TYPE', key).ok ~= 'string' then
    return false
  end
  local current = redis.call('GET', key)
  if not valid(current) then
    return false
  end
  return current
end
";

/// `KEYS[1]`'s engine id with its TTL set to `ARGV[1]` ms; nil when absent or not an
/// engine id.
const LOOKUP: &str = r"
local current = read(KEYS[1])
if current then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return current
";

/// `KEYS[1]`'s engine id, its TTL untouched; nil when absent or not an engine id.
const PEEK: &str = r"
return read(KEYS[1])
";

/// Sets `KEYS[1]` to `ARGV[1]` with a TTL of `ARGV[2]` ms unless it holds an engine id
/// other than `ARGV[3]` (the expected engine, or empty: bind only if absent); a kept
/// value has its TTL refreshed. Returns the engine id in force.
const BIND: &str = r"
local current = read(KEYS[1])
if current and current ~= ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return current
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
";

/// How often an error the server answers is logged, at most.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

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
    /// Least time between connection attempts, and how long no command is sent
    /// after one timed out.
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

/// A connection and the generation it belongs to: what a command on an older one
/// reports changes nothing.
type Current = Option<(u64, MultiplexedConnection)>;

struct Inner {
    config: AffinityConfig,
    settings: RedisSettings,
    client: Client,
    connection: Mutex<Current>,
    generation: AtomicU64,
    /// Held while a connection is being made.
    attempting: Arc<tokio::sync::Mutex<()>>,
    /// No background connection attempt before this instant.
    retry_at: Mutex<Instant>,
    /// Whether the loss of the server was logged (once an outage).
    down_logged: Mutex<bool>,
    /// When an error the server answered was last logged.
    refusal_logged: Mutex<Option<Instant>>,
    /// Whether commands are sent.
    circuit: Mutex<Circuit>,
    lookup: Script,
    peek: Script,
    bind: Script,
    cache: LocalAffinityStore,
    local: LocalAffinityStore,
    errors: AtomicU64,
    local_fallbacks: AtomicU64,
    skipped: AtomicU64,
}

impl fmt::Debug for RedisAffinityStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisAffinityStore")
            .field("settings", &self.inner.settings)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

/// Whether commands are sent. A command that timed out opens it; any answer of the
/// server closes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Circuit {
    /// Every command is sent.
    Closed,
    /// No command is sent before this instant (the backoff, or the trial's wait);
    /// then the first one is, as the trial.
    Open(Instant),
}

impl Circuit {
    /// Whether a command that may wait `wait` is sent at `now`: always while closed;
    /// once the backoff passed, the first one, the others waiting as long as it may.
    fn admit(&mut self, now: Instant, wait: Duration) -> bool {
        match *self {
            Self::Closed => true,
            Self::Open(until) if now >= until => {
                *self = Self::Open(now + wait);
                true
            }
            Self::Open(_) => false,
        }
    }
}

/// Why a command gave no answer to use.
enum Failure {
    /// No connection (the server is unreachable, or a connection is being made).
    Unavailable,
    /// Not sent: the circuit is open or the pick's deadline passed.
    Skipped,
    /// The command timed out: the circuit opens and the connection is dropped.
    TimedOut(u64),
    /// The connection failed: it is dropped.
    Lost(u64, String),
    /// The server answered an error; the connection is fine.
    Refused(String),
    /// The server answered something that is not an engine id.
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
                generation: AtomicU64::new(0),
                attempting: Arc::new(tokio::sync::Mutex::new(())),
                retry_at: Mutex::new(Instant::now()),
                down_logged: Mutex::new(false),
                refusal_logged: Mutex::new(None),
                circuit: Mutex::new(Circuit::Closed),
                lookup: Script::new(&format!("{VALID}{READ}{LOOKUP}")),
                peek: Script::new(&format!("{VALID}{READ}{PEEK}")),
                bind: Script::new(&format!("{VALID}{READ}{BIND}")),
                cache,
                local: LocalAffinityStore::new(config),
                errors: AtomicU64::new(0),
                local_fallbacks: AtomicU64::new(0),
                skipped: AtomicU64::new(0),
            }),
        })
    }

    /// The server's state and the store's counts.
    pub fn status(&self) -> BackendStatus {
        BackendStatus {
            reachable: self.inner.connection.lock().is_some(),
            errors: self.inner.errors.load(Ordering::Relaxed),
            local_fallbacks: self.inner.local_fallbacks.load(Ordering::Relaxed),
            skipped: self.inner.skipped.load(Ordering::Relaxed),
        }
    }

    async fn lookup(&self, composed: String, deadline: Deadline) -> Option<EngineId> {
        let inner = &self.inner;
        if !inner.settings.cache_ttl.is_zero()
            && let Some(engine) = inner.cache.lookup(&composed, false)
        {
            return Some(engine);
        }
        let mut invocation = inner.lookup.prepare_invoke();
        invocation
            .key(inner.redis_key(&composed))
            .arg(inner.ttl_ms());
        match inner.run(&invocation, deadline).await {
            Ok(Some(engine)) => {
                // A binding of an earlier outage is the server's now.
                inner.local.forget(&composed);
                inner.cache_put(composed, &engine);
                Some(engine)
            }
            // Bound here during an outage: shared now, unless another replica bound
            // the key first.
            Ok(None) => match inner.local.forget(&composed) {
                Some(engine) => Some(self.bind(composed, &engine, None, deadline).await),
                None => None,
            },
            Err(failure) => {
                inner.failed(failure);
                inner.local.lookup(&composed, true)
            }
        }
    }

    /// What [`lookup`](Self::lookup) would answer, changing nothing: the cache and
    /// the outage bindings read without recency, the server's binding without its TTL
    /// refreshed, an outage binding not written back, a failure not counted, the
    /// circuit neither tried nor opened (while it is open the server is not asked).
    async fn peek_composed(&self, composed: &str, deadline: Deadline) -> Option<EngineId> {
        let inner = &self.inner;
        if !inner.settings.cache_ttl.is_zero()
            && let Some(engine) = inner.cache.peek_composed(composed)
        {
            return Some(engine);
        }
        let mut invocation = inner.peek.prepare_invoke();
        invocation.key(inner.redis_key(composed));
        match inner.run_peek(&invocation, deadline).await {
            Ok(Some(engine)) => Some(engine),
            Ok(None) | Err(_) => inner.local.peek_composed(composed),
        }
    }

    async fn bind(
        &self,
        composed: String,
        engine: &EngineId,
        expected: Option<&EngineId>,
        deadline: Deadline,
    ) -> EngineId {
        let inner = &self.inner;
        let mut invocation = inner.bind.prepare_invoke();
        invocation
            .key(inner.redis_key(&composed))
            .arg(engine.as_str())
            .arg(inner.ttl_ms())
            .arg(expected.map_or("", EngineId::as_str));
        match inner.run(&invocation, deadline).await {
            Ok(Some(bound)) => {
                inner.cache_put(composed, &bound);
                bound
            }
            answer => {
                inner.failed(answer.err().unwrap_or(Failure::Invalid));
                inner.cache.forget(&composed);
                inner
                    .local
                    .update(composed, engine, |current| Some(current) == expected)
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

    /// The TTL a use sets: the idle timeout from the last use the cache may have
    /// answered.
    fn ttl_ms(&self) -> u64 {
        let ttl = self.config.idle_timeout + self.settings.cache_ttl;
        u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
    }

    fn cache_put(&self, composed: String, engine: &EngineId) {
        if !self.settings.cache_ttl.is_zero() {
            self.cache.update(composed, engine, |_| true);
        }
    }

    /// Runs a script within the timeout and the time `deadline` leaves, unless the
    /// circuit holds it back; its engine id (`None`: no binding). A timeout of the
    /// whole store timeout opens the circuit (one cut short by the pick's deadline
    /// does not), an answer closes it.
    async fn run(
        self: &Arc<Self>,
        invocation: &redis::ScriptInvocation<'_>,
        deadline: Deadline,
    ) -> Result<Option<EngineId>, Failure> {
        let (generation, connection) = self.connection().ok_or(Failure::Unavailable)?;
        let wait = deadline.wait(self.settings.timeout);
        if wait.is_zero() || !self.circuit.lock().admit(Instant::now(), wait) {
            return Err(Failure::Skipped);
        }
        let answer = match invoke(invocation, generation, connection, wait).await {
            // The pick's own deadline ran out, not the server's time: the command
            // counts as not sent, and neither the circuit nor the connection changes.
            Err(Failure::TimedOut(_)) if wait < self.settings.timeout => Err(Failure::Skipped),
            answer => answer,
        };
        self.settle_circuit(&answer);
        answer
    }

    /// A timeout opens the circuit for the backoff; an answer of the server closes
    /// it; a lost connection, or a command the pick's deadline cut short, leaves it
    /// as it is.
    fn settle_circuit(&self, answer: &Result<Option<EngineId>, Failure>) {
        let mut circuit = self.circuit.lock();
        match answer {
            Err(Failure::TimedOut(_)) => {
                *circuit = Circuit::Open(Instant::now() + self.settings.reconnect_interval);
            }
            Err(Failure::Lost(..) | Failure::Skipped) => {}
            _ => *circuit = Circuit::Closed,
        }
    }

    /// Runs a script as [`run`](Self::run) does while the circuit is closed; skips it
    /// while the circuit is open, which it leaves as it is.
    async fn run_peek(
        self: &Arc<Self>,
        invocation: &redis::ScriptInvocation<'_>,
        deadline: Deadline,
    ) -> Result<Option<EngineId>, Failure> {
        let (generation, connection) = self.connection().ok_or(Failure::Unavailable)?;
        let wait = deadline.wait(self.settings.timeout);
        if wait.is_zero() || *self.circuit.lock() != Circuit::Closed {
            return Err(Failure::Skipped);
        }
        invoke(invocation, generation, connection, wait).await
    }

    /// A connection to use now; `None` (and a connection attempt in the background,
    /// when one is due) while there is none.
    fn connection(self: &Arc<Self>) -> Option<(u64, MultiplexedConnection)> {
        if let Some(current) = self.connection.lock().clone() {
            return Some(current);
        }
        if Instant::now() >= *self.retry_at.lock()
            && let Ok(attempting) = Arc::clone(&self.attempting).try_lock_owned()
        {
            let inner = Arc::clone(self);
            tokio::spawn(async move {
                inner.attempt().await;
                drop(attempting);
            });
        }
        None
    }

    /// Connects unless a connection exists, waiting for an attempt under way.
    async fn connect(&self) -> bool {
        let _attempting = self.attempting.lock().await;
        self.attempt().await;
        self.connection.lock().is_some()
    }

    /// One connection attempt (the caller holds `attempting`), unless a connection
    /// exists.
    async fn attempt(&self) {
        if self.connection.lock().is_some() {
            return;
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.settings.timeout))
            .set_response_timeout(Some(self.settings.timeout));
        let connected = tokio::time::timeout(
            self.settings.timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await;
        let error = match connected {
            Ok(Ok(connection)) => {
                let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
                *self.connection.lock() = Some((generation, connection));
                *self.down_logged.lock() = false;
                tracing::info!(prefix = %self.settings.key_prefix, "the Redis affinity store is reachable: bindings are shared");
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "connecting timed out".into(),
        };
        self.errors.fetch_add(1, Ordering::Relaxed);
        *self.retry_at.lock() = Instant::now() + self.settings.reconnect_interval;
        self.log_down(&error);
    }

    /// Counts an operation answered locally, and what made it so: a command not sent
    /// is counted as skipped; a lost connection (a timeout too) is dropped (unless a
    /// newer one replaced it) and reconnected in the background.
    fn failed(&self, failure: Failure) {
        self.local_fallbacks.fetch_add(1, Ordering::Relaxed);
        match failure {
            Failure::Unavailable => {}
            Failure::Skipped => {
                self.skipped.fetch_add(1, Ordering::Relaxed);
            }
            Failure::TimedOut(generation) => self.lost(generation, "timed out"),
            Failure::Lost(generation, error) => self.lost(generation, &error),
            Failure::Invalid => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            Failure::Refused(error) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                let mut logged = self.refusal_logged.lock();
                if logged.is_none_or(|at| now.saturating_duration_since(at) >= REFUSAL_LOG_INTERVAL)
                {
                    *logged = Some(now);
                    tracing::warn!(%error, "the Redis affinity store refused a command: it was answered from local bindings");
                }
            }
        }
    }

    /// Counts a connection of `generation` failing, and drops it unless a newer one
    /// replaced it; it is reconnected in the background.
    fn lost(&self, generation: u64, error: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        {
            let mut connection = self.connection.lock();
            if connection
                .as_ref()
                .is_none_or(|(current, _)| *current != generation)
            {
                return;
            }
            *connection = None;
        }
        *self.retry_at.lock() = Instant::now() + self.settings.reconnect_interval;
        self.log_down(error);
    }

    fn log_down(&self, error: &str) {
        let mut logged = self.down_logged.lock();
        if !*logged {
            *logged = true;
            tracing::warn!(%error, "the Redis affinity store is unreachable: bindings are local until it answers");
        }
    }
}

/// Runs a script on `connection` (of `generation`) within `wait`; its engine id
/// (`None`: no binding).
async fn invoke(
    invocation: &redis::ScriptInvocation<'_>,
    generation: u64,
    mut connection: MultiplexedConnection,
    wait: Duration,
) -> Result<Option<EngineId>, Failure> {
    let answer = tokio::time::timeout(
        wait,
        invocation.invoke_async::<Option<Vec<u8>>>(&mut connection),
    )
    .await;
    let value = match answer {
        Ok(Ok(value)) => value,
        Ok(Err(e)) if e.is_timeout() => return Err(Failure::TimedOut(generation)),
        Ok(Err(e)) if lost(&e) => return Err(Failure::Lost(generation, e.to_string())),
        Ok(Err(e)) => return Err(Failure::Refused(e.to_string())),
        Err(_) => return Err(Failure::TimedOut(generation)),
    };
    let Some(value) = value else {
        return Ok(None);
    };
    let id = (value.len() <= MAX_NAME_BYTES)
        .then(|| String::from_utf8(value).ok())
        .flatten()
        .filter(|id| check_name(id).is_ok())
        .ok_or(Failure::Invalid)?;
    Ok(Some(EngineId::from(id)))
}

/// Whether an error means the connection is gone (rather than a command refused).
fn lost(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_unrecoverable_error()
}

impl AffinityStore for RedisAffinityStore {
    fn deadline(&self) -> Deadline {
        Deadline::at(Instant::now() + self.inner.settings.timeout)
    }

    fn get<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        deadline: Deadline,
    ) -> StoreFuture<'a, Option<EngineId>> {
        Box::pin(async move {
            let composed = self.inner.local.compose(scope, key)?;
            Ok(self.lookup(composed, deadline).await)
        })
    }

    fn peek<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        deadline: Deadline,
    ) -> StoreFuture<'a, Option<EngineId>> {
        Box::pin(async move {
            let composed = self.inner.local.compose(scope, key)?;
            Ok(self.peek_composed(&composed, deadline).await)
        })
    }

    fn bind_if_absent<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        engine: &'a EngineId,
        deadline: Deadline,
    ) -> StoreFuture<'a, EngineId> {
        Box::pin(async move {
            let composed = self.inner.local.compose(scope, key)?;
            Ok(self.bind(composed, engine, None, deadline).await)
        })
    }

    fn replace<'a>(
        &'a self,
        scope: AffinityScope<'a>,
        key: &'a str,
        expected: &'a EngineId,
        engine: &'a EngineId,
        deadline: Deadline,
    ) -> StoreFuture<'a, EngineId> {
        Box::pin(async move {
            let composed = self.inner.local.compose(scope, key)?;
            Ok(self.bind(composed, engine, Some(expected), deadline).await)
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
        Box::pin(self.inner.connect())
    }

    fn backend(&self) -> Option<BackendStatus> {
        Some(self.status())
    }
}

#[cfg(test)]
mod tests;
