//! Decoding of KV-event batches as SGLang and vLLM publish them.
//!
//! A batch is `[ts, events, rank?]` (two or three elements; more are ignored). An
//! event is a tagged map (`type` plus named fields, unknown keys ignored) or a legacy
//! positional array (tag first, trailing fields optional). Block hashes are opaque
//! 64-bit handles: an unsigned or negative msgpack integer (bit-cast), or a `bin`
//! digest (its last eight bytes, big-endian). Tokens are integers, or `[a, b]` pairs on
//! bigram pages (the first of each pair is the page's token). A bad event costs that
//! event; a bad batch costs that batch.

use std::fmt;
use std::time::Duration;

use rmpv::ValueRef;

/// The storage tier of a cached copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Accelerator memory (`GPU`, or no medium).
    Device,
    /// Host memory (`CPU`, `CPU_PINNED`).
    Host,
    /// Local disk (`DISK`, `STORAGE`).
    Disk,
    /// A shared or remote pool (`EXTERNAL`).
    External,
}

impl Tier {
    /// Every tier, best first.
    pub const ALL: [Tier; 4] = [Tier::Device, Tier::Host, Tier::Disk, Tier::External];

    fn from_medium(medium: &str) -> Option<Tier> {
        match medium {
            "GPU" => Some(Tier::Device),
            "CPU" | "CPU_PINNED" => Some(Tier::Host),
            "DISK" | "STORAGE" => Some(Tier::Disk),
            "EXTERNAL" => Some(Tier::External),
            _ => None,
        }
    }

    /// Lower-case label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
            Tier::Disk => "disk",
            Tier::External => "external",
        }
    }
}

/// Pages cached by an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockStored {
    /// The engine's hashes of the pages, in chain order.
    pub block_hashes: Vec<u64>,
    /// The engine's hash of the page this chain extends; `None` = from the root.
    pub parent: Option<u64>,
    /// Every page's tokens: `block_hashes.len() * block_size` of them on a well-formed
    /// store (the index skips any other as misaligned).
    pub tokens: Vec<u32>,
    /// Tokens per page.
    pub block_size: u32,
    /// Where the copy lives.
    pub tier: Tier,
    /// The cache namespace (LoRA adapter name or cache salt), if any.
    pub namespace: Option<String>,
    /// The KV-cache group (hybrid models), if given.
    pub group_idx: Option<i64>,
    /// The group's attention kind, if given (`full_attention`, `sliding_window`, ...).
    pub group_kind: Option<String>,
}

/// Pages evicted by an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRemoved {
    /// The engine's hashes of the evicted pages.
    pub block_hashes: Vec<u64>,
    /// The tier they left; `None` = every tier.
    pub tier: Option<Tier>,
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// See [`BlockStored`].
    Stored(BlockStored),
    /// See [`BlockRemoved`].
    Removed(BlockRemoved),
    /// The engine flushed its whole cache.
    AllCleared,
}

/// A decoded batch.
#[derive(Debug, Clone, PartialEq)]
pub struct KvBatch {
    /// Publisher timestamp, seconds since the Unix epoch.
    pub ts: f64,
    /// The events that decoded, in order.
    pub events: Vec<KvEvent>,
    /// The rank the payload names (the socket's rank is authoritative).
    pub dp_rank: Option<i64>,
    /// One entry per event that did not decode.
    pub dropped: Vec<EventError>,
}

/// The largest feed age recorded: a publisher clock further behind than this is
/// taken to be this far behind.
pub const MAX_FEED_AGE: Duration = Duration::from_secs(3600);

impl KvBatch {
    /// How long before `now` (seconds since the Unix epoch, the router's clock) the
    /// publisher stamped this batch: zero when the stamp is later (clocks a little
    /// apart) or not a number, at most [`MAX_FEED_AGE`].
    pub fn age_at(&self, now: f64) -> Duration {
        let behind = now - self.ts;
        if behind.is_nan() || behind <= 0.0 {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(behind).map_or(MAX_FEED_AGE, |age| age.min(MAX_FEED_AGE))
    }
}

/// Why a batch was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// Not msgpack.
    #[error("not msgpack: {0}")]
    Msgpack(String),
    /// Not an array of at least `[ts, events]`.
    #[error("a batch must be [ts, events, rank?]")]
    Shape,
}

impl BatchError {
    /// Short label for drop counters.
    pub fn reason(&self) -> &'static str {
        match self {
            BatchError::Msgpack(_) => "batch_not_msgpack",
            BatchError::Shape => "batch_shape",
        }
    }
}

/// Why one event was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// The event is neither a tagged map nor a tagged array.
    #[error("an event must be a tagged map or array")]
    Shape,
    /// The tag names no known event.
    #[error("unknown event type {0:?}")]
    UnknownType(String),
    /// A required field is missing or has the wrong type.
    #[error("field {0} is missing or malformed")]
    Field(&'static str),
    /// A stored page's medium is not one the router knows.
    #[error("unknown medium {0:?}")]
    UnknownMedium(String),
}

impl EventError {
    /// Short label for drop counters.
    pub fn reason(&self) -> &'static str {
        match self {
            EventError::Shape => "event_shape",
            EventError::UnknownType(_) => "unknown_event_type",
            EventError::Field(_) => "bad_field",
            EventError::UnknownMedium(_) => "unknown_medium",
        }
    }
}

/// Deepest nesting a batch needs is five (batch, events, event, tokens, token pair);
/// anything much deeper is hostile and is refused before it can exhaust the stack.
const MAX_DEPTH: usize = 16;

/// Decodes one batch payload.
///
/// # Errors
/// [`BatchError`] when the payload is not a batch at all.
pub fn decode_batch(payload: &[u8]) -> Result<KvBatch, BatchError> {
    let value = rmpv::decode::read_value_ref_with_max_depth(&mut &payload[..], MAX_DEPTH)
        .map_err(|e| BatchError::Msgpack(e.to_string()))?;
    let ValueRef::Array(items) = value else {
        return Err(BatchError::Shape);
    };
    let (Some(ts), Some(ValueRef::Array(events))) = (items.first().and_then(number), items.get(1))
    else {
        return Err(BatchError::Shape);
    };
    let dp_rank = match items.get(2) {
        None | Some(ValueRef::Nil) => None,
        Some(v) => Some(as_i64(v).ok_or(BatchError::Shape)?),
    };
    let mut batch = KvBatch {
        ts,
        events: Vec::with_capacity(events.len()),
        dp_rank,
        dropped: Vec::new(),
    };
    for event in events {
        match decode_event(event) {
            Ok(e) => batch.events.push(e),
            Err(e) => batch.dropped.push(e),
        }
    }
    Ok(batch)
}

fn number(v: &ValueRef<'_>) -> Option<f64> {
    match v {
        ValueRef::F64(f) => Some(*f),
        ValueRef::F32(f) => Some(f64::from(*f)),
        ValueRef::Integer(i) => i.as_f64(),
        _ => None,
    }
}

fn as_u64(v: &ValueRef<'_>) -> Option<u64> {
    match v {
        ValueRef::Integer(i) => i.as_u64(),
        _ => None,
    }
}

fn as_i64(v: &ValueRef<'_>) -> Option<i64> {
    match v {
        ValueRef::Integer(i) => i.as_i64(),
        _ => None,
    }
}

/// Field access by name (maps) or position (legacy arrays, tag at 0).
enum Fields<'v, 'a> {
    Map(&'v [(ValueRef<'a>, ValueRef<'a>)]),
    Array(&'v [ValueRef<'a>]),
}

impl<'v, 'a> Fields<'v, 'a> {
    fn get(&self, name: &str, position: usize) -> Option<&'v ValueRef<'a>> {
        let value = match self {
            Fields::Map(entries) => entries
                .iter()
                .find(|(k, _)| str_of(k) == Some(name))
                .map(|(_, v)| v),
            Fields::Array(items) => items.get(position),
        };
        value.filter(|v| !matches!(v, ValueRef::Nil))
    }
}

fn str_of<'v>(v: &'v ValueRef<'_>) -> Option<&'v str> {
    match v {
        ValueRef::String(s) => s.as_str(),
        _ => None,
    }
}

fn decode_event(event: &ValueRef<'_>) -> Result<KvEvent, EventError> {
    let (tag, fields) = match event {
        ValueRef::Map(entries) => {
            let tag = entries
                .iter()
                .find(|(k, _)| str_of(k) == Some("type"))
                .and_then(|(_, v)| str_of(v));
            (tag, Fields::Map(entries))
        }
        ValueRef::Array(items) => (items.first().and_then(str_of), Fields::Array(items)),
        _ => return Err(EventError::Shape),
    };
    match tag.ok_or(EventError::Shape)? {
        "BlockStored" => stored(&fields).map(KvEvent::Stored),
        "BlockRemoved" => {
            let block_hashes = hashes(fields.get("block_hashes", 1))?;
            let tier = fields
                .get("medium", 2)
                .and_then(str_of)
                .and_then(Tier::from_medium);
            Ok(KvEvent::Removed(BlockRemoved { block_hashes, tier }))
        }
        "AllBlocksCleared" => Ok(KvEvent::AllCleared),
        other => Err(EventError::UnknownType(other.to_owned())),
    }
}

/// The cache salt among a vLLM event's extra keys: the first page's last string key
/// but its LoRA adapter's name (vLLM orders them media, adapter, salt), which vLLM
/// adds to the page at token 0 only. A first page holding media (its keys are
/// pairs) is left in the adapter's namespace: no request's prompt reaches past it.
fn first_page_salt<'v>(extra_keys: &'v ValueRef<'_>, lora: Option<&str>) -> Option<&'v str> {
    let ValueRef::Array(pages) = extra_keys else {
        return None;
    };
    let ValueRef::Array(keys) = pages.first()? else {
        return None;
    };
    if keys.iter().any(|key| matches!(key, ValueRef::Array(_))) {
        return None;
    }
    keys.iter()
        .filter_map(str_of)
        .rfind(|key| Some(*key) != lora)
}

/// Legacy positions: `[tag, block_hashes, parent_block_hash, token_ids, block_size,
/// lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind, ...]`.
fn stored(fields: &Fields<'_, '_>) -> Result<BlockStored, EventError> {
    let block_hashes = hashes(fields.get("block_hashes", 1))?;
    let parent = fields.get("parent_block_hash", 2).map(hash).transpose()?;
    let tokens = tokens(
        fields
            .get("token_ids", 3)
            .ok_or(EventError::Field("token_ids"))?,
    )?;
    let block_size = fields
        .get("block_size", 4)
        .and_then(as_u64)
        .and_then(|b| u32::try_from(b).ok())
        .ok_or(EventError::Field("block_size"))?;
    let tier = match fields.get("medium", 6).and_then(str_of) {
        None => Tier::Device,
        Some(medium) => {
            Tier::from_medium(medium).ok_or_else(|| EventError::UnknownMedium(medium.to_owned()))?
        }
    };
    let lora = fields.get("lora_name", 7).and_then(str_of);
    // SGLang names the salt; vLLM puts it among the first page's extra keys.
    let salt = fields
        .get("cache_salt", usize::MAX)
        .and_then(str_of)
        .or_else(|| {
            parent
                .is_none()
                .then(|| first_page_salt(fields.get("extra_keys", 8)?, lora))
                .flatten()
        });
    let namespace = super::hash::cache_namespace(lora, salt);
    Ok(BlockStored {
        block_hashes,
        parent,
        tokens,
        block_size,
        tier,
        namespace,
        group_idx: fields.get("group_idx", 9).and_then(as_i64),
        group_kind: fields
            .get("kv_cache_spec_kind", 10)
            .and_then(str_of)
            .map(str::to_owned),
    })
}

fn hashes(value: Option<&ValueRef<'_>>) -> Result<Vec<u64>, EventError> {
    match value {
        Some(ValueRef::Array(items)) => items.iter().map(hash).collect(),
        _ => Err(EventError::Field("block_hashes")),
    }
}

fn hash(value: &ValueRef<'_>) -> Result<u64, EventError> {
    match value {
        ValueRef::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|v| v as u64))
            .ok_or(EventError::Field("block hash")),
        ValueRef::Binary(digest) if digest.len() >= 8 => {
            let tail: [u8; 8] = digest[digest.len() - 8..]
                .try_into()
                .map_err(|_| EventError::Field("block hash"))?;
            Ok(u64::from_be_bytes(tail))
        }
        _ => Err(EventError::Field("block hash")),
    }
}

fn tokens(value: &ValueRef<'_>) -> Result<Vec<u32>, EventError> {
    let ValueRef::Array(items) = value else {
        return Err(EventError::Field("token_ids"));
    };
    items
        .iter()
        .map(|t| {
            let token = match t {
                ValueRef::Array(pair) if pair.len() == 2 => &pair[0],
                other => other,
            };
            as_u64(token)
                .and_then(|v| u32::try_from(v).ok())
                .ok_or(EventError::Field("token_ids"))
        })
        .collect()
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests;
