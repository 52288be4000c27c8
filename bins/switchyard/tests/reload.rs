//! `switchyard serve --config FILE` reloads its file on SIGHUP and, with
//! `--watch-config`, when the file changes; a broken file is refused with the old
//! configuration still serving, a FIFO at its path blocks neither serving nor
//! shutdown, and a reload puts a rotated admin token in force.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Replica, TempFile};
use engine_sim::{RunningEngine, SimConfig};
use serde_json::{Value, json};

/// Upper bound on any wait; a healthy run needs a second at most.
const GUARD: Duration = Duration::from_secs(30);

fn config(engines: &[&RunningEngine]) -> String {
    let engines: Vec<_> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| json!({"id": format!("E{i}"), "url": e.url(), "role": "plain"}))
        .collect();
    json!({"listen": "127.0.0.1:0", "models": [{"id": "m", "engines": engines}]}).to_string()
}

/// Waits until the router has counted `n` reloads with `outcome`.
async fn reloads(client: &reqwest::Client, router: &Replica, outcome: &str, n: f64) {
    let name = format!("switchyard_config_reloads_total{{outcome=\"{outcome}\"}} ");
    let wait = async {
        while router.metric(client, &name).await < n {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(GUARD, wait)
        .await
        .unwrap_or_else(|_| panic!("no {outcome} reload counted"));
}

/// The engines that serve eight chats in a row (round robin).
async fn serving(client: &reqwest::Client, router: &Replica) -> BTreeSet<String> {
    let mut engines = BTreeSet::new();
    for _ in 0..8 {
        let response = client
            .post(router.url("/v1/chat/completions"))
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
            .send()
            .await
            .expect("the router answers");
        assert_eq!(response.status(), 200);
        engines.insert(
            response.headers()["x-switchyard-engine"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
        response.bytes().await.expect("the body");
    }
    engines
}

fn hangup(router: &Replica) {
    let pid = router.pid().expect("the router runs").to_string();
    let status = Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

fn write(file: &Path, text: &str) {
    // Written beside and renamed over, as a ConfigMap volume swaps its files.
    let next = file.with_extension("next");
    std::fs::write(&next, text).expect("written");
    std::fs::rename(&next, file).expect("renamed");
}

async fn engines() -> (RunningEngine, RunningEngine) {
    let start = || engine_sim::start(SimConfig::for_tests());
    (
        start().await.expect("an engine"),
        start().await.expect("an engine"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_file_and_a_broken_one_is_refused() {
    let (a, b) = engines().await;
    let file = TempFile::new(&config(&[&a]));
    let router = Replica::start(&file.0, &[]).await;
    let client = reqwest::Client::new();
    assert_eq!(
        serving(&client, &router).await,
        BTreeSet::from(["E0".to_owned()])
    );

    write(&file.0, &config(&[&a, &b]));
    hangup(&router);
    reloads(&client, &router, "applied", 1.0).await;
    assert_eq!(
        serving(&client, &router).await,
        BTreeSet::from(["E0".to_owned(), "E1".to_owned()]),
        "the engine the file added serves"
    );

    write(
        &file.0,
        "models: [{id: m, engines: [{id: E0, url: 'not a url'}]}]",
    );
    hangup(&router);
    reloads(&client, &router, "invalid", 1.0).await;
    write(&file.0, "models: [");
    hangup(&router);
    reloads(&client, &router, "invalid", 2.0).await;
    // A valid file over the 1 MiB bound is not read.
    let padded = format!("{}\n#{}\n", config(&[&a]), "-".repeat(1 << 20));
    write(&file.0, &padded);
    hangup(&router);
    reloads(&client, &router, "unreadable", 1.0).await;
    assert_eq!(
        serving(&client, &router).await,
        BTreeSet::from(["E0".to_owned(), "E1".to_owned()]),
        "the configuration in force keeps serving"
    );
    drop(router);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_config_reloads_a_changed_file() {
    let (a, b) = engines().await;
    let file = TempFile::new(&config(&[&a, &b]));
    let router = Replica::start(&file.0, &["--watch-config"]).await;
    let client = reqwest::Client::new();
    assert_eq!(serving(&client, &router).await.len(), 2);
    write(&file.0, &config(&[&b]));
    reloads(&client, &router, "applied", 1.0).await;
    // The file's E0 is now engine b: the old E0 and E1 leave, the new E0 joins.
    assert_eq!(
        serving(&client, &router).await,
        BTreeSet::from(["E0".to_owned()])
    );
    let visits = a.visits();
    serving(&client, &router).await;
    assert_eq!(
        a.visits(),
        visits,
        "the engine the file dropped gets nothing"
    );
    drop(router);
    a.shutdown().await;
    b.shutdown().await;
}

/// `config(engines)` with its admin token in the file `token`.
fn with_token_file(config: &str, token: &Path) -> String {
    let mut config: Value = serde_json::from_str(config).expect("a configuration");
    config["admin"] = json!({"token_file": token});
    config.to_string()
}

/// The status of `GET /workers` with `token`.
async fn workers_with(client: &reqwest::Client, router: &Replica, token: &str) -> u16 {
    client
        .get(router.url("/workers"))
        .bearer_auth(token)
        .send()
        .await
        .expect("the router answers")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_at_the_config_path_blocks_neither_serving_nor_shutdown() {
    let a = engine_sim::start(SimConfig::for_tests())
        .await
        .expect("an engine");
    let file = TempFile::new(&config(&[&a]));
    let mut router = Replica::start(&file.0, &["--watch-config"]).await;
    let client = reqwest::Client::builder()
        .timeout(GUARD)
        .build()
        .expect("a client");
    // The path becomes a FIFO that no one writes to.
    std::fs::remove_file(&file.0).expect("removed");
    let made = Command::new("mkfifo")
        .arg(&file.0)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    reloads(&client, &router, "unreadable", 1.0).await;
    hangup(&router);
    reloads(&client, &router, "unreadable", 2.0).await;
    let health = client
        .get(router.url("/health"))
        .send()
        .await
        .expect("/health answers");
    assert_eq!(health.status(), 200);
    assert_eq!(
        serving(&client, &router).await,
        BTreeSet::from(["E0".to_owned()]),
        "the configuration in force keeps serving"
    );
    let exited = router.terminate(GUARD).await;
    assert!(exited.success(), "{exited}");
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_puts_a_rotated_admin_token_in_force() {
    let (a, b) = engines().await;
    let token = TempFile::new("old-token\n");
    let file = TempFile::new(&with_token_file(&config(&[&a]), &token.0));
    let router = Replica::start(&file.0, &[]).await;
    let client = reqwest::Client::new();
    assert_eq!(workers_with(&client, &router, "old-token").await, 200);

    write(&token.0, "new-token\n");
    hangup(&router);
    reloads(&client, &router, "applied", 1.0).await;
    assert_eq!(
        (
            workers_with(&client, &router, "old-token").await,
            workers_with(&client, &router, "new-token").await
        ),
        (401, 200),
        "the rotated token replaces the old one"
    );

    write(&file.0, &with_token_file(&config(&[&a, &b]), &token.0));
    hangup(&router);
    reloads(&client, &router, "applied", 2.0).await;
    assert_eq!(
        serving(&client, &router).await,
        BTreeSet::from(["E0".to_owned(), "E1".to_owned()]),
        "later reloads apply"
    );
    drop(router);
    a.shutdown().await;
    b.shutdown().await;
}
