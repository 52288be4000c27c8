//! Starting a simulated engine: binding every socket its settings name, in a fixed
//! order, and spawning the tasks that serve them.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use zeromq::{PubSocket, RouterSocket};

use super::bootstrap::{self, Rooms};
use super::config::{EngineRole, SimConfig};
use super::faults::Faults;
use super::listener::serve_http;
use super::publish::{BindError, KvPublisherSettings, bind, run_kv_publisher, run_load_publisher};
use super::routes::{admin_routes, routes};
use super::running::{BoundPorts, RunningEngine};
use super::state::AppState;
use super::tokenizer::{Tokenizer, TokenizerError};
use super::visits::VisitLog;
use crate::engine::SimEngine;

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
    let mut launch = Launch::new(&config);
    let faults = Arc::new(Faults::new(config.faults.clone(), config.seed));
    let engine = launch.engine(&config, &faults).await?;
    launch.load_feed(&config, &engine).await?;
    let rooms = launch.bootstrap_server(&config).await?;
    let http = launch.http_listener().await?;
    launch.synthetic_kv(&config, &engine);
    let admin = launch.admin_listener(config.admin_port).await?;
    let visits = Arc::new(VisitLog::default());
    let state = AppState::new(
        config,
        Arc::clone(&engine),
        Arc::clone(&faults),
        tokenizer,
        rooms,
        launch.ports.clone(),
        Arc::clone(&visits),
    );
    launch.serve(http, admin, Arc::new(state), &faults);
    Ok(RunningEngine::new(
        launch.ports,
        engine,
        visits,
        launch.stop,
        launch.tasks,
    ))
}

/// An engine being started: the ports bound so far, the tasks serving them, and the
/// switch that stops those tasks.
struct Launch {
    host: IpAddr,
    ports: BoundPorts,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Launch {
    fn new(config: &SimConfig) -> Self {
        Self {
            host: config.host,
            ports: BoundPorts {
                http: SocketAddr::new(config.host, config.port),
                kv: Vec::new(),
                replay: Vec::new(),
                load: Vec::new(),
                bootstrap: None,
                admin: None,
            },
            stop: watch::channel(false).0,
            tasks: JoinSet::new(),
        }
    }

    /// Binds each rank's KV-event sockets, builds the engine, and starts a publisher
    /// per rank sending what the rank emits.
    async fn engine(
        &mut self,
        config: &SimConfig,
        faults: &Arc<Faults>,
    ) -> Result<Arc<SimEngine>, StartError> {
        let sockets = self.kv_sockets(config).await?;
        let (publishers, receivers): (Vec<_>, Vec<_>) =
            sockets.iter().map(|_| mpsc::unbounded_channel()).unzip();
        let engine = SimEngine::build(config.engine_spec(), Arc::clone(faults.set()), publishers);
        let settings = KvPublisherSettings {
            topic: Bytes::from(config.kv_topic.clone().into_bytes()),
            form: config.kv_event_form,
            // Without a replay socket nobody asks for the history.
            replay_capacity: if config.replay_port.is_some() {
                config.replay_buffer
            } else {
                0
            },
        };
        for (rank, ((live, replay), rx)) in sockets.into_iter().zip(receivers).enumerate() {
            self.tasks.spawn(run_kv_publisher(
                live,
                replay,
                rx,
                rank as u32,
                settings.clone(),
                Arc::clone(faults),
                self.stop.subscribe(),
            ));
        }
        Ok(Arc::new(engine))
    }

    /// Each rank's KV-event PUB socket, and its replay ROUTER when replay is on.
    async fn kv_sockets(
        &mut self,
        config: &SimConfig,
    ) -> Result<Vec<(PubSocket, Option<RouterSocket>)>, StartError> {
        let Some(base) = config.kv_port else {
            return Ok(Vec::new());
        };
        let mut sockets = Vec::new();
        for rank in 0..config.dp_size {
            let (live, port) =
                bind::<PubSocket>("KV-event PUB", self.host, offset(base, rank)).await?;
            self.ports.kv.push(port);
            let replay = match config.replay_port {
                Some(base) => {
                    let (socket, port) =
                        bind::<RouterSocket>("replay ROUTER", self.host, offset(base, rank))
                            .await?;
                    self.ports.replay.push(port);
                    Some(socket)
                }
                None => None,
            };
            sockets.push((live, replay));
        }
        Ok(sockets)
    }

    /// Binds each rank's load-feed PUB socket and starts its publisher.
    async fn load_feed(
        &mut self,
        config: &SimConfig,
        engine: &SimEngine,
    ) -> Result<(), StartError> {
        let Some(base) = config.load_port else {
            return Ok(());
        };
        for rank in engine.ranks() {
            let (socket, port) =
                bind::<PubSocket>("load PUB", self.host, offset(base, rank.index())).await?;
            self.ports.load.push(port);
            self.tasks.spawn(run_load_publisher(
                socket,
                Arc::downgrade(rank),
                config.load_form,
                self.stop.subscribe(),
            ));
        }
        Ok(())
    }

    /// Caches synthetic pages on every rank at the configured rate, if any.
    fn synthetic_kv(&mut self, config: &SimConfig, engine: &Arc<SimEngine>) {
        let rate = config.synthetic_kv_blocks_per_sec;
        if rate == 0.0 {
            return;
        }
        let engine = Arc::clone(engine);
        let salt = config.seed ^ u64::from(self.ports.http.port());
        let mut stop = self.stop.subscribe();
        self.tasks.spawn(async move {
            tokio::select! {
                () = engine.synthetic_kv(rate, salt) => {}
                _ = stop.changed() => {}
            }
        });
    }

    /// A prefill engine's rooms, served on its bootstrap port.
    async fn bootstrap_server(
        &mut self,
        config: &SimConfig,
    ) -> Result<Option<Arc<Rooms>>, StartError> {
        let rooms = (config.role == EngineRole::Prefill).then(|| Arc::new(Rooms::default()));
        if let (Some(rooms), Some(port)) = (&rooms, config.bootstrap_port) {
            let listener = listen("bootstrap server", SocketAddr::new(self.host, port)).await?;
            let addr = SocketAddr::new(self.host, local_port(&listener));
            self.ports.bootstrap = Some(addr.port());
            self.tasks.spawn(serve_http(
                listener,
                addr,
                bootstrap::router(Arc::clone(rooms)),
                None,
                self.stop.subscribe(),
            ));
        }
        Ok(rooms)
    }

    /// Binds the main HTTP listener, recording the address it got.
    async fn http_listener(&mut self) -> Result<TcpListener, StartError> {
        let addr = self.ports.http;
        let listener = listen("HTTP", addr).await?;
        self.ports.http = listener.local_addr().map_err(|source| StartError::Listen {
            what: "HTTP",
            addr,
            source,
        })?;
        Ok(listener)
    }

    /// Binds the admin listener, if the settings name a port for it.
    async fn admin_listener(
        &mut self,
        port: Option<u16>,
    ) -> Result<Option<TcpListener>, StartError> {
        let Some(port) = port else {
            return Ok(None);
        };
        let listener = listen("admin HTTP", SocketAddr::new(self.host, port)).await?;
        self.ports.admin = Some(SocketAddr::new(self.host, local_port(&listener)));
        Ok(Some(listener))
    }

    /// Serves the admin routes on their own listener, if any, and every route on the
    /// main one, which the refuse-connections fault closes.
    fn serve(
        &mut self,
        http: TcpListener,
        admin: Option<TcpListener>,
        state: Arc<AppState>,
        faults: &Faults,
    ) {
        if let (Some(listener), Some(addr)) = (admin, self.ports.admin) {
            self.tasks.spawn(serve_http(
                listener,
                addr,
                admin_routes().with_state(Arc::clone(&state)),
                None,
                self.stop.subscribe(),
            ));
        }
        self.tasks.spawn(serve_http(
            http,
            self.ports.http,
            routes(state),
            Some(faults.refusing()),
            self.stop.subscribe(),
        ));
    }
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
