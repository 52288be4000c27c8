//! One subscriber task per (engine, rank): a SUB socket for live batches and a
//! DEALER for replay, keeping the index in step with the engine's cache.
//!
//! The source is *bootstrapping* until its history is replayed, *live* while
//! sequence numbers arrive in order, and *degraded* while a gap is being repaired
//! (lookups ignore it meanwhile). A replay applies its batches one at a time as they
//! arrive, within a deadline. A forward gap asks the replay socket for the missing
//! range; history that cannot be replayed (gone from the buffer, no replay socket, no
//! end marker in time) clears the source. A sequence that goes backwards is a new
//! incarnation of the publisher: the source is cleared before the batch is applied.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio::time::{sleep, timeout};
use xxhash_rust::xxh3::xxh3_64;
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, ZmqMessage};

use super::index::PrefixIndex;
use super::wire::{KvBatch, decode_batch};
use crate::engine::EngineId;
use crate::feed::{
    FeedHandle, FeedMemory, Sequence, bounded_options, bounded_sub, decode_envelope, over_budget,
    oversized,
};

/// How long a replay may go quiet before it counts as failed.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);

/// The most batches one replay may bring (SGLang's and vLLM's publishers keep 10,000
/// by default); the history past them is not replayed (`replay_too_large`).
const MAX_REPLAY_BATCHES: usize = 16_384;

/// The longest a replay may take in all; what it applied by then stays, the rest
/// is left to the next live batch's repair (`replay_too_slow`).
const REPLAY_DEADLINE: Duration = Duration::from_secs(30);

/// After (re)connecting, when to ask the replay socket once more for anything
/// published while the subscription was reaching the engine (ZeroMQ's slow joiner):
/// such a batch is otherwise noticed only when the next one arrives.
const CATCH_UP_AFTER: Duration = Duration::from_millis(500);

/// Where one rank of one engine publishes KV events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvSource {
    /// The engine.
    pub engine: EngineId,
    /// The data-parallel rank (authoritative over the payload's rank).
    pub rank: u32,
    /// `tcp://host:port` of the rank's PUB socket.
    pub endpoint: String,
    /// `tcp://host:port` of the rank's replay ROUTER, if it has one.
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to.
    pub topic: String,
    /// The largest message accepted, live or replayed; a larger one closes the
    /// connection before it is read.
    pub max_message_bytes: usize,
    /// The budget the messages being received (and a batch kept while its gap is
    /// repaired) are charged to, shared with the process's other feeds.
    pub memory: FeedMemory,
}

/// Counters of the KV-event subscribers of one index, for metrics.
#[derive(Debug, Default)]
pub struct KvFeedStats {
    applied: AtomicU64,
    steps: AtomicU64,
    stepped: Notify,
    gaps: AtomicU64,
    catch_ups: AtomicU64,
    replays: AtomicU64,
    replay_failures: AtomicU64,
    restarts: AtomicU64,
    clears: AtomicU64,
    degraded: AtomicU64,
    disconnects: AtomicU64,
    dropped: parking_lot::Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

impl KvFeedStats {
    /// Batches applied so far.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Relaxed)
    }

    /// Messages (live batches, replays) fully handled so far. Whenever it moves, the
    /// index reflects everything the subscribers had received.
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::Relaxed)
    }

    /// Waits until more than `seen` steps are done; returns the count.
    pub async fn steps_after(&self, seen: u64) -> u64 {
        loop {
            let changed = self.stepped.notified();
            let steps = self.steps();
            if steps > seen {
                return steps;
            }
            changed.await;
        }
    }

    fn step(&self) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.stepped.notify_waiters();
    }

    /// `(name, count)` of every counter: gaps, catch-ups (batches the live stream
    /// missed right after connecting, found by replay), replays, replay failures,
    /// restarts, clears, disconnects, sources degraded now.
    pub fn counters(&self) -> [(&'static str, u64); 8] {
        [
            ("gaps", self.gaps.load(Ordering::Relaxed)),
            ("catch_ups", self.catch_ups.load(Ordering::Relaxed)),
            ("replays", self.replays.load(Ordering::Relaxed)),
            (
                "replay_failures",
                self.replay_failures.load(Ordering::Relaxed),
            ),
            ("restarts", self.restarts.load(Ordering::Relaxed)),
            ("clears", self.clears.load(Ordering::Relaxed)),
            ("disconnects", self.disconnects.load(Ordering::Relaxed)),
            ("degraded_sources", self.degraded.load(Ordering::Relaxed)),
        ]
    }

    /// Events and batches dropped or skipped, by reason.
    pub fn dropped(&self) -> Vec<(&'static str, u64)> {
        self.dropped.lock().iter().map(|(k, v)| (*k, *v)).collect()
    }

    fn drop_reason(&self, reason: &'static str) {
        *self.dropped.lock().entry(reason).or_default() += 1;
    }
}

/// Subscribes to one source and keeps `index` in step with it until the handle is
/// dropped.
///
/// A lost connection clears the source (the engine may come back as a new
/// incarnation with an empty cache); the next connection replays its history again.
pub fn spawn_kv_subscriber(
    index: Arc<PrefixIndex>,
    source: KvSource,
    stats: Arc<KvFeedStats>,
) -> FeedHandle {
    FeedHandle::spawn(async move {
        let mut stream = Stream {
            index: &index,
            source: &source,
            stats: &stats,
            next: None,
            last: None,
            replayed: VecDeque::new(),
        };
        let mut backoff = Duration::from_millis(50);
        loop {
            let (mut sub, mut watch) = bounded_sub(source.max_message_bytes, &source.memory);
            let mut monitor = sub.monitor();
            let connected = sub.connect(&source.endpoint).await;
            if connected.and(sub.subscribe(&source.topic).await).is_err() {
                sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
            stream.bootstrap().await;
            stats.step();
            let catch_up = sleep(CATCH_UP_AFTER);
            tokio::pin!(catch_up);
            let mut caught_up = false;
            loop {
                tokio::select! {
                    () = &mut catch_up, if !caught_up => {
                        caught_up = true;
                        stream.catch_up().await;
                        stats.step();
                    }
                    () = watch.stalled() => {
                        stats.drop_reason("stalled");
                        tracing::warn!(engine = %source.engine, rank = source.rank, "a KV-event message stalled half received; reconnecting");
                        break;
                    }
                    message = sub.recv() => match message {
                        Ok(message) => {
                            backoff = Duration::from_millis(50);
                            watch.received();
                            stream.live(message.into_vec()).await;
                            stats.step();
                        }
                        Err(e) => {
                            if oversized(&e) {
                                stats.drop_reason("oversized");
                                tracing::warn!(engine = %source.engine, rank = source.rank, limit = source.max_message_bytes, "KV-event message over the size limit; reconnecting");
                            } else if over_budget(&e) {
                                stats.drop_reason("over_budget");
                                tracing::warn!(engine = %source.engine, rank = source.rank, budget = source.memory.limit(), "the feeds' memory budget is spent: a KV-event message was refused; reconnecting");
                            }
                            break;
                        }
                    },
                    event = monitor.next() => {
                        if matches!(event, None | Some(SocketEvent::Disconnected(_))) {
                            break;
                        }
                    }
                }
            }
            stats.disconnects.fetch_add(1, Ordering::Relaxed);
            stream.forget();
            stats.step();
            // Wait before reconnecting, longer each time no batch arrived in between:
            // an engine that keeps sending what the socket refuses cannot spin us.
            sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    })
}

/// How a batch reached the subscriber: published just now, or from the replay
/// buffer (whose stamps say when it was published, not how far behind the feed is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrival {
    Live,
    Replayed,
}

/// What a replay does when its first batch is later than the one asked for (the
/// older ones are gone from the engine's buffer), or not the one expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    /// Applies from there (a bootstrap: the buffer is all the history there is).
    Accept,
    /// Clears the source, then applies from there.
    StartOver,
    /// Applies nothing (a repair, which its caller then gives up).
    GiveUp,
    /// The first batch asked for is the last one applied, whose payload digest this
    /// is: it is skipped, and the rest applied. A later first batch starts over as
    /// [`Gone::StartOver`] (the batch may have left the buffer, or the engine may have
    /// restarted and published past it: which, the replay cannot tell); none, or
    /// another batch under its number, ends the replay as [`End::NotHeld`].
    Held(u64),
}

/// How a replay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// With the engine's end marker.
    Complete,
    /// Before it: no answer, a timeout, a malformed or refused message, too many
    /// batches.
    Broken,
    /// At its first batch, by [`Gone::GiveUp`].
    GaveUp,
    /// At its start, by [`Gone::Held`]: the engine no longer holds the last batch
    /// applied, so its sequence began again (a restart) since.
    NotHeld,
}

/// What a replay did.
#[derive(Debug, Clone, Copy)]
struct Replay {
    end: End,
    applied: usize,
    started_over: bool,
}

struct Stream<'a> {
    index: &'a PrefixIndex,
    source: &'a KvSource,
    stats: &'a KvFeedStats,
    /// The sequence number expected next, once known.
    next: Option<u64>,
    /// `(seq, payload digest)` of the last batch applied, the one before `next`.
    last: Option<(u64, u64)>,
    /// `(seq, payload digest)` of batches applied from a replay whose live copies
    /// may still arrive. The digest tells a late copy from a new incarnation's batch
    /// that reuses the number.
    replayed: VecDeque<(u64, u64)>,
}

impl Stream<'_> {
    /// Replays the engine's whole buffered history (when it has a replay socket).
    async fn bootstrap(&mut self) {
        if self.source.replay_endpoint.is_none() {
            return;
        }
        if self.replay(0, Gone::Accept).await.end == End::Complete {
            self.next = Some(self.next.unwrap_or(0));
        }
    }

    async fn live(&mut self, frames: Vec<Bytes>) {
        let envelope = match decode_envelope(frames) {
            Ok(e) => e,
            Err(e) => return self.stats.drop_reason(e.reason()),
        };
        let seq = match envelope.sequence {
            Sequence::Reset => return self.forget(),
            Sequence::Number(seq) => seq,
        };
        if self.is_replayed_copy(seq, &envelope.payload) {
            return;
        }
        if self.next.is_some_and(|next| seq < next) {
            // A new incarnation: nothing of the old one survives.
            self.stats.restarts.fetch_add(1, Ordering::Relaxed);
            self.clear();
            self.next = Some(0);
            self.last = None;
        }
        match self.next {
            Some(next) if seq > next => {
                self.stats.gaps.fetch_add(1, Ordering::Relaxed);
                self.repair(next, seq, &envelope.payload).await;
            }
            _ => self.apply_at(
                seq,
                &envelope.payload,
                xxh3_64(&envelope.payload),
                Arrival::Live,
            ),
        }
    }

    /// Applies whatever the engine published since `next` that the live stream has
    /// not delivered (see [`CATCH_UP_AFTER`]). It asks from the last batch applied
    /// on: an engine that no longer holds that batch restarted meanwhile (its new
    /// numbers are below the ones asked for), and its whole history replaces the
    /// source's.
    async fn catch_up(&mut self) {
        let Some(next) = self.next else {
            return;
        };
        if self.source.replay_endpoint.is_none() {
            return;
        }
        let replay = match self.last {
            Some((seq, digest)) if seq + 1 == next => {
                let replay = self.replay(seq, Gone::Held(digest)).await;
                if replay.end == End::NotHeld {
                    // A new incarnation: nothing of the old one survives, and its own
                    // history is replayed as on connecting.
                    self.stats.restarts.fetch_add(1, Ordering::Relaxed);
                    self.forget();
                    self.bootstrap().await;
                    return;
                }
                replay
            }
            _ => self.replay(next, Gone::StartOver).await,
        };
        if replay.end == End::Complete && replay.applied > 0 && !replay.started_over {
            self.stats.catch_ups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Fills `[next, seq)` from the replay socket, then applies `payload` (batch
    /// `seq`) unless the replay already covered it. Lookups ignore the source
    /// meanwhile: its history has a hole. The batch is kept, charged to the feeds' memory, until then.
    async fn repair(&mut self, next: u64, seq: u64, payload: &[u8]) {
        self.index
            .set_degraded(&self.source.engine, self.source.rank, true);
        self.stats.degraded.fetch_add(1, Ordering::Relaxed);
        let held = self.source.memory.hold(payload.len());
        let replayed = match &held {
            Some(_) => self.replay(next, Gone::GiveUp).await.end != End::GaveUp,
            None => {
                self.stats.drop_reason("over_budget");
                tracing::warn!(engine = %self.source.engine, rank = self.source.rank, budget = self.source.memory.limit(), "the feeds' memory budget is spent: a KV-event gap is not repaired");
                false
            }
        };
        if !replayed || self.next.is_none_or(|after| after < seq) {
            // The missing history is gone: forget this source and start over here.
            self.stats.replay_failures.fetch_add(1, Ordering::Relaxed);
            self.clear();
            self.next = None;
            self.last = None;
        }
        match self.next {
            Some(after) if after > seq => {
                // The replay applied it; it still says how far behind the feed is.
                if let Ok(batch) = decode_batch(payload) {
                    self.record_age(&batch);
                }
            }
            _ => self.apply_at(seq, payload, xxh3_64(payload), Arrival::Live),
        }
        drop(held);
        self.index
            .set_degraded(&self.source.engine, self.source.rank, false);
        self.stats.degraded.fetch_sub(1, Ordering::Relaxed);
    }

    /// Asks for every buffered batch from `start` on and applies each as it arrives,
    /// so a replay holds one batch at a time; `next` follows the last one applied.
    /// Batches applied before a replay breaks off are the history up to theirs, in
    /// order: the next live batch finds the rest missing. Meanwhile lookups see the
    /// history applied so far, as they see a feed that lags; a replay ends within
    /// [`REPLAY_DEADLINE`], so that lasts no longer.
    async fn replay(&mut self, start: u64, gone: Gone) -> Replay {
        let deadline = tokio::time::Instant::now() + REPLAY_DEADLINE;
        match tokio::time::timeout_at(deadline, self.replay_batches(start, gone)).await {
            Ok(replay) => replay,
            Err(_) => {
                self.stats.drop_reason("replay_too_slow");
                Replay {
                    end: End::Broken,
                    applied: 0,
                    started_over: false,
                }
            }
        }
    }

    async fn replay_batches(&mut self, start: u64, gone: Gone) -> Replay {
        let mut replay = Replay {
            end: End::Broken,
            applied: 0,
            started_over: false,
        };
        let Some(endpoint) = &self.source.replay_endpoint else {
            return replay;
        };
        self.stats.replays.fetch_add(1, Ordering::Relaxed);
        let options = bounded_options(
            self.source.max_message_bytes,
            self.source.memory.connection(),
        );
        let mut dealer = DealerSocket::with_options(options);
        let connected = timeout(REPLAY_TIMEOUT, dealer.connect(endpoint)).await;
        let request = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&start.to_be_bytes()),
        ]);
        let (Ok(Ok(())), Ok(request)) = (connected, request) else {
            return replay;
        };
        if dealer.send(request).await.is_err() {
            return replay;
        }
        let mut last = None;
        loop {
            if replay.applied >= MAX_REPLAY_BATCHES {
                // The rest of the engine's history is unknown.
                self.stats.drop_reason("replay_too_large");
                return replay;
            }
            let frames = match timeout(REPLAY_TIMEOUT, dealer.recv()).await {
                Ok(Ok(message)) => message.into_vec(),
                Ok(Err(e)) => {
                    if oversized(&e) {
                        self.stats.drop_reason("oversized");
                    } else if over_budget(&e) {
                        self.stats.drop_reason("over_budget");
                    }
                    return replay;
                }
                Err(_) => return replay,
            };
            // [empty, topic, seq, payload], or [empty, seq, payload] from older builds.
            let (seq, payload) = match frames.as_slice() {
                [_, _, seq, payload] | [_, seq, payload] => (seq, payload),
                _ => return replay,
            };
            if seq.is_empty() || seq.as_ref() == [0xFF; 8] {
                replay.end = match (gone, last) {
                    (Gone::Held(_), None) => End::NotHeld,
                    _ => End::Complete,
                };
                return replay;
            }
            let Ok(seq) = <[u8; 8]>::try_from(seq.as_ref()).map(u64::from_be_bytes) else {
                return replay;
            };
            let digest = xxh3_64(payload);
            match (last, gone) {
                (Some(last), _) if seq <= last => return replay,
                (Some(_), _) | (None, Gone::Accept) => {}
                (None, Gone::Held(held)) if seq == start && digest == held => {
                    last = Some(seq);
                    continue;
                }
                (None, Gone::Held(_)) if seq <= start => {
                    replay.end = End::NotHeld;
                    return replay;
                }
                (None, _) if seq == start => {}
                (None, Gone::StartOver | Gone::Held(_)) => {
                    // Even the batches asked for are gone: start over from what is
                    // buffered.
                    self.stats.replay_failures.fetch_add(1, Ordering::Relaxed);
                    self.clear();
                    replay.started_over = true;
                }
                (None, Gone::GiveUp) => {
                    replay.end = End::GaveUp;
                    return replay;
                }
            }
            self.apply_at(seq, payload, digest, Arrival::Replayed);
            self.replayed.push_back((seq, digest));
            last = Some(seq);
            replay.applied += 1;
        }
    }

    /// Whether a live batch is the late copy of one already applied from a replay.
    /// Copies arrive in order, so everything before a match is no longer expected.
    fn is_replayed_copy(&mut self, seq: u64, payload: &[u8]) -> bool {
        if self.replayed.is_empty() {
            return false;
        }
        let digest = xxh3_64(payload);
        match self
            .replayed
            .iter()
            .position(|entry| *entry == (seq, digest))
        {
            Some(at) => {
                self.replayed.drain(..=at);
                true
            }
            None => {
                self.replayed.clear();
                false
            }
        }
    }

    /// Applies one batch; a live one also records how far behind the feed is, before
    /// the batch counts as applied.
    fn apply(&self, payload: &[u8], arrival: Arrival) {
        match decode_batch(payload) {
            Ok(batch) => {
                for dropped in &batch.dropped {
                    self.stats.drop_reason(dropped.reason());
                }
                let outcome = self
                    .index
                    .apply(&self.source.engine, self.source.rank, &batch);
                for skipped in outcome.skipped {
                    self.stats.drop_reason(skipped.as_str());
                }
                if outcome.cleared {
                    self.stats.clears.fetch_add(1, Ordering::Relaxed);
                }
                if arrival == Arrival::Live {
                    self.record_age(&batch);
                }
            }
            Err(e) => self.stats.drop_reason(e.reason()),
        }
        self.stats.applied.fetch_add(1, Ordering::Relaxed);
    }

    /// Applies batch `seq`, whose payload has `digest` (see [`apply`](Self::apply));
    /// `seq + 1` is expected next.
    fn apply_at(&mut self, seq: u64, payload: &[u8], digest: u64, arrival: Arrival) {
        self.apply(payload, arrival);
        self.next = Some(seq + 1);
        self.last = Some((seq, digest));
    }

    /// Records how far behind the feed was when the live `batch` arrived.
    fn record_age(&self, batch: &KvBatch) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.index
            .set_feed_age(&self.source.engine, self.source.rank, batch.age_at(now));
    }

    /// Drops everything known of this source and its position in the stream.
    fn forget(&mut self) {
        self.clear();
        self.next = None;
        self.last = None;
        self.replayed.clear();
    }

    fn clear(&self) {
        self.index
            .clear_source(&self.source.engine, self.source.rank);
        self.stats.clears.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
