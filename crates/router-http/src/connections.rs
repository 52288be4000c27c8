//! Client connections: every accepted socket gets `TCP_NODELAY`, one of
//! `limits.max_connections` permits (more connections wait in the listen backlog) and
//! a request-head timeout; on shutdown the listener closes and open connections
//! finish their requests within the grace period, after which they are closed.

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use crate::config::ClientLimits;

/// Serves `app` on `listener` until `stopped` turns true, then drains.
pub(crate) async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ClientLimits,
    mut stopped: watch::Receiver<bool>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header);
    let mut connections = JoinSet::new();
    loop {
        let (stream, permit) = tokio::select! {
            biased;
            _ = stopped.wait_for(|s| *s) => break,
            accepted = accept(&listener, &permits) => accepted,
        };
        while connections.try_join_next().is_some() {}
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!(error = %e, "setting TCP_NODELAY failed");
        }
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        connections.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "client connection closed with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => {
            tracing::warn!(?grace, "grace period over; closing remaining connections");
        }
    }
    connections.abort_all();
}

/// The next connection, once a permit is free. A failed accept (say, out of file
/// descriptors) is logged and retried after a pause instead of spinning.
async fn accept(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
) -> (TcpStream, OwnedSemaphorePermit) {
    let permit = Arc::clone(permits)
        .acquire_owned()
        .await
        .expect("the semaphore is never closed");
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return (stream, permit),
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
