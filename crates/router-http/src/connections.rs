//! Client connections: every accepted socket gets `TCP_NODELAY`, one of
//! `limits.max_connections` permits (more connections wait in the listen backlog), a
//! request-head timeout and a write timeout; on shutdown the listener closes and open
//! connections finish their requests within the grace period, after which they are
//! closed.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::{Sleep, sleep};

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
        let stream = WriteDeadline::new(stream, limits.write);
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

/// A client socket whose writes fail once it has accepted no byte for `limit`: a
/// client that stops reading a stream would otherwise hold its engine legs and their
/// in-flight slots for as long as the engine keeps generating.
struct WriteDeadline {
    stream: TcpStream,
    limit: Duration,
    /// Armed when a write first has to wait; disarmed by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl WriteDeadline {
    fn new(stream: TcpStream, limit: Duration) -> Self {
        Self {
            stream,
            limit,
            stalled: None,
        }
    }

    /// What a write that made progress (`Ready`) or had to wait returns.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if written.is_ready() {
            self.stalled = None;
            return written;
        }
        let limit = self.limit;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client accepted no byte within the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for WriteDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.watch(cx, written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.watch(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
