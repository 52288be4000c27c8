//! The ZeroMQ envelope engines publish in, and the load-feed subscriber (feature
//! `zmq`).
//!
//! Every live message is three frames: topic, an 8-byte big-endian sequence (0xFF x 8
//! means "publisher reset"), and one msgpack payload. Anything else is dropped and
//! counted, never guessed at.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::engine::EngineId;

mod memory;
#[cfg(feature = "zmq")]
mod subscriber;
pub use memory::{DEFAULT_FEED_MEMORY_BYTES, FeedMemory};
#[cfg(feature = "zmq")]
pub use subscriber::spawn_load_subscriber;
#[cfg(feature = "zmq")]
pub(crate) use subscriber::{bounded_options, bounded_sub, over_budget, oversized};

/// A message's sequence frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sequence {
    /// A batch number, counting from 0 at publisher start.
    Number(u64),
    /// The publisher reset (-1).
    Reset,
}

/// One well-formed live message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The topic frame.
    pub topic: Bytes,
    /// The sequence frame.
    pub sequence: Sequence,
    /// The msgpack payload.
    pub payload: Bytes,
}

/// Why a message was dropped before its payload was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// Not three frames.
    #[error("expected 3 frames, got {0}")]
    FrameCount(usize),
    /// The sequence frame is not 8 bytes.
    #[error("the sequence frame has {0} bytes, not 8")]
    SequenceLength(usize),
}

impl EnvelopeError {
    /// Short label for drop counters.
    pub fn reason(self) -> &'static str {
        match self {
            EnvelopeError::FrameCount(_) => "frame_count",
            EnvelopeError::SequenceLength(_) => "sequence_length",
        }
    }
}

/// Checks and splits a live message.
///
/// # Errors
/// See [`EnvelopeError`].
pub fn decode_envelope(frames: Vec<Bytes>) -> Result<Envelope, EnvelopeError> {
    let [topic, sequence, payload]: [Bytes; 3] = frames
        .try_into()
        .map_err(|f: Vec<Bytes>| EnvelopeError::FrameCount(f.len()))?;
    let raw: [u8; 8] = sequence
        .as_ref()
        .try_into()
        .map_err(|_| EnvelopeError::SequenceLength(sequence.len()))?;
    let sequence = match u64::from_be_bytes(raw) {
        u64::MAX => Sequence::Reset,
        n => Sequence::Number(n),
    };
    Ok(Envelope {
        topic,
        sequence,
        payload,
    })
}

/// Where one rank of one engine publishes its load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFeedSource {
    /// The engine.
    pub engine: EngineId,
    /// The data-parallel rank (authoritative over the payload's rank).
    pub rank: u32,
    /// `tcp://host:port` of the rank's PUB socket.
    pub endpoint: String,
    /// Topic prefix to subscribe to.
    pub topic: String,
    /// The largest message accepted; a larger one closes the connection before it
    /// is read (the subscription reconnects).
    pub max_message_bytes: usize,
    /// The budget the messages being received are charged to, shared with the
    /// process's other feeds; a frame past it closes the connection.
    pub memory: FeedMemory,
}

/// The largest feed message accepted unless configured otherwise: 16 MiB, far above
/// any load report or KV-event batch a real engine publishes.
pub const DEFAULT_MAX_FEED_MESSAGE_BYTES: usize = 16 << 20;

/// Counters of a feed subscriber, shared with metrics.
#[derive(Debug, Default)]
pub struct FeedStats {
    applied: AtomicU64,
    applied_changed: Notify,
    dropped_envelope: AtomicU64,
    dropped_payload: AtomicU64,
    dropped_unknown_engine: AtomicU64,
    dropped_oversized: AtomicU64,
    dropped_over_budget: AtomicU64,
    dropped_stalled: AtomicU64,
    connect_failures: AtomicU64,
    scrape_failures: AtomicU64,
}

impl FeedStats {
    /// Reports applied so far.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Relaxed)
    }

    /// Waits until more than `seen` reports have been applied; returns the new count.
    pub async fn applied_after(&self, seen: u64) -> u64 {
        loop {
            let changed = self.applied_changed.notified();
            let applied = self.applied();
            if applied > seen {
                return applied;
            }
            changed.await;
        }
    }

    /// Counts a report read from an engine's metrics and applied.
    pub fn scraped(&self) {
        self.applied.fetch_add(1, Ordering::Relaxed);
        self.applied_changed.notify_waiters();
    }

    /// Counts a failed read of an engine's metrics.
    pub fn scrape_failed(&self) {
        self.scrape_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// `(label, count)` for reports applied and every drop reason.
    pub fn counts(&self) -> [(&'static str, u64); 9] {
        [
            ("applied", self.applied.load(Ordering::Relaxed)),
            (
                "dropped_envelope",
                self.dropped_envelope.load(Ordering::Relaxed),
            ),
            (
                "dropped_payload",
                self.dropped_payload.load(Ordering::Relaxed),
            ),
            (
                "dropped_unknown_engine",
                self.dropped_unknown_engine.load(Ordering::Relaxed),
            ),
            (
                "dropped_oversized",
                self.dropped_oversized.load(Ordering::Relaxed),
            ),
            (
                "dropped_over_budget",
                self.dropped_over_budget.load(Ordering::Relaxed),
            ),
            (
                "dropped_stalled",
                self.dropped_stalled.load(Ordering::Relaxed),
            ),
            (
                "connect_failures",
                self.connect_failures.load(Ordering::Relaxed),
            ),
            (
                "scrape_failures",
                self.scrape_failures.load(Ordering::Relaxed),
            ),
        ]
    }
}

/// A running subscriber task; dropping the handle stops it.
#[derive(Debug)]
pub struct FeedHandle(JoinHandle<()>);

impl FeedHandle {
    /// Runs `task` until the handle is dropped (a feed read some other way: an
    /// engine's metrics).
    pub fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        Self(tokio::spawn(task))
    }
}

impl Drop for FeedHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(parts: &[&[u8]]) -> Vec<Bytes> {
        parts.iter().map(|p| Bytes::copy_from_slice(p)).collect()
    }

    #[test]
    fn decodes_the_three_frame_envelope() {
        let e = decode_envelope(frames(&[b"load", &7u64.to_be_bytes(), b"\x90"])).unwrap();
        assert_eq!(
            (e.topic.as_ref(), e.sequence, e.payload.as_ref()),
            (&b"load"[..], Sequence::Number(7), &b"\x90"[..])
        );
        let reset = decode_envelope(frames(&[b"", &[0xFF; 8], b""])).unwrap();
        assert_eq!(reset.sequence, Sequence::Reset);
    }

    #[test]
    fn drops_malformed_envelopes_with_a_reason() {
        let two = decode_envelope(frames(&[b"", b"\x90"])).unwrap_err();
        assert_eq!(
            (two, two.reason()),
            (EnvelopeError::FrameCount(2), "frame_count")
        );
        let short = decode_envelope(frames(&[b"", &[0, 1], b"\x90"])).unwrap_err();
        assert_eq!(short.to_string(), "the sequence frame has 2 bytes, not 8");
    }
}
