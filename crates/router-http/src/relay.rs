//! The response body relayed from an engine to the client, frame by frame as it
//! arrives (never buffered whole), holding the in-flight guards of every engine the
//! request was dispatched to until the body ends or the client goes away.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use router_state::InflightGuard;
use router_upstream::{H1Body, H1Error};
use tokio::time::{Instant, Sleep, sleep};

mod tally;
mod tpot;
mod usage;

pub(crate) use tally::{Ending, Tally};

/// A leg that must run to completion alongside the relayed body (a PD prefill).
pub(crate) type Companion = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A pick's prediction of the prompt tokens its engine finds cached, which the usage
/// the answer reports is compared with.
#[derive(Debug)]
pub(crate) struct Predicted {
    /// The engine predicted about (the pick's own id).
    engine: Arc<str>,
    /// The cached prompt tokens predicted.
    cached_tokens: u64,
}

impl Predicted {
    /// The prediction `pick` made, if its policy made one.
    pub(crate) fn of(pick: &router_policy::Pick) -> Option<Self> {
        pick.predicted_cached_tokens.map(|cached_tokens| Self {
            engine: Arc::clone(pick.engine.id().as_arc_str()),
            cached_tokens,
        })
    }
}

/// Why a relayed body stopped early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RelayError {
    #[error("the engine's response broke off: {0}")]
    Upstream(#[from] H1Error),
    #[error("the engine sent nothing for {0:?}")]
    Idle(Duration),
    #[error("the prefill leg failed: {0}")]
    Companion(String),
}

/// See the module documentation.
pub(crate) struct RelayBody {
    inner: H1Body,
    companion: Option<Companion>,
    /// Armed when the engine first makes the body wait; most small answers
    /// complete without ever needing it.
    idle: Option<Pin<Box<Sleep>>>,
    idle_timeout: Duration,
    /// The head, or data, was handed to the server since the body last made it wait:
    /// the server may still hold it in its write buffer.
    unflushed: bool,
    /// An error held back until the data before it is flushed.
    held: Option<RelayError>,
    tally: Tally,
}

impl std::fmt::Debug for RelayBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayBody")
            .field("tally", &self.tally)
            .finish_non_exhaustive()
    }
}

impl RelayBody {
    /// Relays `inner` (with `companion` run beside it), counted by `tally`.
    pub(crate) fn new(
        inner: H1Body,
        companion: Option<Companion>,
        idle_timeout: Duration,
        tally: Tally,
    ) -> Self {
        let mut body = Self {
            inner,
            companion,
            idle: None,
            idle_timeout,
            unflushed: true,
            held: None,
            tally,
        };
        if body.is_end_stream() {
            // An empty answer is complete before the server ever polls it.
            body.tally.finish(Ending::Done, "ok");
        }
        body
    }

    /// Ends the body with `error`, once the server has flushed the data before it: a
    /// server that meets a body error closes the connection at once and would drop
    /// what it still buffers, so the body first makes it wait (and flush).
    fn fail(
        &mut self,
        cx: &mut Context<'_>,
        error: RelayError,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        if self.unflushed {
            self.unflushed = false;
            self.held = Some(error);
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Some(Err(error)))
    }

    fn poll_inner(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let this = self;
        if let Some(companion) = this.companion.as_mut()
            && let Poll::Ready(result) = companion.as_mut().poll(cx)
        {
            this.companion = None;
            if let Err(e) = result {
                this.tally.finish(Ending::Failed, "prefill_failed");
                return this.fail(cx, RelayError::Companion(e));
            }
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(idle) = this.idle.as_mut() {
                    idle.as_mut().reset(Instant::now() + this.idle_timeout);
                }
                if let Some(data) = frame.data_ref() {
                    this.tally.data(data);
                }
                if this.is_end_stream() {
                    // A server writing a known length stops polling here.
                    this.tally.finish(Ending::Done, "ok");
                }
                this.unflushed |= frame.is_data();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.tally.finish(Ending::Failed, "upstream_error");
                this.fail(cx, RelayError::Upstream(e))
            }
            Poll::Ready(None) if this.companion.is_none() => {
                this.tally.finish(Ending::Done, "ok");
                Poll::Ready(None)
            }
            // The decode answer is complete but the prefill leg is still running (or
            // the decode answer has nothing new): wait, within the idle timeout.
            Poll::Ready(None) | Poll::Pending => {
                let timeout = this.idle_timeout;
                let idle = this.idle.get_or_insert_with(|| Box::pin(sleep(timeout)));
                ready!(idle.as_mut().poll(cx));
                this.tally.finish(Ending::Failed, "upstream_timeout");
                Poll::Ready(Some(Err(RelayError::Idle(this.idle_timeout))))
            }
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let this = self.get_mut();
        if let Some(error) = this.held.take() {
            return Poll::Ready(Some(Err(error)));
        }
        let polled = this.poll_inner(cx);
        if polled.is_pending() {
            this.unflushed = false;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.companion.is_none() && self.held.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RelayBody {
    fn drop(&mut self) {
        if !self.tally.ended() && self.held.is_none() && self.inner.is_end_stream() {
            // The whole answer was sent (a server writing a known length drops the body
            // once it has written it): a prefill leg still running goes on to its end,
            // holding its engine's in-flight count, within the idle timeout.
            if let Some(companion) = self.companion.take()
                && let Ok(runtime) = tokio::runtime::Handle::try_current()
            {
                // The prefill engine's guard comes first (`Pair::new`); the decode
                // engine's goes now, its answer being whole.
                let guards: Vec<InflightGuard> =
                    self.tally.take_guards().into_iter().take(1).collect();
                let timeout = self.idle_timeout;
                runtime.spawn(async move {
                    match tokio::time::timeout(timeout, companion).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!(error = %e, "a prefill leg failed after its decode answer was sent"),
                        Err(_) => tracing::warn!(?timeout, "a prefill leg sent nothing within the idle timeout after its decode answer was sent"),
                    }
                    drop(guards);
                });
            }
            self.tally.finish(Ending::Done, "ok");
        }
        // Dropped before the end, the client went away: the tally counts it, and
        // dropping `inner` and the companion closes both upstream requests, which is
        // how engines learn of it.
    }
}
