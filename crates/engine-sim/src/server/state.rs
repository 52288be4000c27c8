//! What the HTTP handlers share: the engine, its settings, faults and tokenizer, the
//! prefill engine's bootstrap rooms, and the records of the requests served.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde_json::Value;

use super::bootstrap::Rooms;
use super::config::SimConfig;
use super::faults::Faults;
use super::running::BoundPorts;
use super::tokenizer::Tokenizer;
use super::visits::VisitLog;
use crate::engine::SimEngine;

/// How many recent requests `GET /admin/requests` keeps.
const RECENT_REQUESTS: usize = 256;

/// What the HTTP handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) config: SimConfig,
    pub(crate) engine: Arc<SimEngine>,
    pub(crate) faults: Arc<Faults>,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) rooms: Option<Arc<Rooms>>,
    pub(crate) client: reqwest::Client,
    pub(crate) visits: Arc<VisitLog>,
    ports: BoundPorts,
    ids: AtomicU64,
    /// The routing-relevant fields of recent chat requests, newest last.
    recent: Mutex<VecDeque<Value>>,
}

impl AppState {
    /// The state of an engine serving on `ports`.
    pub(crate) fn new(
        config: SimConfig,
        engine: Arc<SimEngine>,
        faults: Arc<Faults>,
        tokenizer: Tokenizer,
        rooms: Option<Arc<Rooms>>,
        ports: BoundPorts,
        visits: Arc<VisitLog>,
    ) -> Self {
        Self {
            config,
            engine,
            faults,
            tokenizer,
            rooms,
            client: reqwest::Client::new(),
            visits,
            ports,
            ids: AtomicU64::new(0),
            recent: Mutex::default(),
        }
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// The bound ports.
    pub(crate) fn ports(&self) -> &BoundPorts {
        &self.ports
    }

    /// The engine's id in vLLM's transfer params (one per HTTP port).
    pub(crate) fn engine_id(&self) -> String {
        format!("sim-{}", self.ports.http.port())
    }

    /// Remembers a chat request's routing-relevant fields for `GET /admin/requests`.
    pub(crate) fn remember(&self, request: Value) {
        let mut recent = self.recent.lock();
        if recent.len() == RECENT_REQUESTS {
            recent.pop_front();
        }
        recent.push_back(request);
    }

    /// The requests remembered, oldest first.
    pub(crate) fn recent(&self) -> Vec<Value> {
        self.recent.lock().iter().cloned().collect()
    }
}
