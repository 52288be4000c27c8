//! `switchyard indexer`: a prefix index shared by router replicas. It reads the
//! routers' configuration file, subscribes to the KV events of every engine of each
//! model a cache-aware group reads (the same fleet and index code a router runs), and
//! answers lookups over HTTP: a router configured with `prefix_indexer` sends a
//! prompt's block hashes and is told which engines hold how much of it, so every
//! replica routes on one view and only the indexer holds the index.
//!
//! It serves `POST /v1/prefix/lookup`, `GET /health`, `GET /metrics` (the feeds, the
//! index and `config_reloads`) and the routers' engine admin API (`/workers`) on an
//! address of its own (the file's `listen` is the routers'). With a token in the
//! file's `prefix_indexer` section (the one the routers send), a lookup without it is
//! a 401, counted and logged. Routers bound what it costs them: at most
//! `max_lookups_in_flight` lookups at once, and a breaker per indexer that a failed
//! lookup opens; a router naming several indexers (`urls`) asks the next one when
//! one fails (the `client` module).
//!
//! It follows the engines the routers follow, from the same three sources: the file
//! (reloaded as a router reloads it, `follow`), Kubernetes discovery when the file
//! has `discovery.kubernetes` (the router's own discovery, into the indexer's
//! fleet), and the admin API, which each replica and the indexer serve alike
//! (`admin`). An engine that leaves is forgotten: its pages leave the index and its
//! metric series go.

mod admin;
mod breaker;
mod client;
mod follow;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use router_fleet::Fleet;
use router_policy::{ConfigError, PrefixHits};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub(crate) use client::{IndexerLink, RemoteCacheSource};
pub use follow::IndexerContext;
use wire::{
    BINARY_LOOKUP, LOOKUP_PATH, Lookup, MAX_BINARY_LOOKUP_BYTES, MAX_HASHES, MAX_JSON_LOOKUP_BYTES,
    answer_json,
};

use crate::access::{AdminAccess, TokenDigest, TokenSetting};
use crate::app::{StartError, register};
use router_config::{PrefixIndexerConfig, RouterConfig};

use crate::metrics::{Format, encode_registry};
use crate::validated::{RestartOnly, ValidatedConfig};

/// A running indexer.
#[derive(Debug)]
pub struct RunningIndexer {
    addr: SocketAddr,
    ctx: Arc<IndexerContext>,
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
}

impl RunningIndexer {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The engines it follows and the indexes it keeps.
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.ctx.fleet
    }

    /// What it follows, and reloading it.
    pub fn context(&self) -> &Arc<IndexerContext> {
        &self.ctx
    }

    /// Stops serving, letting lookups under way finish.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        drop(self.server.await);
    }
}

#[derive(Debug)]
struct Indexer {
    ctx: Arc<IndexerContext>,
    registry: Registry,
    /// Lookups refused for a missing or wrong token.
    unauthorized: Counter,
    /// When a refused lookup was last logged.
    logged: Mutex<Option<Instant>>,
}

/// How often a refused lookup is logged, at most.
const LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

impl Indexer {
    /// The 401 of a lookup without the token: counted, and logged at most every
    /// [`LOG_INTERVAL`].
    fn unauthorized(&self) -> Response {
        self.unauthorized.inc();
        let now = Instant::now();
        let mut logged = self.logged.lock();
        if logged.is_none_or(|at| now.saturating_duration_since(at) >= LOG_INTERVAL) {
            *logged = Some(now);
            tracing::warn!(
                refused = self.unauthorized.get(),
                "a prefix lookup without the indexer's token was refused (401)"
            );
        }
        let mut answer = refused(
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required (prefix_indexer.token or token_file)",
        );
        answer.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
        answer
    }
}

/// Who may look up: the token of the file's `prefix_indexer` section, if any.
fn lookup_access(
    section: Option<&PrefixIndexerConfig>,
    errors: &mut Vec<ConfigError>,
) -> Option<TokenDigest> {
    let token = TokenSetting::prefix_indexer(section?).read(errors)?;
    Some(TokenDigest::of(&token))
}

/// Starts an indexer on `listen` for the cache-aware models of `config`. Of its own
/// `prefix_indexer` section only the token is read, which lookups must then carry:
/// the indexer keeps the indexes itself. With `discovery.kubernetes`, it discovers
/// pods as a router does.
///
/// # Errors
/// The configuration is invalid (the token file included), no model has a
/// cache-aware group with a tokenizer, an engine cannot join, discovery cannot
/// start, or the address cannot be bound.
pub async fn start_indexer(
    mut config: RouterConfig,
    listen: SocketAddr,
) -> Result<RunningIndexer, StartError> {
    let mut problems = Vec::new();
    let restart_only = RestartOnly::of(&config);
    let access = lookup_access(config.prefix_indexer.take().as_ref(), &mut problems);
    let mut validated = match ValidatedConfig::validate(config) {
        Ok(validated) if problems.is_empty() => validated,
        Ok(_) => return Err(StartError::Config(problems)),
        Err(mut errors) => {
            errors.extend(problems);
            return Err(StartError::Config(errors));
        }
    };
    let fleet = Arc::new(
        Fleet::new(
            validated.upstream(),
            Arc::clone(&validated.load),
            validated.health,
        )
        .with_max_feed_message_bytes(validated.max_feed_message_bytes)
        .with_feed_memory_bytes(validated.feed_memory_bytes)
        .with_metrics_interval(validated.metrics_interval),
    );
    let mut indexed = false;
    let mut errors = Vec::new();
    for (m, model) in validated.models.iter().enumerate() {
        if model.selection.prefix_index.is_none() {
            continue;
        }
        indexed = true;
        let at = format!("models[{m}]");
        for joined in register(&fleet, model).await {
            if let Err(e) = joined {
                errors.push(e.within(&at));
            }
        }
    }
    if !indexed {
        errors.push(follow::nothing_indexed());
    }
    if !errors.is_empty() {
        return Err(StartError::Config(errors));
    }
    let admin = std::mem::replace(&mut validated.admin, AdminAccess::Off);
    let ctx = Arc::new(IndexerContext::new(
        Arc::clone(&fleet),
        &validated,
        restart_only,
        admin,
        access,
    ));
    let mut registry = Registry::with_prefix("switchyard");
    router_fleet::register_metrics(&fleet, &mut registry);
    crate::metrics::register_config_reloads(&mut registry, &ctx.config_reloads);
    let unauthorized = Counter::default();
    registry.register(
        "indexer_lookups_unauthorized",
        "Prefix lookups refused with 401: without the token prefix_indexer configures",
        unauthorized.clone(),
    );
    if ctx.lookups.load().is_none() {
        tracing::warn!(
            "prefix lookups are not authenticated: anyone who reaches the indexer can tell which prompts' prefixes the engines hold (set prefix_indexer.token or token_file)"
        );
    }
    let health = fleet.spawn_health_checks();
    #[cfg(feature = "kubernetes")]
    let discovery = match validated.kubernetes.clone() {
        Some(settings) => Some(
            router_fleet::kubernetes::spawn_discovery(Arc::clone(&fleet), settings).map_err(
                |e| StartError::Config(vec![ConfigError::at("discovery.kubernetes", e)]),
            )?,
        ),
        None => None,
    };
    let indexer = Arc::new(Indexer {
        ctx: Arc::clone(&ctx),
        registry,
        unauthorized,
        logged: Mutex::new(None),
    });
    let app = axum::Router::new()
        .route(LOOKUP_PATH, post(lookup))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics))
        .with_state(indexer)
        .merge(admin::routes(Arc::clone(&ctx)));
    let bind = |problem| StartError::Listen {
        addr: listen,
        problem,
    };
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(bind)?;
    let addr = listener.local_addr().map_err(bind)?;
    let (stop, stopped) = watch::channel(false);
    let serving = crate::connections::serve(
        listener,
        crate::connections::Apps {
            full: app,
            probes: None,
        },
        validated.client,
        stopped,
        validated.shutdown_grace,
    );
    let server = tokio::spawn(async move {
        serving.await;
        drop(health);
        #[cfg(feature = "kubernetes")]
        drop(discovery);
    });
    tracing::info!(%addr, "prefix indexer listening");
    Ok(RunningIndexer {
        addr,
        ctx,
        stop,
        server,
    })
}

fn refused(status: StatusCode, message: impl std::fmt::Display) -> Response {
    (
        status,
        axum::Json(json!({"error": {"message": message.to_string()}})),
    )
        .into_response()
}

/// Whether a lookup's `Content-Type` is [`BINARY_LOOKUP`] (parameters aside): any
/// other is read as JSON.
fn is_binary(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(BINARY_LOOKUP))
}

async fn lookup(State(indexer): State<Arc<Indexer>>, request: axum::extract::Request) -> Response {
    if let Some(access) = indexer.ctx.lookups.load().as_ref()
        && !access.admits_request(request.headers())
    {
        return indexer.unauthorized();
    }
    let binary = is_binary(request.headers());
    let limit = if binary {
        MAX_BINARY_LOOKUP_BYTES
    } else {
        MAX_JSON_LOOKUP_BYTES
    };
    let too_large = || {
        refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            format_args!("a lookup is at most {limit} bytes in this encoding"),
        )
    };
    let announced = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit as u64) {
        return too_large();
    }
    let read = tokio::time::timeout(
        indexer.ctx.body_timeout,
        Limited::new(request.into_body(), limit).collect(),
    )
    .await;
    let body: Bytes = match read {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e)) if e.is::<LengthLimitError>() => return too_large(),
        Ok(Err(e)) => return refused(StatusCode::BAD_REQUEST, format_args!("unreadable: {e}")),
        Err(_) => {
            return refused(
                StatusCode::REQUEST_TIMEOUT,
                format_args!(
                    "the lookup did not arrive within {} ms",
                    indexer.ctx.body_timeout.as_millis()
                ),
            );
        }
    };
    let lookup = if binary {
        Lookup::from_binary(&body).map_err(|e| format!("not a binary lookup: {e}"))
    } else {
        serde_json::from_slice::<Lookup<'_>>(&body).map_err(|e| format!("not a lookup: {e}"))
    };
    let lookup = match lookup {
        Ok(lookup) => lookup,
        Err(e) => return refused(StatusCode::BAD_REQUEST, e),
    };
    if lookup.hashes.len() > MAX_HASHES {
        return refused(
            StatusCode::BAD_REQUEST,
            format_args!("at most {MAX_HASHES} block hashes a lookup"),
        );
    }
    let Some(index) = indexer.ctx.fleet.prefix_index(&lookup.model) else {
        return refused(
            StatusCode::NOT_FOUND,
            "the indexer keeps no index of that model",
        );
    };
    let hits = PrefixHits::of_chain(&index, &lookup.hashes, lookup.dry_run);
    match answer_json(&hits) {
        Ok(json) => (
            [(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            )],
            Bytes::from(json),
        )
            .into_response(),
        Err(e) => refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            format_args!("encoding the answer: {e}"),
        ),
    }
}

async fn metrics(State(indexer): State<Arc<Indexer>>) -> Response {
    (
        [(
            http::header::CONTENT_TYPE,
            Format::Prometheus.content_type(),
        )],
        encode_registry(&indexer.registry, Format::Prometheus, 0),
    )
        .into_response()
}
