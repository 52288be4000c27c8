//! Prefill/decode hand-over through bootstrap rooms.
//!
//! A prefill engine serves `GET /rooms/{room}` on its bootstrap port. When it finishes
//! prefilling a request that carries `bootstrap_room`, it marks that room ready; a
//! decode engine given the same room, host and port waits on that endpoint (a long
//! poll) and fails its request if the room is not ready within its timeout, as a real
//! decode engine fails when the KV transfer never arrives.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// Ready rooms remembered for late decode requests, and vLLM transfers offered.
const READY_ROOMS_KEPT: usize = 65_536;

/// What a vLLM prefill offers a decode engine: its KV blocks of one request, taken
/// once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Transfer {
    pub(crate) engine_id: String,
    pub(crate) block_ids: Vec<u64>,
    pub(crate) prompt_tokens: u64,
}

/// What a ready room hands over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RoomInfo {
    pub(crate) room: u64,
    pub(crate) prompt_tokens: u64,
    /// The rank that prefilled it, and the prefill engine's ranks.
    #[serde(default)]
    pub(crate) rank: u32,
    #[serde(default = "one")]
    pub(crate) dp_size: u32,
    /// The prefill engine's page size and transfer backend, which the decode engine
    /// checks against its own.
    #[serde(default)]
    pub(crate) page_size: Option<u32>,
    #[serde(default)]
    pub(crate) transfer_backend: Option<String>,
    /// The prompt tokens the prefill engine found cached, which the decode engine's
    /// answer reports, as SGLang's does.
    #[serde(default)]
    pub(crate) cached_tokens: u64,
}

impl RoomInfo {
    /// Why a decode engine of `page_size` and `transfer_backend` cannot take this
    /// room's KV cache, as SGLang's decode refuses a prefill of another page size.
    pub(crate) fn refusal(&self, page_size: u32, transfer_backend: &str) -> Option<String> {
        if let Some(theirs) = self.page_size.filter(|p| *p != page_size) {
            return Some(format!(
                "page size mismatch: the prefill engine has page_size={theirs}, this decode engine {page_size}"
            ));
        }
        self.transfer_backend
            .as_deref()
            .filter(|b| *b != transfer_backend)
            .map(|theirs| {
                format!(
                    "transfer backend mismatch: the prefill engine speaks {theirs}, this decode engine {transfer_backend}"
                )
            })
    }
}

fn one() -> u32 {
    1
}

/// The rooms of one prefill engine.
#[derive(Debug, Default)]
pub(crate) struct Rooms {
    inner: Mutex<RoomTable>,
}

#[derive(Debug, Default)]
struct RoomTable {
    rooms: HashMap<u64, watch::Sender<Option<RoomInfo>>>,
    ready_order: VecDeque<u64>,
    transfers: HashMap<String, Transfer>,
    transfer_order: VecDeque<String>,
}

impl Rooms {
    /// Marks a room ready, waking its waiters.
    pub(crate) fn mark_ready(&self, info: RoomInfo) {
        let room = info.room;
        let mut table = self.inner.lock();
        table
            .rooms
            .entry(room)
            .or_insert_with(|| watch::channel(None).0)
            .send_replace(Some(info));
        table.ready_order.push_back(room);
        if table.ready_order.len() > READY_ROOMS_KEPT
            && let Some(oldest) = table.ready_order.pop_front()
        {
            table.rooms.remove(&oldest);
        }
    }

    /// Offers a vLLM transfer under `id` (the prefill's `remote_request_id`).
    pub(crate) fn offer(&self, id: String, transfer: Transfer) {
        let mut table = self.inner.lock();
        table.transfers.insert(id.clone(), transfer);
        table.transfer_order.push_back(id);
        if table.transfer_order.len() > READY_ROOMS_KEPT
            && let Some(oldest) = table.transfer_order.pop_front()
        {
            table.transfers.remove(&oldest);
        }
    }

    /// Takes the transfer offered under `id`: a second decode of the same params
    /// finds nothing, as the prefill frees its blocks once they are read.
    pub(crate) fn take(&self, id: &str) -> Option<Transfer> {
        self.inner.lock().transfers.remove(id)
    }

    /// Waits up to `timeout` for a room to become ready.
    pub(crate) async fn wait(&self, room: u64, timeout: Duration) -> Option<RoomInfo> {
        let mut ready = self
            .inner
            .lock()
            .rooms
            .entry(room)
            .or_insert_with(|| watch::channel(None).0)
            .subscribe();
        let info = match tokio::time::timeout(timeout, ready.wait_for(Option::is_some)).await {
            Ok(Ok(info)) => info.clone(),
            _ => None,
        };
        drop(ready);
        if info.is_none() {
            let mut table = self.inner.lock();
            if table
                .rooms
                .get(&room)
                .is_some_and(|tx| tx.borrow().is_none() && tx.receiver_count() == 0)
            {
                table.rooms.remove(&room);
            }
        }
        info
    }
}

#[derive(Debug, Deserialize)]
struct WaitParams {
    #[serde(default)]
    timeout_ms: u64,
}

/// The bootstrap server's routes.
pub(crate) fn router(rooms: Arc<Rooms>) -> axum::Router {
    axum::Router::new()
        .route("/rooms/{room}", axum::routing::get(wait_room))
        .route("/transfers/{id}", axum::routing::post(take_transfer))
        .with_state(rooms)
}

async fn take_transfer(State(rooms): State<Arc<Rooms>>, Path(id): Path<String>) -> Response {
    match rooms.take(&id) {
        Some(transfer) => Json(transfer).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no transfer {id} is offered"),
        )
            .into_response(),
    }
}

async fn wait_room(
    State(rooms): State<Arc<Rooms>>,
    Path(room): Path<u64>,
    Query(params): Query<WaitParams>,
) -> Response {
    match rooms
        .wait(room, Duration::from_millis(params.timeout_ms))
        .await
    {
        Some(info) => Json(info).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("bootstrap room {room} is not ready"),
        )
            .into_response(),
    }
}

/// Waits for `room` at the prefill engine's bootstrap server `host:port`.
///
/// # Errors
/// A message saying why the hand-over failed: the server was unreachable, or the room
/// was not ready in time.
pub(crate) async fn fetch_room(
    client: &reqwest::Client,
    host: &str,
    port: u16,
    room: u64,
    timeout: Duration,
) -> Result<RoomInfo, String> {
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let url = format!(
        "http://{host}:{port}/rooms/{room}?timeout_ms={}",
        timeout.as_millis()
    );
    let response = client
        .get(&url)
        .timeout(timeout + Duration::from_secs(2))
        .send()
        .await
        .map_err(|e| format!("bootstrap server {host}:{port} unreachable: {e}"))?;
    if !response.status().is_success() {
        return Err(format!(
            "bootstrap room {room} at {host}:{port} was not ready within {} ms",
            timeout.as_millis()
        ));
    }
    response
        .json::<RoomInfo>()
        .await
        .map_err(|e| format!("bootstrap server {host}:{port} sent a malformed answer: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_waiter_wakes_when_its_room_is_ready() {
        let rooms = Arc::new(Rooms::default());
        let waiter = tokio::spawn({
            let rooms = Arc::clone(&rooms);
            async move { rooms.wait(7, Duration::from_secs(5)).await }
        });
        tokio::task::yield_now().await;
        rooms.mark_ready(RoomInfo {
            room: 7,
            prompt_tokens: 12,
            rank: 0,
            dp_size: 1,
            page_size: None,
            transfer_backend: None,
            cached_tokens: 0,
        });
        assert_eq!(
            waiter.await.unwrap(),
            Some(RoomInfo {
                room: 7,
                prompt_tokens: 12,
                rank: 0,
                dp_size: 1,
                page_size: None,
                transfer_backend: None,
                cached_tokens: 0,
            })
        );
        assert_eq!(
            rooms.wait(7, Duration::ZERO).await.map(|r| r.room),
            Some(7),
            "late waiters see it too"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wrong_room_times_out_and_leaves_nothing_behind() {
        let rooms = Rooms::default();
        rooms.mark_ready(RoomInfo {
            room: 1,
            prompt_tokens: 1,
            rank: 0,
            dp_size: 1,
            page_size: None,
            transfer_backend: None,
            cached_tokens: 0,
        });
        assert_eq!(rooms.wait(2, Duration::from_secs(3)).await, None);
        assert_eq!(rooms.inner.lock().rooms.len(), 1);
    }

    #[test]
    fn a_room_of_another_page_size_or_backend_is_refused() {
        let room = RoomInfo {
            room: 1,
            prompt_tokens: 1,
            rank: 0,
            dp_size: 1,
            page_size: Some(16),
            transfer_backend: Some("mooncake".into()),
            cached_tokens: 0,
        };
        assert_eq!(room.refusal(16, "mooncake"), None);
        assert!(
            room.refusal(32, "mooncake")
                .unwrap()
                .contains("page_size=16")
        );
        assert!(
            room.refusal(16, "nixl")
                .unwrap()
                .contains("speaks mooncake")
        );
        let unsaid = RoomInfo {
            page_size: None,
            transfer_backend: None,
            ..room
        };
        assert_eq!(
            unsaid.refusal(32, "nixl"),
            None,
            "an older prefill says nothing"
        );
    }
}
