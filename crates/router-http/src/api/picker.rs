//! The endpoint picker: Envoy's external processing gRPC service (`ext_proc`), as a
//! Gateway API inference gateway asks it which engine serves each request. A
//! request is routed as the proxy routes it (preparation, the bucket loop,
//! admission, flow control, decision records); the gateway is told the engine's
//! address and sends the request there itself, and the picker follows the answer
//! as the gateway streams it back (`exchange`). The messages are `wire`'s.

mod exchange;
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
use router_config::{ConfigError, PickerConfig};
use router_policy::RequestFacts;
use router_state::EngineId;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};

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
/// Responses a stream may have waiting for the gateway to read them.
const QUEUED_RESPONSES: usize = 16;

/// The picker as a validated configuration serves it.
#[derive(Debug, Clone)]
pub(crate) struct PickerSettings {
    /// The address it listens on.
    pub(crate) listen: SocketAddr,
    /// Streams one gateway connection may hold open.
    max_streams: u32,
    /// The token every stream must carry, when one is configured.
    token: Option<TokenDigest>,
}

impl PickerSettings {
    /// The settings of `config`, its token read (each problem in `errors`).
    pub(crate) fn of(config: &PickerConfig, errors: &mut Vec<ConfigError>) -> Self {
        Self {
            listen: config.listen,
            max_streams: config.max_streams,
            token: TokenSetting::picker(config)
                .read(errors)
                .map(|token| TokenDigest::of(&token)),
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

    fn excluded(&self, ctx: &AppContext, route: &ModelRoute) -> Result<Vec<EngineId>, ApiError> {
        let snapshot = ctx.fleet.snapshot();
        Ok(snapshot
            .model_engines(&route.id)
            .iter()
            .filter(|engine| match gateway::address(ctx, engine) {
                // A gateway cannot reach an engine without an IP address.
                None => true,
                Some(address) => self.subset.as_ref().is_some_and(|s| !s.contains(&address)),
            })
            .map(|engine| engine.id().clone())
            .collect())
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
            && !token.admits_request(&request.metadata().clone().into_headers())
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
        // The status the stream ends with when the exchange did not complete: set
        // before the last sender goes, so the stream never closes with OK first.
        let ending: Arc<Mutex<Option<Status>>> = Arc::default();
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
            if !outcome.is_complete() {
                *ended.lock() = Some(status);
            }
            drop(last);
            let labels = OutcomeLabels {
                outcome: outcome.as_str(),
            };
            ctx.metrics.picker_streams.get_or_create(&labels).inc();
            if outcome == exchange::Outcome::Invalid {
                tracing::warn!(
                    "a gateway broke the external processing protocol; its stream was ended"
                );
            }
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
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(settings.max_streams)
        .tcp_nodelay(true)
        .add_service(service)
        .serve_with_incoming_shutdown(tonic::transport::server::TcpIncoming::from(listener), stop);
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
