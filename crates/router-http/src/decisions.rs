//! Decision records (the `decisions` section): for a sample of routed requests, one
//! JSON line with the explanation of the selection and what came back. Lines go
//! through a bounded queue to a writer thread; a full queue drops the record
//! (counted), so recording never makes a request wait. The files are created
//! readable by the router's user alone, and with `hash_keys` a request's session and
//! routing keys are recorded as keyed hashes. With `replayable`, a record also
//! carries what `switchyard replay --records` needs ([`replay`]).

use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, RandomState};
use std::io::{BufWriter, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;

use crate::metrics::OutcomeLabels;
use crate::share::Share;
use router_config::DecisionsConfig;

pub(crate) mod replay;

/// How often a dropped or failed record is logged, at most.
const LOG_INTERVAL: Duration = Duration::from_secs(10);
/// The longest record written; a longer one (a fleet of thousands of candidates) is
/// dropped.
pub(crate) const MAX_RECORD_BYTES: usize = 256 << 10;
/// The most bytes of records waiting for the writer, whatever the queue's length.
const MAX_QUEUED_BYTES: u64 = 64 << 20;

/// The sampler and the queue to the writer thread.
#[derive(Debug)]
pub(crate) struct DecisionLog {
    /// The requests recorded.
    sampled: Share,
    queue: SyncSender<String>,
    /// Bytes of the records in the queue.
    queued: Arc<AtomicU64>,
    counts: Counts,
    /// With `hash_keys`: the keyed hash (SipHash, keys drawn per process) session and
    /// routing keys are recorded as.
    key_hashing: Option<RandomState>,
    /// With `replayable`: the keyed hash (SipHash, keys drawn per process) page
    /// hashes are recorded as ([`replay`]).
    page_hashing: Option<RandomState>,
    /// Recorded requests being tokenized for their pages alone, at most
    /// [`RECORD_TOKENIZING`] at once.
    tokenizing: Arc<Semaphore>,
}

/// Recorded requests tokenized for their records alone (their model's routing reads no
/// prompt) at once, at most; a recorded request finding none free is recorded without
/// its pages. It bounds the bodies such records keep, and the tokenizing threads they
/// take from routing.
pub(crate) const RECORD_TOKENIZING: usize = 1;

/// `switchyard_decision_records_total` by outcome, and when a problem was last
/// logged.
#[derive(Debug, Clone)]
struct Counts {
    family: Family<OutcomeLabels, Counter>,
    logged: Arc<Mutex<Option<Instant>>>,
}

impl Counts {
    fn count(&self, outcome: &'static str, records: u64) {
        self.family
            .get_or_create(&OutcomeLabels { outcome })
            .inc_by(records);
    }

    /// Counts a record lost for `why`, logging at most every [`LOG_INTERVAL`].
    fn lost(&self, outcome: &'static str, why: &dyn std::fmt::Display) {
        self.count(outcome, 1);
        let now = Instant::now();
        let mut logged = self.logged.lock();
        if logged.is_none_or(|at| now.saturating_duration_since(at) >= LOG_INTERVAL) {
            *logged = Some(now);
            tracing::warn!(outcome, "a decision record was lost: {why}");
        }
    }
}

impl DecisionLog {
    /// Opens (or creates) the file and starts the writer thread, which ends when the
    /// log is dropped.
    ///
    /// # Errors
    /// The file cannot be opened for appending.
    pub(crate) fn open(
        config: &DecisionsConfig,
        family: Family<OutcomeLabels, Counter>,
    ) -> std::io::Result<Self> {
        for outcome in ["written", "dropped", "failed", "unpaged"] {
            drop(family.get_or_create(&OutcomeLabels { outcome }));
        }
        let file = append(&config.path)?;
        let metadata = file.metadata()?;
        warn_if_shared(&config.path, &metadata);
        let size = metadata.len();
        let (queue, lines) = sync_channel(config.queue);
        let counts = Counts {
            family,
            logged: Arc::default(),
        };
        let queued = Arc::new(AtomicU64::new(0));
        let writer = Writer {
            path: config.path.clone(),
            max_bytes: config.max_file_bytes,
            out: Some(BufWriter::new(file)),
            size,
            queued: Arc::clone(&queued),
            counts: counts.clone(),
        };
        std::thread::Builder::new()
            .name("decision-records".into())
            .spawn(move || writer.run(&lines))?;
        Ok(Self {
            sampled: Share::new(config.sample_ratio),
            queue,
            queued,
            counts,
            key_hashing: config.hash_keys.then(RandomState::new),
            page_hashing: config.replayable.then(RandomState::new),
            tokenizing: Arc::new(Semaphore::new(RECORD_TOKENIZING)),
        })
    }

    /// `decision`'s session and routing keys replaced by their keyed hashes (16 hex
    /// digits), when keys are hashed.
    fn conceal_keys(&self, decision: &mut Value) {
        let Some(hashing) = &self.key_hashing else {
            return;
        };
        for field in ["session_key", "routing_key"] {
            if let Some(Value::String(key)) = decision
                .get_mut("request")
                .and_then(|request| request.get_mut(field))
            {
                *key = format!("{:016x}", hashing.hash_one(key.as_str()));
            }
        }
    }

    /// Whether this request is recorded: exactly every `1 / sample_ratio`-th one.
    pub(crate) fn sample(&self) -> bool {
        self.sampled.take()
    }

    /// With `replayable`, the keyed hash page hashes are recorded as ([`replay`]).
    pub(crate) fn page_hashing(&self) -> Option<&RandomState> {
        self.page_hashing.as_ref()
    }

    /// Leave to tokenize one recorded request for its record alone, while it is held;
    /// `None` (counted as `unpaged`) when [`RECORD_TOKENIZING`] are being tokenized.
    pub(crate) fn tokenizing(&self) -> Option<OwnedSemaphorePermit> {
        let permit = Arc::clone(&self.tokenizing).try_acquire_owned().ok();
        if permit.is_none() {
            self.counts.count("unpaged", 1);
        }
        permit
    }

    fn send(&self, line: String) {
        let bytes = line.len() as u64;
        if line.len() > MAX_RECORD_BYTES {
            self.counts.lost(
                "dropped",
                &format_args!("a record of {bytes} bytes is over {MAX_RECORD_BYTES}"),
            );
            return;
        }
        if self.queued.fetch_add(bytes, Ordering::Relaxed) + bytes > MAX_QUEUED_BYTES {
            self.queued.fetch_sub(bytes, Ordering::Relaxed);
            self.counts.lost("dropped", &"the queue is full");
            return;
        }
        let lost = match self.queue.try_send(line) {
            Ok(()) => return,
            Err(TrySendError::Full(_)) => ("dropped", "the queue is full"),
            Err(TrySendError::Disconnected(_)) => ("failed", "the writer thread ended"),
        };
        self.queued.fetch_sub(bytes, Ordering::Relaxed);
        self.counts.lost(lost.0, &lost.1);
    }
}

/// The records' file, opened for appending; created readable and writable by the
/// router's user alone (an existing file keeps its mode).
fn append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// Warns when an existing records' file may be read by others than its owner: it
/// was created so, or its mode changed since.
fn warn_if_shared(path: &Path, metadata: &std::fs::Metadata) {
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!(
            path = %path.display(),
            mode = format_args!("{mode:o}"),
            "the decision records' file may be read by others than its owner: its records hold clients' session and routing keys (see decisions.hash_keys)"
        );
    }
}

/// The writer thread's file, rotated to `<path>.1` past its bound.
struct Writer {
    path: PathBuf,
    max_bytes: u64,
    /// `None` while the file could not be opened again after a rotation.
    out: Option<BufWriter<File>>,
    size: u64,
    queued: Arc<AtomicU64>,
    counts: Counts,
}

impl Writer {
    /// Writes what arrives, a batch (what is queued) at a time; a batch's records
    /// count as written once flushed.
    fn run(mut self, lines: &Receiver<String>) {
        while let Ok(line) = lines.recv() {
            let mut batch = vec![line];
            batch.extend(lines.try_iter());
            let mut pending = 0;
            for line in &batch {
                self.queued.fetch_sub(line.len() as u64, Ordering::Relaxed);
                match self.write(line) {
                    Ok(()) => pending += 1,
                    Err(e) => self.counts.lost("failed", &e),
                }
            }
            let flushed = match self.out.as_mut() {
                Some(out) => out.flush(),
                None => Ok(()),
            };
            match flushed {
                Ok(()) => self.counts.count("written", pending),
                Err(e) => {
                    self.counts.count("failed", pending.saturating_sub(1));
                    self.counts.lost("failed", &e);
                }
            }
        }
    }

    fn write(&mut self, line: &str) -> std::io::Result<()> {
        let bytes = line.len() as u64 + 1;
        if self.out.is_none() || (self.size > 0 && self.size + bytes > self.max_bytes) {
            self.rotate()?;
        }
        let out = self.out.as_mut().expect("rotate opened the file");
        writeln!(out, "{line}")?;
        self.size += bytes;
        Ok(())
    }

    /// Renames the file to `<path>.1` (replacing an older one) and starts a new one.
    /// A file that is gone (its rename succeeded, the reopening did not) is only
    /// opened again.
    fn rotate(&mut self) -> std::io::Result<()> {
        if let Some(mut out) = self.out.take() {
            out.flush()?;
            let mut old = self.path.clone().into_os_string();
            old.push(".1");
            if let Err(e) = std::fs::rename(&self.path, old) {
                self.out = Some(out);
                return Err(e);
            }
        }
        self.out = Some(BufWriter::new(append(&self.path)?));
        self.size = 0;
        Ok(())
    }
}

/// The usage an answer reported, as its record shows it: the last counts it carried
/// (an engine's own, beside the pick's `predicted_cached_tokens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// The answer's last `"prompt_tokens": N`.
    pub(crate) prompt_tokens: Option<u64>,
    /// The answer's last `"cached_tokens": N`.
    pub(crate) cached_tokens: Option<u64>,
    /// The answer's last `"completion_tokens": N`.
    pub(crate) completion_tokens: Option<u64>,
}

/// A sampled request's record, completed by whatever ends the request: its relayed
/// body, the error it was answered with, or (dropped unfinished) its client leaving.
#[derive(Debug)]
pub(crate) struct PendingRecord {
    /// `None` once the record is queued.
    log: Option<Arc<DecisionLog>>,
    /// The explanation of the selection, an object the result is added to.
    decision: Value,
    started: Instant,
    first_byte: Option<Duration>,
    /// The engines that failed before the answer, with why and what was picked next.
    retries: Vec<Value>,
    /// What a replay reads, when the log is replayable.
    replay: Option<replay::Replay>,
}

impl PendingRecord {
    /// A record of the request `request_id`, which arrived at `started`, decided as
    /// `decision` explains (its keys hashed when the log hashes them).
    pub(crate) fn new(
        log: Arc<DecisionLog>,
        mut decision: Value,
        request_id: &str,
        started: Instant,
    ) -> Self {
        log.conceal_keys(&mut decision);
        let unix_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        decision["time_unix_ms"] = json!(unix_ms);
        decision["request_id"] = json!(request_id);
        Self {
            log: Some(log),
            decision,
            started,
            first_byte: None,
            retries: Vec::new(),
            replay: None,
        }
    }

    /// Adds what a replay reads, made or being made, to the record.
    pub(crate) fn with_replay(&mut self, replay: replay::Replay) {
        self.replay = Some(replay);
    }

    /// `failed` never started the request (`reason`); `then` was picked instead.
    pub(crate) fn retried(&mut self, failed: &str, reason: &str, then: Value) {
        self.retries
            .push(json!({"failed": failed, "reason": reason, "then": then}));
    }

    /// A body frame relayed to the client.
    pub(crate) fn relayed(&mut self) {
        self.first_byte
            .get_or_insert_with(|| self.started.elapsed());
    }

    /// Completes the record with how the request ended and the usage its answer
    /// reported, and queues it.
    pub(crate) fn finish(mut self, status: u16, outcome: &str, code: &str, usage: Usage) {
        self.complete(Some(status), outcome, code, usage);
    }

    fn complete(&mut self, status: Option<u16>, outcome: &str, code: &str, usage: Usage) {
        let Some(log) = self.log.take() else {
            return;
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        self.decision["result"] = json!({
            "status": status,
            "outcome": outcome,
            "code": code,
            "first_byte_ms": self.first_byte.map(ms),
            "duration_ms": ms(self.started.elapsed()),
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_tokens,
            "completion_tokens": usage.completion_tokens,
            "retries": std::mem::take(&mut self.retries),
        });
        let mut decision = std::mem::take(&mut self.decision);
        let pending = match self.replay.take() {
            None => None,
            Some(replay::Replay::Ready(fields)) => {
                decision["replay"] = fields;
                None
            }
            Some(replay::Replay::Pending(mut made)) => match made.try_recv() {
                Ok(fields) => {
                    decision["replay"] = fields;
                    None
                }
                Err(oneshot::error::TryRecvError::Closed) => None,
                Err(oneshot::error::TryRecvError::Empty) => Some(made),
            },
        };
        match (pending, tokio::runtime::Handle::try_current()) {
            // Still tokenizing: the record is queued once its pages are hashed.
            (Some(made), Ok(runtime)) => drop(runtime.spawn(async move {
                if let Ok(fields) = made.await {
                    decision["replay"] = fields;
                }
                log.send(decision.to_string());
            })),
            _ => log.send(decision.to_string()),
        }
    }
}

/// A record dropped unfinished: its client left before the answer's head.
impl Drop for PendingRecord {
    fn drop(&mut self) {
        self.complete(None, "cancelled", "client_disconnected", Usage::default());
    }
}

#[cfg(test)]
mod tests;
