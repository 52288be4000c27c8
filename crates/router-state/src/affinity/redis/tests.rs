//! The Redis store against a real `redis-server` of the test's own.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::affinity::AffinityKeyError;
use crate::affinity::BackendStatus;
use crate::affinity::Deadline;
use crate::engine::Role;
use crate::test_util::RedisServer;

const SCOPE: AffinityScope<'static> = AffinityScope {
    model: "m",
    bucket: "b",
    stage: Role::Plain,
};

/// Each call waits at most the store's timeout.
const NONE: Deadline = Deadline::NONE;

fn id(s: &str) -> EngineId {
    EngineId::from(s)
}

fn settings(server: &RedisServer) -> RedisSettings {
    RedisSettings {
        url: server.url(),
        key_prefix: "test:".into(),
        timeout: Duration::from_secs(5),
        cache_ttl: Duration::ZERO,
        reconnect_interval: Duration::ZERO,
    }
}

fn config() -> AffinityConfig {
    AffinityConfig {
        idle_timeout: Duration::from_secs(60),
        max_entries: 1024,
        max_key_bytes: 64,
    }
}

async fn replica(settings: RedisSettings) -> RedisAffinityStore {
    let store = RedisAffinityStore::new(config(), settings).expect("a redis URL");
    assert!(store.connect().await, "the server answers");
    store
}

async fn pttl(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(raw).await.unwrap()
}

async fn pexpire(raw: &mut redis::aio::MultiplexedConnection, key: &str, ms: u64) {
    let () = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(ms)
        .query_async(raw)
        .await
        .unwrap();
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("a raw connection")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_bindings_and_the_first_binding_wins() {
    let server = RedisServer::start();
    let (a, b) = (
        replica(settings(&server)).await,
        replica(settings(&server)).await,
    );
    assert_eq!(a.get(SCOPE, "s", NONE).await, Ok(None));
    assert_eq!(
        a.bind_if_absent(SCOPE, "s", &id("E1"), NONE).await,
        Ok(id("E1"))
    );
    assert_eq!(
        b.get(SCOPE, "s", NONE).await,
        Ok(Some(id("E1"))),
        "the other replica sees it"
    );
    assert_eq!(
        b.bind_if_absent(SCOPE, "s", &id("E2"), NONE).await,
        Ok(id("E1")),
        "the existing binding wins"
    );
    assert_eq!(
        b.replace(SCOPE, "s", &id("E2"), &id("E3"), NONE).await,
        Ok(id("E1")),
        "expected E2, found E1"
    );
    assert_eq!(
        b.replace(SCOPE, "s", &id("E1"), &id("E3"), NONE).await,
        Ok(id("E3"))
    );
    assert_eq!(a.get(SCOPE, "s", NONE).await, Ok(Some(id("E3"))));
    let prefill = AffinityScope {
        stage: Role::Prefill,
        ..SCOPE
    };
    assert_eq!(
        a.get(prefill, "s", NONE).await,
        Ok(None),
        "scopes are independent"
    );
    let value: Option<String> = redis::cmd("GET")
        .arg("test:m\0b\0plain\0s")
        .query_async(&mut raw(&server).await)
        .await
        .unwrap();
    assert_eq!(
        value.as_deref(),
        Some("E3"),
        "under the prefix and the scoped key"
    );
    assert_eq!(a.status().errors + b.status().errors, 0);
    assert!(a.status().reachable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_binds_from_several_replicas_agree() {
    let server = RedisServer::start();
    let replicas: Vec<Arc<RedisAffinityStore>> = vec![
        Arc::new(replica(settings(&server)).await),
        Arc::new(replica(settings(&server)).await),
        Arc::new(replica(settings(&server)).await),
    ];
    for round in 0..20 {
        let key = format!("session-{round}");
        let binds = (0..12).map(|i| {
            let (store, key) = (Arc::clone(&replicas[i % 3]), key.clone());
            tokio::spawn(async move {
                store
                    .bind_if_absent(SCOPE, &key, &id(&format!("E{i}")), NONE)
                    .await
                    .unwrap()
            })
        });
        let bound: Vec<EngineId> = futures_util::future::join_all(binds)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert!(
            bound.iter().all(|e| e == &bound[0]),
            "round {round}: {bound:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_use_refreshes_the_servers_ttl() {
    let server = RedisServer::start();
    let store = replica(settings(&server)).await;
    let mut raw = raw(&server).await;
    store
        .bind_if_absent(SCOPE, "s", &id("E1"), NONE)
        .await
        .unwrap();
    let key = "test:m\0b\0plain\0s";
    let ttl = pttl(&mut raw, key).await;
    assert!(
        (1..=60_000).contains(&ttl),
        "the idle timeout is the TTL: {ttl}"
    );
    pexpire(&mut raw, key, 5_000).await;
    assert_eq!(store.get(SCOPE, "s", NONE).await, Ok(Some(id("E1"))));
    let ttl = pttl(&mut raw, key).await;
    assert!(
        ttl > 5_000,
        "a lookup set it back to the idle timeout: {ttl}"
    );
    pexpire(&mut raw, key, 5_000).await;
    assert_eq!(
        store.bind_if_absent(SCOPE, "s", &id("E2"), NONE).await,
        Ok(id("E1"))
    );
    let ttl = pttl(&mut raw, key).await;
    assert!(ttl > 5_000, "so did a bind that kept it: {ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_refreshes_nothing_and_writes_nothing() {
    let server = RedisServer::start();
    let store = replica(settings(&server)).await;
    let mut raw = raw(&server).await;
    store
        .bind_if_absent(SCOPE, "s", &id("E1"), NONE)
        .await
        .unwrap();
    let key = "test:m\0b\0plain\0s";
    pexpire(&mut raw, key, 5_000).await;
    assert_eq!(store.peek(SCOPE, "s", NONE).await, Ok(Some(id("E1"))));
    let ttl = pttl(&mut raw, key).await;
    assert!(
        (1..=5_000).contains(&ttl),
        "a peek left the TTL as it was: {ttl}"
    );
    let () = redis::cmd("SET")
        .arg(key)
        .arg("not an engine id {}")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(store.peek(SCOPE, "s", NONE).await, Ok(None));
    let value: String = redis::cmd("GET")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(value, "not an engine id {}", "a peek writes nothing");
    assert_eq!(store.peek(SCOPE, "unbound", NONE).await, Ok(None));
    assert_eq!(store.status().errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_cache_answers_within_its_ttl_and_sees_a_rebinding_after() {
    let server = RedisServer::start();
    let cached = replica(RedisSettings {
        cache_ttl: Duration::from_secs(3600),
        ..settings(&server)
    })
    .await;
    let other = replica(settings(&server)).await;
    cached
        .bind_if_absent(SCOPE, "s", &id("E1"), NONE)
        .await
        .unwrap();
    other
        .replace(SCOPE, "s", &id("E1"), &id("E2"), NONE)
        .await
        .unwrap();
    assert_eq!(
        cached.get(SCOPE, "s", NONE).await,
        Ok(Some(id("E1"))),
        "within the cache TTL the cached binding answers"
    );
    assert_eq!(cached.len(), 1);
    let uncached = replica(settings(&server)).await;
    assert_eq!(uncached.get(SCOPE, "s", NONE).await, Ok(Some(id("E2"))));
    assert_eq!(
        cached.remove_engine(&id("E1")),
        1,
        "a removed engine leaves the cache"
    );
    assert_eq!(cached.get(SCOPE, "s", NONE).await, Ok(Some(id("E2"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_means_local_bindings_then_shared_ones_again() {
    let mut server = RedisServer::start();
    let store = replica(settings(&server)).await;
    server.stop();
    assert_eq!(
        store.bind_if_absent(SCOPE, "outage", &id("E1"), NONE).await,
        Ok(id("E1")),
        "bound locally, not failed"
    );
    assert_eq!(store.get(SCOPE, "outage", NONE).await, Ok(Some(id("E1"))));
    assert_eq!(
        store.bind_if_absent(SCOPE, "outage", &id("E2"), NONE).await,
        Ok(id("E1")),
        "local bindings keep the first-binding rule"
    );
    let status = store.status();
    assert!(!status.reachable);
    assert!(status.errors >= 1, "{status:?}");
    assert!(status.local_fallbacks >= 3, "{status:?}");

    server.restart();
    assert!(store.connect().await, "the server answers again");
    assert!(store.status().reachable);
    assert_eq!(
        store.get(SCOPE, "outage", NONE).await,
        Ok(Some(id("E1"))),
        "the outage's binding is kept"
    );
    let other = replica(settings(&server)).await;
    assert_eq!(
        other.get(SCOPE, "outage", NONE).await,
        Ok(Some(id("E1"))),
        "and shared once the server is back"
    );
    let ttl = pttl(&mut raw(&server).await, "test:m\0b\0plain\0outage").await;
    assert!((1..=60_000).contains(&ttl), "written back to expire: {ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_the_store_writes_expires() {
    let server = RedisServer::start();
    let store = replica(settings(&server)).await;
    let mut raw = raw(&server).await;
    let () = redis::cmd("SET")
        .arg("test:m\0b\0plain\0foreign")
        .arg("no engine id, no TTL")
        .query_async(&mut raw)
        .await
        .unwrap();
    store
        .bind_if_absent(SCOPE, "foreign", &id("E1"), NONE)
        .await
        .unwrap();
    store
        .bind_if_absent(SCOPE, "new", &id("E1"), NONE)
        .await
        .unwrap();
    store
        .replace(SCOPE, "new", &id("E1"), &id("E2"), NONE)
        .await
        .unwrap();
    store
        .replace(SCOPE, "unbound", &id("E1"), &id("E3"), NONE)
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(keys.len(), 3, "{keys:?}");
    for key in keys {
        let ttl = pttl(&mut raw, &key).await;
        assert!(
            (1..=60_000).contains(&ttl),
            "{key:?}: the idle timeout is its TTL: {ttl}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_from_the_start_serves_local_bindings() {
    let mut server = RedisServer::start();
    let settings = settings(&server);
    server.stop();
    let store = RedisAffinityStore::new(config(), settings).unwrap();
    assert!(!store.connect().await);
    assert_eq!(
        store.bind_if_absent(SCOPE, "s", &id("E1"), NONE).await,
        Ok(id("E1"))
    );
    assert_eq!(store.get(SCOPE, "s", NONE).await, Ok(Some(id("E1"))));
    assert!(!store.status().reachable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_is_no_engine_id_is_no_binding_and_is_overwritten() {
    let server = RedisServer::start();
    let store = replica(settings(&server)).await;
    let mut raw = raw(&server).await;
    for (key, value) in [
        ("binary", vec![0xff, 0xfe, 0x00]),
        ("long", vec![b'x'; 1 << 20]),
        ("spaces", b"an engine".to_vec()),
        ("comma", b"a,b".to_vec()),
    ] {
        let redis_key = format!("test:m\0b\0plain\0{key}");
        let () = redis::cmd("SET")
            .arg(&redis_key)
            .arg(value)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(store.get(SCOPE, key, NONE).await, Ok(None), "{key}");
        assert_eq!(
            store.bind_if_absent(SCOPE, key, &id("E1"), NONE).await,
            Ok(id("E1")),
            "{key}"
        );
        let value: String = redis::cmd("GET")
            .arg(&redis_key)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(value, "E1", "{key}: the server's value was replaced");
    }
    let () = redis::cmd("RPUSH")
        .arg("test:m\0b\0plain\0list")
        .arg("E9")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        store.get(SCOPE, "list", NONE).await,
        Ok(None),
        "another type is no binding"
    );
    assert_eq!(
        store.bind_if_absent(SCOPE, "list", &id("E1"), NONE).await,
        Ok(id("E1"))
    );
    assert_eq!(
        store.status(),
        BackendStatus {
            reachable: true,
            errors: 0,
            local_fallbacks: 0,
            skipped: 0,
        },
        "all of it on the server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_the_server_refuses_is_answered_locally_and_keeps_the_connection() {
    let server = RedisServer::start();
    let store = replica(settings(&server)).await;
    let mut raw = raw(&server).await;
    // Full and refusing writes: SET fails with OOM inside the script.
    for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    assert_eq!(
        store.bind_if_absent(SCOPE, "s", &id("E1"), NONE).await,
        Ok(id("E1"))
    );
    assert_eq!(
        store.get(SCOPE, "s", NONE).await,
        Ok(Some(id("E1"))),
        "bound locally"
    );
    let status = store.status();
    assert!(status.reachable, "the connection stays: {status:?}");
    assert!(
        status.errors >= 1 && status.local_fallbacks >= 1,
        "{status:?}"
    );
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query_async(&mut raw)
        .await
        .unwrap();
    let other = replica(settings(&server)).await;
    assert_eq!(
        other.bind_if_absent(SCOPE, "t", &id("E2"), NONE).await,
        Ok(id("E2"))
    );
    assert_eq!(
        store.get(SCOPE, "t", NONE).await,
        Ok(Some(id("E2"))),
        "the same connection serves shared bindings again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_checked_before_the_server_is_asked() {
    let server = RedisServer::start();
    let store = replica(settings(&server)).await;
    assert_eq!(
        store.get(SCOPE, "", NONE).await,
        Err(AffinityKeyError::Empty)
    );
    assert_eq!(
        store
            .bind_if_absent(SCOPE, &"k".repeat(65), &id("E1"), NONE)
            .await,
        Err(AffinityKeyError::TooLong { len: 65, max: 64 })
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw(&server).await)
        .await
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}

/// The command timeout of the tests of a server that stops answering.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Their backoff after a timeout.
const BACKOFF: Duration = Duration::from_secs(10);

/// `wait` as a paused clock shows it: tokio's timers fire on whole milliseconds.
fn about(wait: Duration) -> std::ops::RangeInclusive<Duration> {
    wait..=wait + Duration::from_millis(1)
}

/// Settings with [`TIMEOUT`] and [`BACKOFF`].
fn unanswered_settings(server: &RedisServer) -> RedisSettings {
    RedisSettings {
        timeout: TIMEOUT,
        reconnect_interval: BACKOFF,
        ..settings(server)
    }
}

/// Pauses `server`'s clients (for ten minutes, longer than any test): `ALL` holds
/// every command; `WRITE` holds scripts and still answers a connection's handshake,
/// on every server version.
async fn pause_clients(server: &RedisServer, mode: &str) {
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(600_000)
        .arg(mode)
        .query_async(&mut raw(server).await)
        .await
        .unwrap();
}

/// A pick's store calls: a lookup of `key` and, when unbound, a bind to E1, within
/// one deadline; how long they took.
async fn pick(store: &RedisAffinityStore, key: &str) -> Duration {
    let start = Instant::now();
    let deadline = store.deadline();
    if store.get(SCOPE, key, deadline).await.unwrap().is_none() {
        let bound = store.bind_if_absent(SCOPE, key, &id("E1"), deadline).await;
        assert_eq!(bound, Ok(id("E1")), "{key}");
    }
    start.elapsed()
}

#[tokio::test]
async fn the_calls_of_one_pick_share_its_deadline() {
    let server = RedisServer::start();
    let store = replica(unanswered_settings(&server)).await;
    pause_clients(&server, "ALL").await;
    tokio::time::pause();
    let deadline = store.deadline();
    // The pick's earlier work took most of it.
    tokio::time::advance(TIMEOUT * 3 / 4).await;
    let start = Instant::now();
    assert_eq!(store.get(SCOPE, "s", deadline).await, Ok(None));
    let waited = start.elapsed();
    assert!(
        about(TIMEOUT / 4).contains(&waited),
        "the lookup waited the time left: {waited:?}"
    );
    assert_eq!(
        store.bind_if_absent(SCOPE, "s", &id("E1"), deadline).await,
        Ok(id("E1")),
        "bound locally"
    );
    assert_eq!(start.elapsed(), waited, "the bind did not wait");
    let status = store.status();
    assert_eq!(
        (status.errors, status.skipped),
        (0, 2),
        "the lookup the pick's deadline cut short is no failure of the server's (the circuit stays closed): {status:?}"
    );
}

#[tokio::test]
async fn a_server_that_stops_answering_costs_the_timeout_once_a_backoff() {
    let server = RedisServer::start();
    let store = replica(unanswered_settings(&server)).await;
    pause_clients(&server, "WRITE").await;
    tokio::time::pause();
    let waited = pick(&store, "first").await;
    assert!(
        about(TIMEOUT).contains(&waited),
        "the lookup timed out, the bind was not sent: {waited:?}"
    );
    let errors = store.status().errors;

    // A server paused for writes takes a new connection.
    tokio::time::resume();
    assert!(store.connect().await, "the handshake is answered");
    tokio::time::pause();
    assert_eq!(
        pick(&store, "within the backoff").await,
        Duration::ZERO,
        "no command was sent"
    );
    let status = store.status();
    assert_eq!(status.skipped, 2, "{status:?}");
    assert_eq!(status.errors, errors, "nothing timed out: {status:?}");

    // Past the backoff one pick tries the server while the others bind locally.
    tokio::time::advance(BACKOFF).await;
    let (a, b) = tokio::join!(pick(&store, "trial a"), pick(&store, "trial b"));
    let (skipped, tried) = (a.min(b), a.max(b));
    assert_eq!(skipped, Duration::ZERO, "one trial at a time");
    assert!(about(TIMEOUT).contains(&tried), "{tried:?}");

    // Once the server answers a trial, bindings are shared again.
    tokio::time::resume();
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut raw(&server).await)
        .await
        .unwrap();
    assert!(store.connect().await);
    tokio::time::pause();
    tokio::time::advance(BACKOFF).await;
    tokio::time::resume();
    pick(&store, "after").await;
    pick(&store, "shared").await;
    let other = replica(settings(&server)).await;
    for key in ["after", "shared"] {
        assert_eq!(
            other.get(SCOPE, key, NONE).await,
            Ok(Some(id("E1"))),
            "{key} is in the server"
        );
    }
}

#[test]
fn only_redis_urls_are_accepted_and_the_url_is_never_printed() {
    let settings = |url: &str| RedisSettings {
        url: url.into(),
        key_prefix: "p:".into(),
        timeout: Duration::from_secs(1),
        cache_ttl: Duration::ZERO,
        reconnect_interval: Duration::ZERO,
    };
    assert!(RedisAffinityStore::new(config(), settings("http://127.0.0.1:6379")).is_err());
    assert!(RedisAffinityStore::new(config(), settings("redis://")).is_err());
    let store =
        RedisAffinityStore::new(config(), settings("redis://user:secret@127.0.0.1:1/0")).unwrap();
    assert!(!format!("{store:?}").contains("secret"));
}
