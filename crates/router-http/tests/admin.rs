//! The engine admin API: off without a token, authorized before anything is read,
//! bounded bodies, and an address of its own when configured.

use crate::common;

use std::io::ErrorKind;
use std::time::Duration;

use common::{config, engine, router, sim, url};
use router_config::{EngineRole, ModelConfig};
use router_http::RunningRouter;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn error_code(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("an OpenAI-shaped error");
    (
        status,
        body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

async fn one_engine_router(token: Option<&str>) -> (RunningRouter, engine_sim::RunningEngine) {
    let a = sim(|_| {}).await;
    let mut config = config(vec![ModelConfig::new(
        "m",
        vec![engine("A", &a, EngineRole::Plain)],
    )]);
    config.admin.token = token.map(Into::into);
    (router(config).await, a)
}

#[tokio::test]
async fn without_a_token_every_admin_request_is_refused_and_nothing_is_contacted() {
    let (router, _a) = one_engine_router(None).await;
    let client = reqwest::Client::new();
    // An engine address the router would introspect if it accepted the request.
    let bait = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    bait.set_nonblocking(true).unwrap();
    let bait_url = format!("http://{}", bait.local_addr().unwrap());
    let requests = [
        client.get(url(&router, "/workers")),
        client
            .post(url(&router, "/workers"))
            .json(&json!({"id": "B", "url": bait_url, "model": "m"})),
        client.delete(url(&router, "/workers/A")),
        client.get(url(&router, "/workers")).bearer_auth("anything"),
    ];
    for request in requests {
        let response = request.send().await.unwrap();
        assert_eq!(
            error_code(response).await,
            (403, "admin_disabled".to_owned())
        );
    }
    assert_eq!(
        bait.accept().map(|_| ()).unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "the router connected to nothing"
    );
    let engines: Vec<_> = router
        .context()
        .fleet()
        .snapshot()
        .engines()
        .map(|e| e.id().to_string())
        .collect();
    assert_eq!(engines, ["A"], "nothing was added or removed");
    router.shutdown().await;
}

#[tokio::test]
async fn the_token_is_checked_before_the_body_and_bodies_are_capped() {
    let (router, _a) = one_engine_router(Some("s3cret")).await;
    let client = reqwest::Client::new();
    let workers = || client.get(url(&router, "/workers"));
    let unauthorized = (401, "unauthorized".to_owned());
    assert_eq!(
        error_code(workers().send().await.unwrap()).await,
        unauthorized
    );
    assert_eq!(
        error_code(workers().bearer_auth("s3cre").send().await.unwrap()).await,
        unauthorized
    );
    let listed = workers()
        .header("authorization", "bearer s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200, "the scheme is matched in any case");
    let body: Value = listed.json().await.unwrap();
    assert_eq!(body["workers"][0]["id"], "A");

    // A request announcing a large body, with none of it sent: an unauthorized one is
    // answered at once, without waiting for the body.
    let mut socket = tokio::net::TcpStream::connect(router.addr()).await.unwrap();
    socket
        .write_all(
            b"POST /workers HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = vec![0_u8; 12];
    tokio::time::timeout(Duration::from_secs(20), socket.read_exact(&mut head))
        .await
        .expect("answered without the body")
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 401");

    let oversized =
        json!({"id": "B", "url": "http://127.0.0.1:1", "model": "m", "pad": "x".repeat(64 << 10)});
    let response = client
        .post(url(&router, "/workers"))
        .bearer_auth("s3cret")
        .json(&oversized)
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(response).await,
        (413, "body_too_large".to_owned())
    );
    router.shutdown().await;
}

#[tokio::test]
async fn admin_listen_serves_the_api_on_its_own_address_only() {
    let a = sim(|_| {}).await;
    let mut config = config(vec![ModelConfig::new(
        "m",
        vec![engine("A", &a, EngineRole::Plain)],
    )]);
    config.admin.token = Some("s3cret".into());
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    let router = router(config).await;
    let admin = router.admin_addr().expect("an admin address");
    assert_ne!(admin, router.addr());
    let client = reqwest::Client::new();
    let public = client
        .get(url(&router, "/workers"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(public.status(), 404, "not on the public address");
    let own = client
        .get(format!("http://{admin}/workers"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), 200);
    let chat = common::post(&router, &common::chat("m", "hi")).await;
    assert_eq!(chat.status(), 200, "the public API is unchanged");
    router.shutdown().await;
}

/// `DELETE /workers/{id}` with the token.
async fn delete(router: &RunningRouter, id: &str) -> reqwest::Response {
    reqwest::Client::new()
        .delete(url(router, &format!("/workers/{id}")))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
}

/// A router serving model `m` from engine `A` of its file, and engine `X` of model
/// `n` the admin API added.
async fn with_an_added_engine() -> (RunningRouter, [engine_sim::RunningEngine; 2]) {
    let (router, a) = one_engine_router(Some("s3cret")).await;
    let x = sim(|_| {}).await;
    let added = reqwest::Client::new()
        .post(url(&router, "/workers"))
        .bearer_auth("s3cret")
        .json(&json!({"id": "X", "url": x.url(), "model": "n", "role": "plain"}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    (router, [a, x])
}

#[tokio::test]
async fn the_admin_api_removes_only_the_engines_it_added() {
    let (router, _engines) = with_an_added_engine().await;
    let listed: Value = reqwest::Client::new()
        .get(url(&router, "/workers"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sources: Vec<(&str, &str)> = listed["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["id"].as_str().unwrap(), w["source"].as_str().unwrap()))
        .collect();
    assert_eq!(sources, [("A", "config"), ("X", "admin")]);
    let refused = delete(&router, "A").await;
    assert_eq!(
        error_code(refused).await,
        (409, "invalid_worker".to_owned())
    );
    assert!(router.context().fleet().snapshot().get("A").is_some());
    assert_eq!(delete(&router, "X").await.status(), 204);
    assert_eq!(delete(&router, "X").await.status(), 404);
    router.shutdown().await;
}

#[tokio::test]
async fn an_engines_pick_series_leave_the_metrics_with_it() {
    let (router, _engines) = with_an_added_engine().await;
    for model in ["m", "n"] {
        let chat = common::post(&router, &common::chat(model, "hi")).await;
        assert_eq!(chat.status(), 200);
    }
    let series = |metrics: &str, engine: &str| {
        let label = format!("engine=\"{engine}\"");
        metrics
            .lines()
            .filter(|l| l.starts_with("switchyard_picks_total") && l.contains(&label))
            .count()
    };
    let before = common::metrics(&router).await;
    assert_eq!((series(&before, "A"), series(&before, "X")), (1, 1));
    assert_eq!(delete(&router, "X").await.status(), 204);
    let after = common::metrics(&router).await;
    assert_eq!(
        (series(&after, "A"), series(&after, "X")),
        (1, 0),
        "{after}"
    );
    router.shutdown().await;
}
