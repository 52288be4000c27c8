//! Client connections: every accepted socket gets `TCP_NODELAY`, the send buffer
//! `limits.client_send_buffer_bytes` sets (so the write deadline starts once that much
//! waits, not once the kernel's grown buffer of up to megabytes is full), one of
//! `limits.max_connections` permits (more connections wait in the listen backlog), and
//! head, idle and write deadlines ([`deadlines`]); on shutdown the listener closes and
//! open connections finish their requests within the grace period, after which they
//! are closed.

mod deadlines;

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::{Service as _, service_fn};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use crate::validated::ClientLimits;
use deadlines::{Deadlines, Guarded, Phase, Tracked};

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
    let deadlines = Deadlines {
        head: limits.header,
        idle: limits.idle,
        write: limits.write,
    };
    let mut builder = http1::Builder::new();
    // The socket keeps the head deadline itself: hyper's would also count the idle
    // time before a head.
    builder.header_read_timeout(None);
    let mut connections = JoinSet::new();
    loop {
        let (stream, permit) = tokio::select! {
            biased;
            _ = stopped.wait_for(|s| *s) => break,
            accepted = accept(&listener, &permits) => accepted,
        };
        while connections.try_join_next().is_some() {}
        configure(&stream, limits.send_buffer);
        let phase = Phase::new();
        let stream = Guarded::new(stream, deadlines, Arc::clone(&phase));
        let app = TowerToHyperService::new(app.clone());
        let service = service_fn(move |request| {
            phase.busy();
            let phase = Arc::clone(&phase);
            let response = app.call(request);
            async move {
                response
                    .await
                    .map(|response| response.map(|body| Tracked::new(body, phase)))
            }
        });
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

/// Sets `TCP_NODELAY` and the send buffer, if one is configured, on an accepted
/// socket; a failure is logged and the connection served as it is.
fn configure(stream: &TcpStream, send_buffer: Option<usize>) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(error = %e, "setting TCP_NODELAY failed");
    }
    if let Some(bytes) = send_buffer
        && let Err(e) = socket2::SockRef::from(stream).set_send_buffer_size(bytes)
    {
        tracing::warn!(error = %e, bytes, "setting a client socket's send buffer failed");
    }
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
