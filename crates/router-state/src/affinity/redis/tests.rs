//! The Redis store against a real `redis-server` of the test's own.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::affinity::AffinityKeyError;
use crate::affinity::BackendStatus;
use crate::engine::Role;
use crate::test_util::RedisServer;

const SCOPE: AffinityScope<'static> = AffinityScope {
    model: "m",
    bucket: "b",
    stage: Role::Plain,
};

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
    assert_eq!(a.get(SCOPE, "s").await, Ok(None));
    assert_eq!(a.bind_if_absent(SCOPE, "s", &id("E1")).await, Ok(id("E1")));
    assert_eq!(
        b.get(SCOPE, "s").await,
        Ok(Some(id("E1"))),
        "the other replica sees it"
    );
    assert_eq!(
        b.bind_if_absent(SCOPE, "s", &id("E2")).await,
        Ok(id("E1")),
        "the existing binding wins"
    );
    assert_eq!(
        b.replace(SCOPE, "s", &id("E2"), &id("E3")).await,
        Ok(id("E1")),
        "expected E2, found E1"
    );
    assert_eq!(
        b.replace(SCOPE, "s", &id("E1"), &id("E3")).await,
        Ok(id("E3"))
    );
    assert_eq!(a.get(SCOPE, "s").await, Ok(Some(id("E3"))));
    let prefill = AffinityScope {
        stage: Role::Prefill,
        ..SCOPE
    };
    assert_eq!(
        a.get(prefill, "s").await,
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
                    .bind_if_absent(SCOPE, &key, &id(&format!("E{i}")))
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
    store.bind_if_absent(SCOPE, "s", &id("E1")).await.unwrap();
    let key = "test:m\0b\0plain\0s";
    let ttl = pttl(&mut raw, key).await;
    assert!(
        (1..=60_000).contains(&ttl),
        "the idle timeout is the TTL: {ttl}"
    );
    pexpire(&mut raw, key, 5_000).await;
    assert_eq!(store.get(SCOPE, "s").await, Ok(Some(id("E1"))));
    let ttl = pttl(&mut raw, key).await;
    assert!(
        ttl > 5_000,
        "a lookup set it back to the idle timeout: {ttl}"
    );
    pexpire(&mut raw, key, 5_000).await;
    assert_eq!(
        store.bind_if_absent(SCOPE, "s", &id("E2")).await,
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
    store.bind_if_absent(SCOPE, "s", &id("E1")).await.unwrap();
    let key = "test:m\0b\0plain\0s";
    pexpire(&mut raw, key, 5_000).await;
    assert_eq!(store.peek(SCOPE, "s").await, Ok(Some(id("E1"))));
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
    assert_eq!(store.peek(SCOPE, "s").await, Ok(None));
    let value: String = redis::cmd("GET")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(value, "not an engine id {}", "a peek writes nothing");
    assert_eq!(store.peek(SCOPE, "unbound").await, Ok(None));
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
    cached.bind_if_absent(SCOPE, "s", &id("E1")).await.unwrap();
    other
        .replace(SCOPE, "s", &id("E1"), &id("E2"))
        .await
        .unwrap();
    assert_eq!(
        cached.get(SCOPE, "s").await,
        Ok(Some(id("E1"))),
        "within the cache TTL the cached binding answers"
    );
    assert_eq!(cached.len(), 1);
    let uncached = replica(settings(&server)).await;
    assert_eq!(uncached.get(SCOPE, "s").await, Ok(Some(id("E2"))));
    assert_eq!(
        cached.remove_engine(&id("E1")),
        1,
        "a removed engine leaves the cache"
    );
    assert_eq!(cached.get(SCOPE, "s").await, Ok(Some(id("E2"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_means_local_bindings_then_shared_ones_again() {
    let mut server = RedisServer::start();
    let store = replica(settings(&server)).await;
    server.stop();
    assert_eq!(
        store.bind_if_absent(SCOPE, "outage", &id("E1")).await,
        Ok(id("E1")),
        "bound locally, not failed"
    );
    assert_eq!(store.get(SCOPE, "outage").await, Ok(Some(id("E1"))));
    assert_eq!(
        store.bind_if_absent(SCOPE, "outage", &id("E2")).await,
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
        store.get(SCOPE, "outage").await,
        Ok(Some(id("E1"))),
        "the outage's binding is kept"
    );
    let other = replica(settings(&server)).await;
    assert_eq!(
        other.get(SCOPE, "outage").await,
        Ok(Some(id("E1"))),
        "and shared once the server is back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_from_the_start_serves_local_bindings() {
    let mut server = RedisServer::start();
    let settings = settings(&server);
    server.stop();
    let store = RedisAffinityStore::new(config(), settings).unwrap();
    assert!(!store.connect().await);
    assert_eq!(
        store.bind_if_absent(SCOPE, "s", &id("E1")).await,
        Ok(id("E1"))
    );
    assert_eq!(store.get(SCOPE, "s").await, Ok(Some(id("E1"))));
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
        assert_eq!(store.get(SCOPE, key).await, Ok(None), "{key}");
        assert_eq!(
            store.bind_if_absent(SCOPE, key, &id("E1")).await,
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
        store.get(SCOPE, "list").await,
        Ok(None),
        "another type is no binding"
    );
    assert_eq!(
        store.bind_if_absent(SCOPE, "list", &id("E1")).await,
        Ok(id("E1"))
    );
    assert_eq!(
        store.status(),
        BackendStatus {
            reachable: true,
            errors: 0,
            local_fallbacks: 0
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
        store.bind_if_absent(SCOPE, "s", &id("E1")).await,
        Ok(id("E1"))
    );
    assert_eq!(
        store.get(SCOPE, "s").await,
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
        other.bind_if_absent(SCOPE, "t", &id("E2")).await,
        Ok(id("E2"))
    );
    assert_eq!(
        store.get(SCOPE, "t").await,
        Ok(Some(id("E2"))),
        "the same connection serves shared bindings again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_checked_before_the_server_is_asked() {
    let server = RedisServer::start();
    let store = replica(settings(&server)).await;
    assert_eq!(store.get(SCOPE, "").await, Err(AffinityKeyError::Empty));
    assert_eq!(
        store
            .bind_if_absent(SCOPE, &"k".repeat(65), &id("E1"))
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
