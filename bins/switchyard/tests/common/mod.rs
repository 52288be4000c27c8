//! Router processes and configuration files for the binary's tests.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;

/// A `switchyard serve` (or `indexer`) process, killed by its pid when dropped.
pub(crate) struct Replica {
    child: Option<Child>,
    pub(crate) addr: SocketAddr,
}

impl Replica {
    /// Starts a router on `config` (with `extra` flags) and waits for its ready line.
    pub(crate) async fn start(config: &std::path::Path, extra: &[&str]) -> Self {
        Self::run("serve", config, extra).await
    }

    /// Starts `switchyard indexer` on `config` (with `extra` flags) on a free
    /// loopback port and waits for its ready line.
    pub(crate) async fn indexer(config: &std::path::Path, extra: &[&str]) -> Self {
        let mut flags = vec!["--listen", "127.0.0.1:0"];
        flags.extend(extra);
        Self::run("indexer", config, &flags).await
    }

    async fn run(command: &str, config: &std::path::Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args([command, "--config"])
            .arg(config)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the process starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        })
        .await
        .expect("the reader runs")
        .expect("the router prints its ready line");
        let ready: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("a ready line, not {line:?}: {e}"));
        let addr = ready["addr"]
            .as_str()
            .expect("the address")
            .parse()
            .unwrap();
        Self {
            child: Some(child),
            addr,
        }
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("the router is killed");
            child.wait().expect("and reaped");
        }
    }

    /// Sends SIGTERM and waits for the process to exit, at most `guard` (then it is
    /// killed and the test fails); its exit status.
    pub(crate) async fn terminate(&mut self, guard: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("the router runs");
        let pid = child.id().to_string();
        let signal = |name: &str| {
            let sent = Command::new("kill")
                .args([name, &pid])
                .status()
                .expect("kill runs");
            assert!(sent.success(), "kill {name} {pid}");
        };
        signal("-TERM");
        let mut exited = tokio::task::spawn_blocking(move || child.wait());
        match tokio::time::timeout(guard, &mut exited).await {
            Ok(status) => status
                .expect("the waiter runs")
                .expect("the router is reaped"),
            Err(_) => {
                signal("-KILL");
                drop(exited.await);
                panic!("the router did not exit within {guard:?} of SIGTERM");
            }
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The router's `/metrics` text.
    pub(crate) async fn scrape(&self, client: &reqwest::Client) -> String {
        client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("a body")
    }

    pub(crate) async fn metric(&self, client: &reqwest::Client, name: &str) -> f64 {
        let text = self.scrape(client).await;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

impl Replica {
    /// The pid of the process, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The sum of the `switchyard_picks_total` samples whose labels contain `labels`.
    pub(crate) async fn sum(&self, client: &reqwest::Client, labels: &str) -> f64 {
        let text = self.scrape(client).await;
        text.lines()
            .filter(|l| l.starts_with("switchyard_picks_total{") && l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A file in the temporary directory, removed when dropped.
pub(crate) struct TempFile(pub(crate) PathBuf);

impl TempFile {
    pub(crate) fn new(text: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "switchyard-replicas-{}-{}.yaml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, text).expect("the config is written");
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `engines` as a configuration's plain members `E0`, `E1`, ... in order.
pub(crate) fn plain_members(engines: &[engine_sim::RunningEngine]) -> Vec<Value> {
    engines
        .iter()
        .enumerate()
        .map(|(i, e)| serde_json::json!({"id": format!("E{i}"), "url": e.url(), "role": "plain"}))
        .collect()
}
