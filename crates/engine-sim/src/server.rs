//! Starting and stopping a simulated engine: its sockets, tasks and HTTP routes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use zeromq::{PubSocket, RouterSocket};

use crate::bootstrap::{self, Rooms};
use crate::chat::{chat_completions, completions, error_response, generate};
use crate::config::{EngineRole, PdProtocol, SimConfig};
use crate::engine::{EngineSpec, SimEngine};
use crate::faults::{FaultConfig, Faults};
use crate::publish::{
    BindError, KvPublisherSettings, LOAD_TOPIC, bind, run_kv_publisher, run_load_publisher,
};
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::visits::{VisitLog, Visits};

/// Why an engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A flag combination is invalid.
    #[error("{0}")]
    Config(String),
    /// The tokenizer could not be loaded.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A ZeroMQ socket could not be bound.
    #[error(transparent)]
    Zmq(#[from] BindError),
    /// A TCP listener could not be bound.
    #[error("binding {what} on {addr}: {source}")]
    Listen {
        /// Which listener.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// The ports an engine bound, as `/server_info` advertises them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BoundPorts {
    /// The HTTP address.
    pub http: SocketAddr,
    /// KV-event PUB port per rank.
    pub kv: Vec<u16>,
    /// Replay ROUTER port per rank.
    pub replay: Vec<u16>,
    /// Load-feed PUB port per rank.
    pub load: Vec<u16>,
    /// The prefill engine's bootstrap port.
    pub bootstrap: Option<u16>,
    /// The admin-only HTTP address.
    pub admin: Option<SocketAddr>,
}

/// What the HTTP handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) config: SimConfig,
    pub(crate) engine: Arc<SimEngine>,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) rooms: Option<Arc<Rooms>>,
    pub(crate) client: reqwest::Client,
    ports: BoundPorts,
    ids: AtomicU64,
    /// The routing-relevant fields of recent chat requests, newest last.
    recent: parking_lot::Mutex<std::collections::VecDeque<Value>>,
    pub(crate) visits: Arc<VisitLog>,
}

/// How many recent requests `GET /admin/requests` keeps.
const RECENT_REQUESTS: usize = 256;

impl AppState {
    pub(crate) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// The bound ports.
    pub(crate) fn ports(&self) -> &BoundPorts {
        &self.ports
    }

    /// The engine's id in vLLM's transfer params (one per HTTP port).
    pub(crate) fn engine_id(&self) -> String {
        format!("sim-{}", self.ports.http.port())
    }

    /// Remembers a chat request's routing-relevant fields for `GET /admin/requests`.
    pub(crate) fn remember(&self, request: Value) {
        let mut recent = self.recent.lock();
        if recent.len() == RECENT_REQUESTS {
            recent.pop_front();
        }
        recent.push_back(request);
    }
}

/// A running simulated engine. Dropping it without [`shutdown`](Self::shutdown) also
/// stops every task.
#[derive(Debug)]
pub struct RunningEngine {
    ports: BoundPorts,
    engine: Arc<SimEngine>,
    visits: Arc<VisitLog>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl RunningEngine {
    /// The bound ports.
    pub fn ports(&self) -> &BoundPorts {
        &self.ports
    }

    /// The engine model behind the HTTP surface.
    pub fn engine(&self) -> &Arc<SimEngine> {
        &self.engine
    }

    /// The chat requests so far, by how they ended.
    pub fn visits(&self) -> Visits {
        self.visits.current()
    }

    /// Waits until the chat-request counts satisfy `ok`, and returns them.
    pub async fn visits_until(&self, ok: impl Fn(&Visits) -> bool) -> Visits {
        self.visits.until(ok).await
    }

    /// The base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.ports.http)
    }

    /// Stops accepting, closes every socket and waits for the tasks to end.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Binds every socket of `config` and starts serving.
///
/// # Errors
/// See [`StartError`].
pub async fn start(config: SimConfig) -> Result<RunningEngine, StartError> {
    config.validate().map_err(StartError::Config)?;
    let tokenizer = match &config.tokenizer {
        Some(path) => Tokenizer::load(path)?,
        None => Tokenizer::BuiltIn,
    };
    let (stop, _) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let faults = Arc::new(Faults::new(config.faults.clone(), config.seed));
    let host = config.host;
    let ranks = config.dp_size;
    let mut kv_sockets = Vec::new();
    let mut ports = BoundPorts {
        http: SocketAddr::new(host, config.port),
        kv: Vec::new(),
        replay: Vec::new(),
        load: Vec::new(),
        bootstrap: None,
        admin: None,
    };
    for rank in 0..ranks {
        if let Some(base) = config.kv_port {
            let (socket, port) =
                bind::<PubSocket>("KV-event PUB", host, offset(base, rank)).await?;
            ports.kv.push(port);
            let replay = match config.replay_port {
                Some(base) => {
                    let (socket, port) =
                        bind::<RouterSocket>("replay ROUTER", host, offset(base, rank)).await?;
                    ports.replay.push(port);
                    Some(socket)
                }
                None => None,
            };
            kv_sockets.push((socket, replay));
        }
    }
    let mut publishers = Vec::new();
    let mut receivers = Vec::new();
    for _ in &kv_sockets {
        let (tx, rx) = mpsc::unbounded_channel();
        publishers.push(tx);
        receivers.push(rx);
    }
    let spec = EngineSpec {
        max_running_requests: config.max_running_requests,
        prefill_tokens_per_sec: config.prefill_tokens_per_sec,
        decode_tokens_per_sec: config.decode_tokens_per_sec,
        kv_capacity_tokens: config.kv_capacity_tokens,
        page_size: config.page_size,
        dp_size: ranks,
        serial_prefill: config.serial_prefill,
    };
    let engine = Arc::new(SimEngine::build(spec, Arc::clone(&faults), publishers));
    let settings = KvPublisherSettings {
        topic: Bytes::from(config.kv_topic.clone().into_bytes()),
        form: config.kv_event_form,
        replay_capacity: config.replay_buffer,
    };
    for (rank, ((live, replay), rx)) in kv_sockets.into_iter().zip(receivers).enumerate() {
        let task = run_kv_publisher(
            live,
            replay,
            rx,
            rank as u32,
            settings.clone(),
            Arc::clone(&faults),
            stop.subscribe(),
        );
        tasks.spawn(task);
    }
    if let Some(base) = config.load_port {
        for rank in engine.ranks() {
            let (socket, port) =
                bind::<PubSocket>("load PUB", host, offset(base, rank.index())).await?;
            ports.load.push(port);
            tasks.spawn(run_load_publisher(
                socket,
                Arc::downgrade(rank),
                config.load_form,
                stop.subscribe(),
            ));
        }
    }
    let rooms = (config.role == EngineRole::Prefill).then(|| Arc::new(Rooms::default()));
    if let (Some(rooms), Some(port)) = (&rooms, config.bootstrap_port) {
        let listener = listen("bootstrap server", SocketAddr::new(host, port)).await?;
        ports.bootstrap = Some(local_port(&listener));
        let addr = SocketAddr::new(host, local_port(&listener));
        tasks.spawn(serve_http(
            listener,
            addr,
            bootstrap::router(Arc::clone(rooms)),
            None,
            stop.subscribe(),
        ));
    }
    let listener = listen("HTTP", ports.http).await?;
    ports.http = listener.local_addr().map_err(|source| StartError::Listen {
        what: "HTTP",
        addr: ports.http,
        source,
    })?;
    let admin_listener = match config.admin_port {
        Some(port) => {
            let listener = listen("admin HTTP", SocketAddr::new(host, port)).await?;
            ports.admin = Some(SocketAddr::new(host, local_port(&listener)));
            Some(listener)
        }
        None => None,
    };
    let visits = Arc::new(VisitLog::default());
    let state = Arc::new(AppState {
        config,
        engine: Arc::clone(&engine),
        tokenizer,
        rooms,
        client: reqwest::Client::new(),
        ports: ports.clone(),
        ids: AtomicU64::new(0),
        recent: parking_lot::Mutex::default(),
        visits: Arc::clone(&visits),
    });
    if let (Some(listener), Some(addr)) = (admin_listener, ports.admin) {
        tasks.spawn(serve_http(
            listener,
            addr,
            admin_routes().with_state(Arc::clone(&state)),
            None,
            stop.subscribe(),
        ));
    }
    tasks.spawn(serve_http(
        listener,
        ports.http,
        routes(state),
        Some(faults.refusing()),
        stop.subscribe(),
    ));
    Ok(RunningEngine {
        ports,
        engine,
        visits,
        stop,
        tasks,
    })
}

fn offset(base: u16, rank: u32) -> u16 {
    base.saturating_add(rank as u16)
}

async fn listen(what: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen { what, addr, source })
}

fn local_port(listener: &TcpListener) -> u16 {
    listener.local_addr().map_or(0, |a| a.port())
}

/// Accepts HTTP connections until stopped, then drops every open connection. While
/// `refusing` is on, the listener is closed so connections are refused, then bound
/// again.
async fn serve_http(
    listener: TcpListener,
    addr: SocketAddr,
    app: axum::Router,
    mut refusing: Option<watch::Receiver<bool>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut listener = Some(listener);
    let mut connections = JoinSet::new();
    loop {
        if refusing.as_mut().is_some_and(|r| *r.borrow_and_update()) {
            listener = None;
        } else if listener.is_none() {
            match TcpListener::bind(addr).await {
                Ok(l) => listener = Some(l),
                Err(e) => tracing::warn!(error = %e, %addr, "re-binding the HTTP listener failed"),
            }
        }
        tokio::select! {
            accepted = accept(listener.as_ref()) => match accepted {
                Ok((stream, _)) => {
                    drop(stream.set_nodelay(true));
                    let service = TowerToHyperService::new(app.clone());
                    connections.spawn(async move {
                        let connection = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service);
                        drop(connection.await);
                    });
                }
                Err(e) => tracing::warn!(error = %e, "accept failed"),
            },
            _ = refusal_changed(&mut refusing) => {}
            _ = stop.wait_for(|s| *s) => return,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn refusal_changed(refusing: &mut Option<watch::Receiver<bool>>) {
    let changed = match refusing {
        Some(r) => r.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await;
    }
}

async fn accept(
    listener: Option<&TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

fn routes(state: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/generate", post(generate))
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .route("/health", get(health))
        .route("/server_info", get(server_info))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/flush_cache", get(flush_cache).post(flush_cache))
        .merge(admin_routes())
        .with_state(state)
}

fn admin_routes() -> axum::Router<Arc<AppState>> {
    axum::Router::new()
        .route("/admin/faults", get(get_faults).post(set_faults))
        .route("/admin/restart_publisher", post(restart_publisher))
        .route("/admin/requests", get(recent_requests))
}

async fn health(State(app): State<Arc<AppState>>) -> StatusCode {
    if app.engine.faults().current().fail_health {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn server_info(State(app): State<Arc<AppState>>) -> Response {
    if app.config.pd_protocol == PdProtocol::Vllm {
        return error_response(StatusCode::NOT_FOUND, "vLLM serves no /server_info");
    }
    let c = &app.config;
    let p = &app.ports;
    let kv_events = p.kv.first().map(|&base| {
        let mut block = json!({
            "publisher": "zmq",
            "endpoint_host": c.host.to_string(),
            "endpoint_port_base": base,
            "topic": c.kv_topic,
            "block_size": c.page_size,
            "dp_size": c.dp_size,
        });
        if let Some(&replay) = p.replay.first() {
            block["replay_endpoint_port_base"] = json!(replay);
        }
        if let Some(&load) = p.load.first() {
            block["load_endpoint_port_base"] = json!(load);
            block["load_topic"] = json!(LOAD_TOPIC);
        }
        block
    });
    Json(json!({
        "model_path": c.model,
        "served_model_name": c.model,
        "disaggregation_mode": c.role.disaggregation_mode(),
        "disaggregation_bootstrap_port": p.bootstrap,
        "page_size": c.page_size,
        "dp_size": c.dp_size,
        "max_running_requests": c.max_running_requests,
        "max_total_num_tokens": c.kv_capacity_tokens,
        "kv_events": kv_events,
        "version": concat!("switchyard-engine-sim ", env!("CARGO_PKG_VERSION")),
    }))
    .into_response()
}

async fn models(State(app): State<Arc<AppState>>) -> Json<Value> {
    let base = &app.config.model;
    let mut data = vec![
        json!({"id": base, "object": "model", "created": 0, "owned_by": "sglang", "root": base, "parent": null}),
    ];
    for adapter in &app.config.lora_adapters {
        data.push(json!({"id": adapter, "object": "model", "created": 0, "owned_by": "sglang", "root": format!("/adapters/{adapter}"), "parent": base}));
    }
    Json(json!({"object": "list", "data": data}))
}

async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    let model = &app.config.model;
    let ranks: Vec<_> = app.engine.ranks().iter().map(|r| r.load()).collect();
    type Value = fn(&crate::engine::LoadSample) -> f64;
    let gauges: [(&str, &str, Value); 3] = [
        (
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            |l| l.running_requests as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            |l| l.waiting_requests as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            |l| l.used_kv_tokens as f64 / l.max_kv_tokens.max(1) as f64,
        ),
    ];
    let mut text = String::new();
    for (name, help, value) in gauges {
        text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (rank, load) in ranks.iter().enumerate() {
            text.push_str(&format!(
                "{name}{{engine=\"{rank}\",model_name=\"{model}\"}} {:?}\n",
                value(load)
            ));
        }
    }
    let page = u64::from(app.config.page_size);
    text.push_str("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n");
    for (rank, load) in ranks.iter().enumerate() {
        text.push_str(&format!(
            "vllm:cache_config_info{{block_size=\"{page}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"{rank}\",num_gpu_blocks=\"{}\"}} 1.0\n",
            load.max_kv_tokens / page.max(1)
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn flush_cache(State(app): State<Arc<AppState>>) -> &'static str {
    app.engine.flush_cache();
    "Cache flushed.\n"
}

async fn get_faults(State(app): State<Arc<AppState>>) -> Json<FaultConfig> {
    Json(app.engine.faults().current())
}

async fn set_faults(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    let config: FaultConfig = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return error_response(StatusCode::BAD_REQUEST, format!("invalid fault set: {e}"));
        }
    };
    if let Err(e) = config.validate() {
        return error_response(StatusCode::BAD_REQUEST, e);
    }
    app.engine.faults().replace(config.clone());
    Json(config).into_response()
}

async fn recent_requests(State(app): State<Arc<AppState>>) -> Json<Value> {
    let requests = app.recent.lock().iter().cloned().collect::<Vec<_>>();
    Json(json!({"requests": requests, "visits": app.visits.current()}))
}

async fn restart_publisher(State(app): State<Arc<AppState>>) -> StatusCode {
    app.engine.restart_publishers();
    StatusCode::NO_CONTENT
}
