//! The endpoint picker: Envoy's external processing gRPC service (`ext_proc`), as a
//! Gateway API inference gateway asks it which engine serves each request. A
//! request is routed as the proxy routes it (preparation, the bucket loop,
//! admission, flow control, decision records); the gateway is told the engine's
//! address and sends the request there itself, and the picker follows the answer
//! as the gateway streams it back (`exchange`). The messages are `wire`'s.
//!
//! The same listener answers gRPC's health checks (`health`), so a gateway's checks
//! reach the picker through HTTP/2 and gRPC rather than only a TCP connect, which a
//! frozen process still accepts.

mod exchange;
mod health;
mod wire;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use parking_lot::Mutex;
use router_buckets::BucketPick;
use router_config::{ConfigError, PickerConfig, PickerTls};
use router_policy::RequestFacts;
use router_state::EngineId;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};
use tonic_health::pb::health_server::HealthServer;

use super::chat::Deliver;
use crate::access::{TokenDigest, TokenSetting};
use crate::app::AppContext;
use crate::attempts::count_picks;
use crate::dispatch::Outgoing;
use crate::dispatch::gateway::{self, Named};
use crate::error::ApiError;
use crate::metrics::OutcomeLabels;
use crate::routing::ModelRoute;

/// The largest message taken from a gateway: a chunk of a body (Envoy's are 64 KiB
/// at most) or a request's headers, with room to spare.
const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// How often an idle gateway connection is pinged, and how long the ping's answer
/// may take before the connection is closed (a gateway that vanished).
const H2_KEEPALIVE: Duration = Duration::from_secs(30);
const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keepalive of gateway connections.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// Responses a stream may have waiting for the gateway to read them.
const QUEUED_RESPONSES: usize = 16;

/// The largest PEM file of the picker's TLS read.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// The picker as a validated configuration serves it.
#[derive(Clone)]
pub(crate) struct PickerSettings {
    /// The address it listens on.
    pub(crate) listen: SocketAddr,
    /// Streams one gateway connection may hold open.
    max_streams: u32,
    /// The token every stream must carry, when one is configured.
    token: Option<TokenDigest>,
    /// The certificate chain and key it serves TLS with, as PEM, when it does.
    tls: Option<(String, String)>,
}

impl std::fmt::Debug for PickerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PickerSettings")
            .field("listen", &self.listen)
            .field("max_streams", &self.max_streams)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl PickerSettings {
    /// The settings of `config`, its token and TLS files read (each problem in
    /// `errors`).
    pub(crate) fn of(config: &PickerConfig, errors: &mut Vec<ConfigError>) -> Self {
        Self {
            listen: config.listen,
            max_streams: config.max_streams,
            token: TokenSetting::picker(config)
                .read(errors)
                .map(|token| TokenDigest::of(&token)),
            tls: config.tls.as_ref().and_then(|tls| pem(tls, errors)),
        }
    }
}

/// The TLS a server of `cert` and `key` (PEM) serves.
fn server_tls(cert: &str, key: &str) -> tonic::transport::ServerTlsConfig {
    let identity = tonic::transport::Identity::from_pem(cert, key);
    tonic::transport::ServerTlsConfig::new().identity(identity)
}

/// The certificate chain and key of `tls`: its files, or a self-signed certificate
/// made now.
fn pem(tls: &PickerTls, errors: &mut Vec<ConfigError>) -> Option<(String, String)> {
    let read = |field: &str, path: &std::path::Path, errors: &mut Vec<ConfigError>| {
        match crate::file::read_regular(path, MAX_PEM_BYTES) {
            Ok(file) => Some(file.text().to_owned()),
            Err(e) => {
                let at = format!("picker.tls.{field}");
                errors.push(ConfigError::at(at, format!("{}: {e}", path.display())));
                None
            }
        }
    };
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let cert = read("cert_file", cert, errors);
            let key = read("key_file", key, errors);
            let (cert, key) = cert.zip(key)?;
            // Refused now, not when the picker starts to serve.
            if let Err(e) = tonic::transport::Server::builder().tls_config(server_tls(&cert, &key))
            {
                let problem = format!("the certificate and key are unusable: {e}");
                errors.push(ConfigError::at("picker.tls", problem));
                return None;
            }
            Some((cert, key))
        }
        // Both or neither: the field checks say so.
        (Some(_), None) | (None, Some(_)) => None,
        (None, None) => {
            let names = vec!["switchyard-picker".to_owned(), "localhost".to_owned()];
            match rcgen::generate_simple_self_signed(names) {
                Ok(made) => Some((made.cert.pem(), made.signing_key.serialize_pem())),
                Err(e) => {
                    let problem = format!("a self-signed certificate could not be made: {e}");
                    errors.push(ConfigError::at("picker.tls", problem));
                    None
                }
            }
        }
    }
}

/// How a request is delivered through a gateway: its engine named, among those the
/// gateway can reach and allows.
struct Gateway {
    /// The endpoints the gateway's subset hint allows, when it sent one.
    subset: Option<HashSet<SocketAddr>>,
}

impl Deliver for Gateway {
    type Answer = Named;

    fn excluded(&self, ctx: &AppContext, route: &ModelRoute) -> Vec<EngineId> {
        let snapshot = ctx.fleet.snapshot();
        // An engine's address follows from its URL, which its `Arc` never changes.
        let addresses = route
            .gateway_addresses
            .get(snapshot.model_engines(&route.id), |engines| {
                engines
                    .iter()
                    .map(|engine| (engine.id().clone(), gateway::address(ctx, engine)))
                    .collect()
            });
        addresses
            .iter()
            .filter(|(_, address)| match address {
                // A gateway cannot reach an engine without an IP address.
                None => true,
                Some(address) => self.subset.as_ref().is_some_and(|s| !s.contains(address)),
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    async fn deliver(
        &self,
        ctx: &Arc<AppContext>,
        _route: &ModelRoute,
        request: &RequestFacts<'_>,
        pick: BucketPick,
        out: &Outgoing,
    ) -> Result<Named, ApiError> {
        count_picks(ctx, out, &pick, request.input_tokens);
        gateway::name(ctx, pick, out)
    }

    fn status(_: &Named) -> u16 {
        200
    }
}

/// The `ext_proc` service.
struct Picker {
    ctx: Arc<AppContext>,
    /// The token every stream must carry, when one is configured.
    token: Option<TokenDigest>,
    /// Set when the shutdown grace is over: the streams still open are ended.
    forced: watch::Receiver<bool>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = Responses;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Responses>, Status> {
        if let Some(token) = &self.token
            && !token.admits_request(request.metadata().as_ref())
        {
            let labels = OutcomeLabels {
                outcome: "unauthenticated",
            };
            self.ctx.metrics.picker_streams.get_or_create(&labels).inc();
            tracing::warn!("a stream without the picker's token (picker.token) was refused");
            return Err(Status::unauthenticated(
                "the endpoint picker requires its token (picker.token) as `authorization: Bearer`",
            ));
        }
        let inbound = request.into_inner();
        let (sender, mut receiver) = mpsc::channel(QUEUED_RESPONSES);
        // The status the stream ends with unless the exchange completes: an error
        // until then, so a stream whose task ends any other way (a panic included)
        // never closes with OK, which Envoy would take as "send it on unprocessed".
        let ending = Arc::new(Mutex::new(Some(Status::internal(
            "the endpoint picker failed while processing the request",
        ))));
        let ended = Arc::clone(&ending);
        let ctx = Arc::clone(&self.ctx);
        let mut forced = self.forced.clone();
        tokio::spawn(async move {
            let last = sender.clone();
            let exchange = exchange::exchange(Arc::clone(&ctx), inbound, sender);
            let (outcome, status) = tokio::select! {
                outcome = exchange => (outcome, outcome.status()),
                _ = forced.wait_for(|forced| *forced) => (
                    exchange::Outcome::Cancelled,
                    Status::unavailable("the router is shutting down"),
                ),
            };
            // Counted before the stream ends, so whoever sees it end sees it counted.
            let labels = OutcomeLabels {
                outcome: outcome.as_str(),
            };
            ctx.metrics.picker_streams.get_or_create(&labels).inc();
            if outcome == exchange::Outcome::Invalid {
                tracing::warn!(
                    "a gateway broke the external processing protocol; its stream was ended"
                );
            }
            *ended.lock() = (!outcome.is_complete()).then_some(status);
            drop(last);
        });
        let responses = futures_util::stream::poll_fn(move |cx| match receiver.poll_recv(cx) {
            Poll::Ready(None) => Poll::Ready(ending.lock().take().map(Err)),
            polled => polled,
        });
        Ok(Response::new(Box::pin(responses)))
    }
}

/// Serves the picker on `listener` until `stopped`, then lets open streams finish
/// within `grace`.
pub(crate) async fn serve(
    ctx: Arc<AppContext>,
    listener: TcpListener,
    settings: PickerSettings,
    mut stopped: watch::Receiver<bool>,
    grace: Duration,
) {
    let (forced, mut force) = watch::channel(false);
    let picker = Picker {
        ctx,
        token: settings.token,
        forced: force.clone(),
    };
    let service = ExternalProcessorServer::new(picker)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let stop = async move {
        drop(stopped.wait_for(|stopped| *stopped).await);
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            forced.send_replace(true);
        });
    };
    let mut builder = tonic::transport::Server::builder();
    if let Some((cert, key)) = &settings.tls {
        builder = match builder.tls_config(server_tls(cert, key)) {
            Ok(builder) => builder,
            // Checked when the configuration was.
            Err(e) => {
                tracing::error!(error = %e, "the endpoint picker's TLS certificate or key is unusable; it does not serve");
                return;
            }
        };
    }
    // The builder's own socket options apply only to an address it binds itself.
    // Without TCP_NODELAY, each answer's second small frame waits for the gateway's
    // delayed ACK: 40 ms a request.
    let incoming = tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(TCP_KEEPALIVE));
    let server = builder
        .max_concurrent_streams(settings.max_streams)
        .http2_keepalive_interval(Some(H2_KEEPALIVE))
        .http2_keepalive_timeout(Some(H2_KEEPALIVE_TIMEOUT))
        .add_service(service)
        .add_service(HealthServer::new(health::PickerHealth))
        .serve_with_incoming_shutdown(incoming, stop);
    tokio::select! {
        served = server => {
            if let Err(e) = served {
                tracing::error!(error = %e, "the endpoint picker stopped");
            }
        }
        _ = force.wait_for(|forced| *forced) => {
            tracing::warn!(?grace, "the endpoint picker's streams outlived the shutdown grace; closed");
        }
    }
}
