//! The `limits` section: bounds on what clients may hold.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ConfigError;
use crate::timeouts::check_count;

/// The bytes of long prompts' prefixes' token ids each model's tokenizer keeps when
/// `limits.tokenize_cache_bytes` is not set (a tokenizer loaded elsewhere keeps none
/// unless given a budget).
pub const DEFAULT_TOKENIZE_CACHE_BYTES: usize = 64 << 20;

/// The most prompts `limits.tokenize_concurrency` lets be tokenized at once.
const MAX_TOKENIZE_CONCURRENCY: usize = 1024;

/// The fewest bytes `limits.tokenize_cache_bytes` allows, but for 0 (no cache): less
/// would keep no long prompt's prefix.
const MIN_TOKENIZE_CACHE_BYTES: u64 = 1 << 20;

/// The most bytes `limits.tokenize_cache_bytes` allows.
const MAX_TOKENIZE_CACHE_BYTES: u64 = 16 << 30;

/// The most client connections `limits.max_connections` allows.
const MAX_CONNECTIONS: usize = 1 << 20;

/// The fewest bytes `limits.client_send_buffer_bytes` allows, but for 0 (the
/// kernel's own sizing).
const MIN_SEND_BUFFER_BYTES: usize = 4 << 10;

/// The most bytes `limits.client_send_buffer_bytes` allows.
const MAX_SEND_BUFFER_BYTES: usize = 16 << 20;

/// Bounds on what clients may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Most client connections open at once; more wait in the listen backlog.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// The largest message an engine's ZeroMQ feeds may send (load reports, KV-event
    /// batches, replays), in bytes; a larger one closes the feed's connection before
    /// it is read, and the feed reconnects.
    #[serde(default = "default_zmq_max_message_bytes")]
    pub zmq_max_message_bytes: usize,
    /// Bytes every engine feed together may hold in messages still arriving (each
    /// frame charged from its header, before anything is allocated for it) and in
    /// KV-event batches kept while a gap is repaired, past each message's first
    /// 64 KiB; a frame past it closes its feed's connection, which reconnects. At
    /// least `zmq_max_message_bytes`; absent = 256 MiB, or `zmq_max_message_bytes`
    /// when that is larger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zmq_memory_bytes: Option<usize>,
    /// Prompts tokenized at once, each on a thread of its own (this many threads,
    /// apart from those serving requests); absent = one per core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenize_concurrency: Option<usize>,
    /// Bytes of long prompts' prefixes' token ids kept per model (0: none), so the
    /// next turn of a conversation, which sends the whole history again, tokenizes
    /// only what is new (byte-level BPE tokenizers).
    #[serde(default = "default_tokenize_cache_bytes")]
    pub tokenize_cache_bytes: usize,
    /// Bytes the request bodies being read and held may take at once, each charged
    /// twice its size (itself, and as much again for parsing and tokenizing it); a
    /// body that would pass the budget is refused with 503 `overloaded`.
    #[serde(default = "default_body_memory_bytes")]
    pub body_memory_bytes: usize,
    /// The send buffer of each accepted client socket (`SO_SNDBUF`), in bytes: 0
    /// leaves the kernel's own sizing (Linux grows it to `net.ipv4.tcp_wmem`'s
    /// largest, 4 MiB by default), else 4096 to 16 MiB (Linux doubles it for its
    /// bookkeeping and caps it at `net.core.wmem_max`). It bounds what a client that
    /// stops reading holds before `timeouts.client_write_ms` starts counting, and a
    /// connection's throughput to one buffer a round trip.
    #[serde(default = "default_client_send_buffer_bytes")]
    pub client_send_buffer_bytes: usize,
}

/// The bytes `limits.body_memory_bytes` allows when not set.
const DEFAULT_BODY_MEMORY_BYTES: usize = 512 << 20;

/// The fewest bytes `limits.body_memory_bytes` allows: one body of the largest size,
/// charged twice.
const MIN_BODY_MEMORY_BYTES: u64 = 64 << 20;

/// The most bytes `limits.body_memory_bytes` allows.
const MAX_BODY_MEMORY_BYTES: u64 = 64 << 30;

fn default_body_memory_bytes() -> usize {
    DEFAULT_BODY_MEMORY_BYTES
}

fn default_tokenize_cache_bytes() -> usize {
    DEFAULT_TOKENIZE_CACHE_BYTES
}

fn default_client_send_buffer_bytes() -> usize {
    128 << 10
}

fn default_max_connections() -> usize {
    4096
}

fn default_zmq_max_message_bytes() -> usize {
    router_state::DEFAULT_MAX_FEED_MESSAGE_BYTES
}

/// The most bytes `limits.zmq_memory_bytes` and `limits.zmq_max_message_bytes` allow.
const MAX_ZMQ_MEMORY_BYTES: u64 = 64 << 30;

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_connections: default_max_connections(),
            zmq_max_message_bytes: default_zmq_max_message_bytes(),
            zmq_memory_bytes: None,
            tokenize_concurrency: None,
            tokenize_cache_bytes: default_tokenize_cache_bytes(),
            body_memory_bytes: default_body_memory_bytes(),
            client_send_buffer_bytes: default_client_send_buffer_bytes(),
        }
    }
}

impl LimitsConfig {
    /// What all engine feeds may hold together: `zmq_memory_bytes`, or by default
    /// 256 MiB, or one largest message when that is larger.
    pub fn feed_memory_bytes(&self) -> usize {
        self.zmq_memory_bytes.unwrap_or_else(|| {
            router_state::DEFAULT_FEED_MEMORY_BYTES.max(self.zmq_max_message_bytes)
        })
    }

    /// Every bound is at least 1 and within its most; the prefix cache is off or at
    /// least 1 MiB; the body budget holds one largest body, the feeds' one largest
    /// message; the send buffer is the
    /// kernel's or 4 KiB to 16 MiB.
    pub(crate) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let Self {
            max_connections,
            zmq_max_message_bytes,
            zmq_memory_bytes,
            tokenize_concurrency,
            tokenize_cache_bytes,
            body_memory_bytes,
            client_send_buffer_bytes,
        } = *self;
        if (zmq_max_message_bytes as u64) > MAX_ZMQ_MEMORY_BYTES {
            errors.push(ConfigError::at(
                "limits.zmq_max_message_bytes",
                format_args!("must be at most {MAX_ZMQ_MEMORY_BYTES} (64 GiB)"),
            ));
        } else if let Some(zmq_memory_bytes) = zmq_memory_bytes
            && !(zmq_max_message_bytes as u64..=MAX_ZMQ_MEMORY_BYTES)
                .contains(&(zmq_memory_bytes as u64))
        {
            errors.push(ConfigError::at(
                "limits.zmq_memory_bytes",
                format_args!(
                    "must be between limits.zmq_max_message_bytes ({zmq_max_message_bytes}: one largest message must fit) and {MAX_ZMQ_MEMORY_BYTES} (64 GiB)"
                ),
            ));
        }
        if !(MIN_BODY_MEMORY_BYTES..=MAX_BODY_MEMORY_BYTES).contains(&(body_memory_bytes as u64)) {
            errors.push(ConfigError::at(
                "limits.body_memory_bytes",
                format_args!(
                    "must be between {MIN_BODY_MEMORY_BYTES} (64 MiB) and {MAX_BODY_MEMORY_BYTES} (64 GiB)"
                ),
            ));
        }
        check_count("limits.max_connections", max_connections as u64, errors);
        check_count(
            "limits.zmq_max_message_bytes",
            zmq_max_message_bytes as u64,
            errors,
        );
        if let Some(n) = tokenize_concurrency
            && !(1..=MAX_TOKENIZE_CONCURRENCY).contains(&n)
        {
            errors.push(ConfigError::at(
                "limits.tokenize_concurrency",
                format_args!("must be between 1 and {MAX_TOKENIZE_CONCURRENCY}"),
            ));
        }
        let cache = tokenize_cache_bytes as u64;
        if cache != 0 && !(MIN_TOKENIZE_CACHE_BYTES..=MAX_TOKENIZE_CACHE_BYTES).contains(&cache) {
            errors.push(ConfigError::at(
                "limits.tokenize_cache_bytes",
                format_args!(
                    "must be 0 (no cache) or between {MIN_TOKENIZE_CACHE_BYTES} (1 MiB) and {MAX_TOKENIZE_CACHE_BYTES} (16 GiB)"
                ),
            ));
        }
        if client_send_buffer_bytes != 0
            && !(MIN_SEND_BUFFER_BYTES..=MAX_SEND_BUFFER_BYTES).contains(&client_send_buffer_bytes)
        {
            errors.push(ConfigError::at(
                "limits.client_send_buffer_bytes",
                format_args!(
                    "must be 0 (the kernel's sizing) or between {MIN_SEND_BUFFER_BYTES} (4 KiB) and {MAX_SEND_BUFFER_BYTES} (16 MiB)"
                ),
            ));
        }
        if max_connections > MAX_CONNECTIONS {
            errors.push(ConfigError::at(
                "limits.max_connections",
                format_args!("must be at most {MAX_CONNECTIONS}"),
            ));
        }
    }
}
