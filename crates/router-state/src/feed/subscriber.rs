//! The load-feed subscriber: a bounded ZeroMQ SUB socket per rank.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::{Instant, sleep};
use zeromq::{CodecError, Socket, SocketOptions, SocketRecv, SubSocket, ZmqError};

use super::{FeedHandle, FeedMemory, FeedStats, LoadFeedSource, Sequence, decode_envelope};
use crate::load_monitor::{EngineReportedLoadTable, LoadReport};

/// A SUB socket that refuses messages over `max_message_bytes` and frames `memory`
/// cannot take.
pub(crate) fn bounded_sub(max_message_bytes: usize, memory: &FeedMemory) -> SubSocket {
    SubSocket::with_options(bounded_options(max_message_bytes, memory))
}

/// Socket options refusing messages over `max_message_bytes` and frames `memory`
/// cannot take.
pub(crate) fn bounded_options(max_message_bytes: usize, memory: &FeedMemory) -> SocketOptions {
    let mut options = SocketOptions::default();
    options
        .max_message_size(max_message_bytes)
        .buffer_budget(memory.for_sockets());
    options
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
            let mut sub = bounded_sub(source.max_message_bytes, &source.memory);
            let connected = sub.connect(&source.endpoint).await;
            if let Err(e) = connected.and(sub.subscribe(&source.topic).await) {
                stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(engine = %source.engine, rank = source.rank, error = %e, "load feed connect failed");
                sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
            loop {
                match sub.recv().await {
                    Ok(message) => {
                        backoff = Duration::from_millis(50);
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
