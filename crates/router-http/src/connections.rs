//! Client connections: every accepted socket gets `TCP_NODELAY`, the send buffer
//! `limits.client_send_buffer_bytes` sets (so the write deadline starts once that much
//! waits, not once the kernel's grown buffer of up to megabytes is full), one of
//! `limits.max_connections` slots, and head, idle and write deadlines ([`deadlines`]);
//! on shutdown the listener closes and open connections finish their requests within
//! the grace period, after which they are closed.
//!
//! Idle connections cannot hold slots against new ones: a connection that arrives
//! when every slot is taken closes the oldest connection that is not serving a
//! request (kept alive between requests, or yet to send its first head), and takes
//! its slot (the closing one finishes what it is writing). When every slot serves a request, up to [`PROBE_SLOTS`] more
//! connections are taken on the public address that answer only the probes
//! (`/health`, `/ready`, `/metrics`; anything else gets 503 `overloaded`), one
//! request each, so
//! liveness and readiness checks are always answered; past those, connections wait
//! in the listen backlog.

mod deadlines;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::{Service as _, service_fn};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use crate::validated::ClientLimits;
use deadlines::{Deadlines, Guarded, Phase, Tracked};

/// How often a connection waiting for a slot looks again for an idle connection to
/// close or a probe slot.
const RECHECK: Duration = Duration::from_millis(100);

/// Connections taken past `limits.max_connections` while every slot serves a
/// request, answering only the probes.
pub const PROBE_SLOTS: usize = 16;

/// What a listener serves: every route, and (on the public address) the probes
/// alone for connections past the limit.
pub(crate) struct Apps {
    pub(crate) full: axum::Router,
    pub(crate) probes: Option<axum::Router>,
}

/// A connection's phase and the signal that closes it.
type Closable = (Arc<Phase>, Arc<Notify>);

/// The open connections by age (oldest first), with what it takes to close one.
#[derive(Default)]
struct Open {
    connections: Mutex<BTreeMap<u64, Closable>>,
}

impl Open {
    /// Asks the oldest connection that is not serving a request to close (it
    /// finishes writing what it has), and forgets it; `false` when every one is.
    fn close_an_idle_one(&self) -> bool {
        let mut connections = self.connections.lock();
        let idle = connections
            .iter()
            .find(|(_, (phase, _))| !phase.is_busy())
            .map(|(id, _)| *id);
        match idle.and_then(|id| connections.remove(&id)) {
            Some((_, close)) => {
                close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Serves `apps` on `listener` until `stopped` turns true, then drains.
pub(crate) async fn serve(
    listener: TcpListener,
    apps: Apps,
    limits: ClientLimits,
    mut stopped: watch::Receiver<bool>,
    grace: Duration,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let probe_slots = Arc::new(Semaphore::new(if apps.probes.is_some() {
        PROBE_SLOTS
    } else {
        0
    }));
    let open = Arc::new(Open::default());
    let deadlines = Deadlines {
        head: limits.header,
        idle: limits.idle,
        write: limits.write,
    };
    let mut builder = http1::Builder::new();
    // The socket keeps the head deadline itself: hyper's would also count the idle
    // time before a head.
    builder.header_read_timeout(None);
    // A connection past the limit answers one probe and closes, so probes cannot
    // keep the probe slots.
    let mut probe_builder = builder.clone();
    probe_builder.keep_alive(false);
    let mut connections = JoinSet::new();
    for id in 0_u64.. {
        let (stream, slot) = tokio::select! {
            biased;
            _ = stopped.wait_for(|s| *s) => break,
            accepted = accept(&listener, &slots, &probe_slots, &open) => accepted,
        };
        while connections.try_join_next().is_some() {}
        configure(&stream, limits.send_buffer);
        let (app, close) = match (&apps.probes, slot.probes_only) {
            (Some(probes), true) => (probes.clone(), None),
            _ => (apps.full.clone(), Some(Arc::new(Notify::new()))),
        };
        let phase = Phase::new();
        if let Some(close) = &close {
            open.connections
                .lock()
                .insert(id, (Arc::clone(&phase), Arc::clone(close)));
        }
        let stream = Guarded::new(stream, deadlines, Arc::clone(&phase));
        let app = TowerToHyperService::new(app);
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
        let chosen = if slot.probes_only {
            &probe_builder
        } else {
            &builder
        };
        let connection = chosen.serve_connection(TokioIo::new(stream), service);
        let open = Arc::clone(&open);
        let mut stopping = stopped.clone();
        connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            // Shutdown, or a new connection taking this idle one's slot: the
            // connection finishes the request it is serving, if any, then closes.
            let asked = async {
                tokio::select! {
                    _ = stopping.wait_for(|s| *s) => {}
                    () = async {
                        match &close {
                            Some(close) => close.notified().await,
                            None => std::future::pending().await,
                        }
                    } => tracing::debug!("an idle client connection closes for a new one"),
                }
            };
            let served = tokio::select! {
                served = connection.as_mut() => served,
                () = asked => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "client connection closed with an error");
            }
            open.connections.lock().remove(&id);
            drop(slot);
        });
    }
    drop(listener);
    let drained = async { while connections.join_next().await.is_some() {} };
    tokio::select! {
        () = drained => {}
        () = tokio::time::sleep(grace) => {
            tracing::warn!(?grace, "grace period over; closing remaining connections");
        }
    }
    connections.abort_all();
}

/// What a connection holds, given back when it closes: a slot of `max_connections`,
/// or one that answers the probes alone.
struct Slot {
    _held: OwnedSemaphorePermit,
    probes_only: bool,
}

impl Slot {
    fn full(held: OwnedSemaphorePermit) -> Self {
        Self {
            _held: held,
            probes_only: false,
        }
    }
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

/// The next connection and its slot: a free one; else the slot of an idle
/// connection it closes; else, while every slot serves a request, a probe slot; else
/// the first slot freed. A failed accept (say, out of file descriptors) is logged and
/// retried after a pause instead of spinning.
async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    probe_slots: &Arc<Semaphore>,
    open: &Open,
) -> (TcpStream, Slot) {
    let stream = loop {
        match listener.accept().await {
            Ok((stream, _)) => break stream,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    loop {
        if let Ok(slot) = Arc::clone(slots).try_acquire_owned() {
            return (stream, Slot::full(slot));
        }
        if !open.close_an_idle_one()
            && let Ok(slot) = Arc::clone(probe_slots).try_acquire_owned()
        {
            return (
                stream,
                Slot {
                    _held: slot,
                    probes_only: true,
                },
            );
        }
        // A slot frees when a connection closes (the idle one asked to, or one
        // whose request ended); meanwhile, look again for an idle connection or a
        // probe slot now and then.
        if let Ok(Ok(slot)) = tokio::time::timeout(RECHECK, Arc::clone(slots).acquire_owned()).await
        {
            return (stream, Slot::full(slot));
        }
    }
}
