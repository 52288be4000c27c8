//! The load-feed subscriber: a bounded ZeroMQ SUB socket per rank.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::{Instant, Interval, MissedTickBehavior, interval_at, sleep};
use zeromq::{CodecError, Socket, SocketOptions, SocketRecv, SubSocket, ZmqError};

use super::memory::ConnectionMemory;
use super::{FeedHandle, FeedMemory, FeedStats, LoadFeedSource, Sequence, decode_envelope};
use crate::load_monitor::{EngineReportedLoadTable, LoadReport};

/// How long a message may take to arrive whole once it holds some of the feeds'
/// memory (past its first 64 KiB), at least; at most twice that.
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A SUB socket that refuses messages over `max_message_bytes` and frames `memory`
/// cannot take, and the watch on its messages stalling half received.
pub(crate) fn bounded_sub(
    max_message_bytes: usize,
    memory: &FeedMemory,
) -> (SubSocket, StallWatch) {
    let connection = memory.connection();
    let options = bounded_options(max_message_bytes, Arc::clone(&connection));
    (
        SubSocket::with_options(options),
        StallWatch::new(connection),
    )
}

/// Socket options refusing messages over `max_message_bytes` and frames
/// `connection`'s budget cannot take.
pub(crate) fn bounded_options(
    max_message_bytes: usize,
    connection: Arc<ConnectionMemory>,
) -> SocketOptions {
    let mut options = SocketOptions::default();
    options
        .max_message_size(max_message_bytes)
        .buffer_budget(connection);
    options
}

/// Watches one connection for a message stalled half received: one holding the
/// feeds' memory at two checks [`STALL_TIMEOUT`] apart, with no message received
/// between them. Its charge would otherwise stay until the connection closed.
pub(crate) struct StallWatch {
    connection: Arc<ConnectionMemory>,
    checks: Interval,
    received: u64,
    /// Messages received, and whether the connection held memory, at the last check.
    last: (u64, bool),
}

impl StallWatch {
    fn new(connection: Arc<ConnectionMemory>) -> Self {
        let mut checks = interval_at(Instant::now() + STALL_TIMEOUT, STALL_TIMEOUT);
        checks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            connection,
            checks,
            received: 0,
            last: (0, false),
        }
    }

    /// Counts a message received whole.
    pub(crate) fn received(&mut self) {
        self.received += 1;
    }

    /// Resolves once a message has stalled.
    pub(crate) async fn stalled(&mut self) {
        loop {
            self.checks.tick().await;
            let holding = self.connection.held() > 0;
            if holding && self.last == (self.received, true) {
                return;
            }
            self.last = (self.received, holding);
        }
    }
}

/// Whether a receive failed because the peer sent a message over the socket's limit.
pub(crate) fn oversized(error: &ZmqError) -> bool {
    matches!(error, ZmqError::Codec(CodecError::MessageTooLarge))
}

/// Whether a receive failed because the feeds' memory budget could not take a frame.
pub(crate) fn over_budget(error: &ZmqError) -> bool {
    matches!(error, ZmqError::Codec(CodecError::OverBudget))
}

/// Subscribes to one rank's load feed and applies every report to `table`. The
/// subscription reconnects with backoff until the handle is dropped.
pub fn spawn_load_subscriber(
    table: Arc<EngineReportedLoadTable>,
    source: LoadFeedSource,
    stats: Arc<FeedStats>,
) -> FeedHandle {
    FeedHandle::spawn(async move {
        let mut backoff = Duration::from_millis(50);
        loop {
            let (mut sub, mut watch) = bounded_sub(source.max_message_bytes, &source.memory);
            let connected = sub.connect(&source.endpoint).await;
            if let Err(e) = connected.and(sub.subscribe(&source.topic).await) {
                stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(engine = %source.engine, rank = source.rank, error = %e, "load feed connect failed");
                sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
            loop {
                let received = tokio::select! {
                    received = sub.recv() => received,
                    () = watch.stalled() => {
                        stats.dropped_stalled.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(engine = %source.engine, rank = source.rank, "a load feed message stalled half received; reconnecting");
                        break;
                    }
                };
                match received {
                    Ok(message) => {
                        backoff = Duration::from_millis(50);
                        watch.received();
                        apply(&table, &source, &stats, message.into_vec());
                    }
                    Err(e) => {
                        if oversized(&e) {
                            stats.dropped_oversized.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(engine = %source.engine, rank = source.rank, limit = source.max_message_bytes, "load feed message over the size limit; reconnecting");
                        } else if over_budget(&e) {
                            stats.dropped_over_budget.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(engine = %source.engine, rank = source.rank, budget = source.memory.limit(), "the feeds' memory budget is spent: a load feed message was refused; reconnecting");
                        }
                        break;
                    }
                }
            }
            // The connection broke (or the engine sent what the socket refuses): wait
            // before the next attempt, longer each time nothing arrives in between.
            sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    })
}

fn apply(
    table: &EngineReportedLoadTable,
    source: &LoadFeedSource,
    stats: &FeedStats,
    frames: Vec<Bytes>,
) {
    let envelope = match decode_envelope(frames) {
        Ok(e) if e.sequence != Sequence::Reset => e,
        _ => {
            stats.dropped_envelope.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let report = match LoadReport::decode(&envelope.payload) {
        Ok(report) => report,
        Err(e) => {
            stats.dropped_payload.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(engine = %source.engine, reason = e.reason(), "load report dropped");
            return;
        }
    };
    match table.ingest(&source.engine, source.rank, report, Instant::now()) {
        Ok(()) => {
            stats.applied.fetch_add(1, Ordering::Relaxed);
            stats.applied_changed.notify_waiters();
        }
        Err(_) => {
            stats.dropped_unknown_engine.fetch_add(1, Ordering::Relaxed);
        }
    }
}
