//! Chat, completion and embedding requests counted as they arrive and as they end:
//! answered to the end by the engine, or abandoned by a client (a router) that went
//! away first. A test asserts what the engine saw of a failure with these counts, and
//! waits on them instead of on time. Health probes are counted apart: the load a
//! router's probing puts on an engine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use tokio::sync::watch;

/// The requests of one engine (chat, completion, embedding), by how they ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Visits {
    /// Requests received and not yet ended.
    pub open: u64,
    /// Requests the engine ended: a whole answer, an error status, or a stream it
    /// finished or cut itself (the disconnect fault).
    pub answered: u64,
    /// Requests whose client closed the connection before the engine ended them,
    /// and requests still open when the engine shut down.
    pub abandoned: u64,
}

/// The live counts, shared by the handlers and the engine's owner.
#[derive(Debug)]
pub(crate) struct VisitLog {
    counts: watch::Sender<Visits>,
    /// `GET /health` requests answered: the health-probe load a router puts on it.
    health_probes: AtomicU64,
}

impl Default for VisitLog {
    fn default() -> Self {
        Self {
            counts: watch::Sender::new(Visits::default()),
            health_probes: AtomicU64::new(0),
        }
    }
}

impl VisitLog {
    /// Counts a `GET /health`.
    pub(crate) fn probed(&self) {
        self.health_probes.fetch_add(1, Ordering::Relaxed);
    }

    /// `GET /health` requests so far.
    pub(crate) fn health_probes(&self) -> u64 {
        self.health_probes.load(Ordering::Relaxed)
    }

    /// Counts a request in; it is abandoned unless [`Visit::answered`] is called.
    pub(crate) fn arrive(self: &Arc<Self>) -> Visit {
        self.counts.send_modify(|v| v.open += 1);
        Visit {
            log: Arc::clone(self),
            answered: false,
        }
    }

    pub(crate) fn current(&self) -> Visits {
        *self.counts.borrow()
    }

    /// Waits until the counts satisfy `ok`, and returns them.
    pub(crate) async fn until(&self, ok: impl Fn(&Visits) -> bool) -> Visits {
        let mut counts = self.counts.subscribe();
        let seen = counts
            .wait_for(|v| ok(v))
            .await
            .expect("the log outlives its receivers");
        *seen
    }
}

/// One request being served; dropping it ends the request.
#[derive(Debug)]
pub(crate) struct Visit {
    log: Arc<VisitLog>,
    answered: bool,
}

impl Visit {
    /// The engine ended the request itself.
    pub(crate) fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Visit {
    fn drop(&mut self) {
        let answered = self.answered;
        self.log.counts.send_modify(|v| {
            v.open -= 1;
            if answered {
                v.answered += 1;
            } else {
                v.abandoned += 1;
            }
        });
    }
}
