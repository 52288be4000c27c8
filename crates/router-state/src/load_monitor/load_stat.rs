//! Decoding of the SGLang `LoadStat` gauge payload.
//!
//! The payload is a msgpack array `["LoadStat", running, waiting, used_kv_tokens,
//! max_total_kv_tokens, dp_rank | nil]` (a *basic* report), optionally followed by the
//! five fields of a *native* report. A partial native extension is rejected rather than
//! zero-filled; elements after the native fields are ignored so newer publishers that
//! append fields still decode.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, IgnoredAny, SeqAccess, Visitor};

/// The tag that opens every load payload.
pub const LOAD_STAT_TAG: &str = "LoadStat";

/// One decoded load report of one data-parallel rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadReport {
    /// Requests the engine is running.
    pub running_requests: u64,
    /// Requests waiting in the engine's queue.
    pub waiting_requests: u64,
    /// KV-cache tokens in use.
    pub used_kv_tokens: u64,
    /// KV-cache capacity in tokens; `None` when the engine reports 0 (unknown).
    pub max_kv_tokens: Option<u64>,
    /// The rank the payload claims. The socket's rank is authoritative; this is kept
    /// for diagnostics only.
    pub dp_rank: Option<i64>,
    /// The native extension, when the publisher sends it.
    pub native: Option<NativeLoad>,
}

/// The five fields a native publisher appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NativeLoad {
    /// Prompt tokens waiting for prefill that the prefix cache does not cover.
    pub waiting_uncached_tokens: u64,
    /// KV tokens in use plus the tokens of queued requests.
    pub total_tokens: u64,
    /// The engine's running-request limit.
    pub max_running_requests: u64,
    /// Counter: uncached prompt tokens prefilled since the publisher started.
    pub prefill_uncached_tokens_total: u64,
    /// Counter: microseconds spent prefilling since the publisher started.
    pub prefill_busy_us_total: u64,
}

/// Why a load payload was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadDecodeError {
    /// Not msgpack, not an array, or a field of the wrong type.
    #[error("malformed load report: {0}")]
    Malformed(String),
    /// The first element is not the `LoadStat` tag.
    #[error("load report tag is {0:?}, expected \"LoadStat\"")]
    UnexpectedTag(String),
    /// Fewer than the six elements of a basic report.
    #[error("load report has {0} elements, a basic report needs 6")]
    TooShort(usize),
    /// Some but not all of the five native fields.
    #[error("native load extension has {0} of its 5 fields")]
    PartialNative(usize),
}

impl LoadDecodeError {
    /// Short label for drop counters.
    pub fn reason(&self) -> &'static str {
        match self {
            LoadDecodeError::Malformed(_) => "malformed",
            LoadDecodeError::UnexpectedTag(_) => "unexpected_tag",
            LoadDecodeError::TooShort(_) => "too_short",
            LoadDecodeError::PartialNative(_) => "partial_native",
        }
    }
}

impl LoadReport {
    /// Decodes one msgpack payload.
    ///
    /// # Errors
    /// See [`LoadDecodeError`]; nothing is zero-filled.
    pub fn decode(payload: &[u8]) -> Result<Self, LoadDecodeError> {
        let mut de = rmp_serde::Deserializer::from_read_ref(payload);
        match Outcome::deserialize(&mut de) {
            Ok(Outcome(result)) => result,
            Err(e) => Err(LoadDecodeError::Malformed(e.to_string())),
        }
    }
}

/// Semantic errors travel inside the value so they keep their type; serde errors
/// (syntax, wrong types) become [`LoadDecodeError::Malformed`].
struct Outcome(Result<LoadReport, LoadDecodeError>);

impl<'de> Deserialize<'de> for Outcome {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(ReportVisitor).map(Outcome)
    }
}

struct ReportVisitor;

impl<'de> Visitor<'de> for ReportVisitor {
    type Value = Result<LoadReport, LoadDecodeError>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a LoadStat array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let Some(tag) = seq.next_element::<TagStr>()? else {
            return Ok(Err(LoadDecodeError::TooShort(0)));
        };
        if tag.0 != LOAD_STAT_TAG {
            drain(&mut seq)?;
            return Ok(Err(LoadDecodeError::UnexpectedTag(tag.0)));
        }
        let mut basic = [0u64; 4];
        for (i, slot) in basic.iter_mut().enumerate() {
            match seq.next_element::<u64>()? {
                Some(v) => *slot = v,
                None => return Ok(Err(LoadDecodeError::TooShort(i + 1))),
            }
        }
        let Some(dp_rank) = seq.next_element::<Option<i64>>()? else {
            return Ok(Err(LoadDecodeError::TooShort(5)));
        };
        let mut native = [0u64; 5];
        let mut present = 0;
        for slot in &mut native {
            match seq.next_element::<u64>()? {
                Some(v) => {
                    *slot = v;
                    present += 1;
                }
                None => break,
            }
        }
        drain(&mut seq)?;
        if present != 0 && present != native.len() {
            return Ok(Err(LoadDecodeError::PartialNative(present)));
        }
        let [running, waiting, used, max_total] = basic;
        let [uncached, total, max_running, prefilled, busy_us] = native;
        Ok(Ok(LoadReport {
            running_requests: running,
            waiting_requests: waiting,
            used_kv_tokens: used,
            max_kv_tokens: (max_total > 0).then_some(max_total),
            dp_rank,
            native: (present == native.len()).then_some(NativeLoad {
                waiting_uncached_tokens: uncached,
                total_tokens: total,
                max_running_requests: max_running,
                prefill_uncached_tokens_total: prefilled,
                prefill_busy_us_total: busy_us,
            }),
        }))
    }
}

/// Consumes the rest of an array: the msgpack reader insists on reading every element.
fn drain<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// A msgpack `str` or `bin` holding the tag.
struct TagStr(String);

impl<'de> Deserialize<'de> for TagStr {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TagVisitor;
        impl Visitor<'_> for TagVisitor {
            type Value = TagStr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tag string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TagStr, E> {
                Ok(TagStr(v.to_owned()))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<TagStr, E> {
                Ok(TagStr(String::from_utf8_lossy(v).into_owned()))
            }
        }
        deserializer.deserialize_str(TagVisitor)
    }
}
