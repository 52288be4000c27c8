//! A client socket with deadlines: a request head must arrive within the head
//! timeout of its first byte (of the accept, for a connection's first request), a
//! kept-alive connection may sit idle between requests for the idle timeout, and a
//! client that accepts no byte of an answer for the write timeout is dropped.
//!
//! The socket cannot see where requests begin and end, so the connection's service
//! tells it through a shared [`Phase`]: busy from the moment a request's head is
//! parsed until its response body is dropped (written whole or abandoned). The
//! deadline of the next phase is armed at the next read, or at the flush that ends
//! the response, whichever the server does first, without waking the connection.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep, sleep};

/// How long a client may take at each step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    /// From a head's first byte (or the accept) to its end.
    pub(crate) head: Duration,
    /// Between a response and the next request's first byte.
    pub(crate) idle: Duration,
    /// Without accepting a byte of an answer, once writes have to wait.
    pub(crate) write: Duration,
}

const HEAD: u8 = 0;
const BUSY: u8 = 1;
const IDLE: u8 = 2;

/// Where a connection is between requests, shared by its socket and its service.
#[derive(Debug)]
pub(crate) struct Phase {
    state: AtomicU8,
}

impl Phase {
    /// A new connection, awaiting its first head.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: AtomicU8::new(HEAD),
        })
    }

    /// A request's head was parsed: no read deadline until its response is done.
    pub(crate) fn busy(&self) {
        self.state.store(BUSY, Ordering::Relaxed);
    }

    fn idle(&self) {
        self.state.store(IDLE, Ordering::Relaxed);
    }

    /// Whether a request is being served (its head read, its answer not done).
    pub(crate) fn is_busy(&self) -> bool {
        self.state.load(Ordering::Relaxed) == BUSY
    }
}

/// A response body that marks its connection idle when dropped.
#[derive(Debug)]
pub(crate) struct Tracked {
    body: axum::body::Body,
    phase: Arc<Phase>,
}

impl Tracked {
    pub(crate) fn new(body: axum::body::Body, phase: Arc<Phase>) -> Self {
        Self { body, phase }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.phase.idle();
    }
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The read deadline that is armed, and for which phase.
struct Armed {
    phase: u8,
    timer: Pin<Box<Sleep>>,
}

/// See the module documentation.
pub(crate) struct Guarded {
    stream: TcpStream,
    deadlines: Deadlines,
    phase: Arc<Phase>,
    reading: Armed,
    /// Armed when a write first has to wait; disarmed by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Guarded {
    pub(crate) fn new(stream: TcpStream, deadlines: Deadlines, phase: Arc<Phase>) -> Self {
        Self {
            stream,
            deadlines,
            phase,
            reading: Armed {
                phase: HEAD,
                timer: Box::pin(sleep(deadlines.head)),
            },
            stalled: None,
        }
    }

    /// Re-arms the read deadline when the phase changed; `None` while a request is
    /// being served.
    fn read_deadline(&mut self) -> Option<&mut Pin<Box<Sleep>>> {
        let phase = self.phase.state.load(Ordering::Relaxed);
        if phase == BUSY {
            self.reading.phase = BUSY;
            return None;
        }
        if self.reading.phase != phase {
            let limit = if phase == IDLE {
                self.deadlines.idle
            } else {
                self.deadlines.head
            };
            self.reading.phase = phase;
            self.reading.timer.as_mut().reset(Instant::now() + limit);
        }
        Some(&mut self.reading.timer)
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
        let limit = self.deadlines.write;
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

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                // The first bytes of a head after an idle spell start its timeout.
                if buf.filled().len() > before
                    && this
                        .phase
                        .state
                        .compare_exchange(IDLE, HEAD, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    this.read_deadline();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let expired = this
                    .read_deadline()
                    .is_some_and(|timer| timer.as_mut().poll(cx).is_ready());
                if expired {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client sent no request head in time",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for Guarded {
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
        let this = &mut *self;
        let flushed = Pin::new(&mut this.stream).poll_flush(cx);
        // The server flushes once a response is written whole, and may not read
        // again before the client sends something: the idle deadline starts here
        // (an expired one ends the connection at the next read, which the wake-up
        // brings).
        if flushed.is_ready()
            && let Some(timer) = this.read_deadline()
        {
            let _ = timer.as_mut().poll(cx);
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
