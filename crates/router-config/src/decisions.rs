//! The `decisions` section: a JSON-lines file of sampled routing decisions, off
//! unless a path is given.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// Decision records: for a sample of routed requests, one JSON line with what
/// selection used (the request's facts, every bucket considered, each stage's
/// candidates with their load, matched prefix tokens and admission verdicts, the
/// pick and its reason) and what came back (status, first-byte time, the cached
/// prompt tokens the engine reported). Written by a thread of its own through a
/// bounded queue: a record that finds the queue full is dropped and counted, never
/// waited for, and so is a record over 256 KiB. The file is renamed to `<path>.1`
/// (replacing an older one) when the next line would take it past `max_file_bytes`,
/// so the records take at most twice that on disk. The files are created readable by
/// the router's user alone (mode 0600): records hold clients' session and routing
/// keys, or with `hash_keys` a keyed hash of each.
///
/// ```yaml
/// decisions: {path: /var/log/switchyard/decisions.jsonl, sample_ratio: 0.01}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionsConfig {
    /// The file records are appended to (created when missing).
    pub path: PathBuf,
    /// The share of routed requests recorded, above 0 and at most 1: exactly every
    /// `1 / sample_ratio`-th request (rounded).
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
    /// The size the file is rotated at, in bytes.
    #[serde(default = "default_max_file_bytes")]
    pub max_file_bytes: u64,
    /// Records waiting to be written, at most; past it a record is dropped.
    #[serde(default = "default_queue")]
    pub queue: usize,
    /// Record each session and routing key as a keyed hash (16 hex digits, SipHash
    /// under keys drawn when the router starts) instead of as the client sent it:
    /// equal keys give equal hashes within one router process, and a hash cannot be
    /// checked against a guessed key.
    #[serde(default)]
    pub hash_keys: bool,
    /// Make the records replayable (`switchyard replay --records`): each also carries
    /// its arrival time in microseconds and its prompt's pages (the model's
    /// `block_size` tokens each) as keyed hashes (SipHash under keys drawn per
    /// process, of each page's chained hash in its cache namespace): equal within one
    /// router process for equal prefixes, never the prompt's text, token ids or the
    /// hashes engines publish. A model whose routing reads no prompt has only its
    /// recorded requests tokenized for this, while they go on.
    #[serde(default)]
    pub replayable: bool,
}

/// The smallest rotation size accepted: above the longest record, so a file never
/// passes its bound.
const MIN_FILE_BYTES: u64 = 1 << 20;
/// The largest rotation size accepted.
const MAX_FILE_BYTES: u64 = 64 << 30;
/// The longest queue accepted (its bytes are bounded too, at 64 MiB).
const MAX_QUEUE: usize = 1 << 16;

fn default_sample_ratio() -> f64 {
    0.01
}
fn default_max_file_bytes() -> u64 {
    256 << 20
}
fn default_queue() -> usize {
    1024
}

impl DecisionsConfig {
    /// Records of every `1 / sample_ratio`-th request into `path`, with the default
    /// bounds.
    pub fn new(path: impl Into<PathBuf>, sample_ratio: f64) -> Self {
        Self {
            path: path.into(),
            sample_ratio,
            max_file_bytes: default_max_file_bytes(),
            queue: default_queue(),
            hash_keys: false,
            replayable: false,
        }
    }

    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let Self {
            path,
            sample_ratio,
            max_file_bytes,
            queue,
            // Either way is valid.
            hash_keys: _,
            replayable: _,
        } = self;
        let mut fail = |field: &str, message: String| {
            errors.push(ConfigError::at(format!("decisions.{field}"), message));
        };
        if path.as_os_str().is_empty() {
            fail("path", "must name a file".into());
        }
        if !(*sample_ratio > 0.0 && *sample_ratio <= 1.0) {
            fail(
                "sample_ratio",
                format!("must be above 0 and at most 1, not {}", *sample_ratio),
            );
        }
        if !(MIN_FILE_BYTES..=MAX_FILE_BYTES).contains(max_file_bytes) {
            fail(
                "max_file_bytes",
                format!(
                    "must be {MIN_FILE_BYTES} to {MAX_FILE_BYTES}, not {}",
                    *max_file_bytes
                ),
            );
        }
        if !(1..=MAX_QUEUE).contains(queue) {
            fail("queue", format!("must be 1 to {MAX_QUEUE}, not {}", *queue));
        }
    }
}
