//! A started engine, as its owner holds it: the ports it bound, its model and request
//! counts, and the tasks to stop.

use std::net::SocketAddr;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::visits::{VisitLog, Visits};
use crate::engine::SimEngine;

/// The ports an engine bound, as `/server_info` advertises them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BoundPorts {
    /// The HTTP address.
    pub http: SocketAddr,
    /// KV-event PUB port per rank.
    pub kv: Vec<u16>,
    /// Replay ROUTER port per rank.
    pub replay: Vec<u16>,
    /// Load-feed PUB port per rank.
    pub load: Vec<u16>,
    /// The prefill engine's bootstrap port.
    pub bootstrap: Option<u16>,
    /// The admin-only HTTP address.
    pub admin: Option<SocketAddr>,
}

/// A running simulated engine. Dropping it without [`shutdown`](Self::shutdown) also
/// stops every task.
#[derive(Debug)]
pub struct RunningEngine {
    ports: BoundPorts,
    engine: Arc<SimEngine>,
    visits: Arc<VisitLog>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl RunningEngine {
    /// An engine whose `tasks` serve it on `ports` until `stop` is set.
    pub(crate) fn new(
        ports: BoundPorts,
        engine: Arc<SimEngine>,
        visits: Arc<VisitLog>,
        stop: watch::Sender<bool>,
        tasks: JoinSet<()>,
    ) -> Self {
        Self {
            ports,
            engine,
            visits,
            stop,
            tasks,
        }
    }

    /// The bound ports.
    pub fn ports(&self) -> &BoundPorts {
        &self.ports
    }

    /// The engine model behind the HTTP surface.
    pub fn engine(&self) -> &Arc<SimEngine> {
        &self.engine
    }

    /// The chat requests so far, by how they ended.
    pub fn visits(&self) -> Visits {
        self.visits.current()
    }

    /// The `GET /health` requests answered so far.
    pub fn health_probes(&self) -> u64 {
        self.visits.health_probes()
    }

    /// Waits until the chat-request counts satisfy `ok`, and returns them.
    pub async fn visits_until(&self, ok: impl Fn(&Visits) -> bool) -> Visits {
        self.visits.until(ok).await
    }

    /// The base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.ports.http)
    }

    /// Stops accepting, closes every socket and waits for the tasks to end.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        while self.tasks.join_next().await.is_some() {}
    }
}
