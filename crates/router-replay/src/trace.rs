//! The trace format: one JSON object per line, one request each, in arrival order.
//!
//! ```json
//! {"at_us": 1200, "session": "c17", "output_tokens": 120,
//!  "prompt": [{"id": "system-3", "tokens": 1800}, {"id": "c17-user-0", "tokens": 90}]}
//! ```
//! A prompt is a list of segments. A named segment stands for `tokens` token ids drawn
//! from its `id` alone, so every prompt naming `system-3` starts with the same tokens,
//! and a later turn that repeats its conversation's earlier segments extends that
//! prompt exactly; a recorded prompt gives its ids as `{"token_ids": [...]}`, or its
//! pages' hashes as `{"pages": "<16 hex digits a page>", "page_tokens": 16}`. `model`
//! is needed only when the configuration serves several models; `session` is the
//! affinity key a client would send (and the conversation the oracle follows).

use std::io::BufRead;

use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

/// The longest line read, in bytes.
pub const MAX_LINE_BYTES: usize = 64 << 20;
/// The most requests a trace may hold.
pub const MAX_REQUESTS: usize = 10_000_000;
/// The longest prompt, in tokens.
pub const MAX_PROMPT_TOKENS: u64 = 1 << 20;
/// The most output tokens one request may ask for.
pub const MAX_OUTPUT_TOKENS: u32 = 1 << 20;
/// The latest arrival, in microseconds from the start: 30 days.
pub const MAX_AT_US: u64 = 30 * 24 * 3600 * 1_000_000;
/// The most bytes a trace may hold in all.
pub const MAX_TRACE_BYTES: u64 = 4 << 30;
/// Token ids drawn for named segments lie below this.
const VOCABULARY: u32 = 50_000;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceRequest {
    /// Arrival, in microseconds from the trace's start.
    pub at_us: u64,
    /// The model asked for; `None` = the configuration's only model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The session (affinity) key, and the conversation the request belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The prompt, segment by segment.
    pub prompt: Vec<Segment>,
    /// Output tokens the engine generates.
    pub output_tokens: u32,
}

/// A run of prompt tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Segment {
    /// `tokens` ids drawn from `id`: equal ids, equal tokens.
    Named {
        /// What the tokens are drawn from.
        id: String,
        /// How many.
        tokens: u32,
    },
    /// Token ids as recorded.
    Recorded {
        /// The ids.
        token_ids: Vec<u32>,
    },
    /// Pages named by their chained hashes, as a replayable decision record names
    /// them (16 hex digits a page): `page_tokens` ids each, drawn from the page's
    /// hash alone. A page's hash commits to every page before it, so two prompts
    /// share their leading pages exactly as far as their hashes agree.
    Pages {
        /// The pages' hashes.
        pages: PageHashes,
        /// Tokens a page.
        page_tokens: u32,
    },
}

/// Page hashes, written as 16 lowercase hex digits each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageHashes(pub Vec<u64>);

impl PageHashes {
    /// The hashes `hex` spells, 16 hex digits a page.
    ///
    /// # Errors
    /// `hex` is not a whole number of 16-digit hex pages.
    pub fn from_hex(hex: &str) -> Result<Self, String> {
        if !hex.len().is_multiple_of(16) {
            return Err(format!(
                "pages take 16 hex digits each, not {} in all",
                hex.len()
            ));
        }
        if !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err("pages hold lowercase hex digits only".to_owned());
        }
        hex.as_bytes()
            .chunks(16)
            .map(|page| {
                std::str::from_utf8(page)
                    .ok()
                    .and_then(|page| u64::from_str_radix(page, 16).ok())
                    .ok_or_else(|| "pages hold lowercase hex digits only".to_owned())
            })
            .collect::<Result<Vec<u64>, String>>()
            .map(Self)
    }

    /// The hashes as 16 lowercase hex digits each.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|page| format!("{page:016x}")).collect()
    }
}

impl Serialize for PageHashes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for PageHashes {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let hex = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::from_hex(&hex).map_err(serde::de::Error::custom)
    }
}

impl Segment {
    /// Its length in tokens.
    pub fn len(&self) -> u64 {
        match self {
            Segment::Named { tokens, .. } => u64::from(*tokens),
            Segment::Recorded { token_ids } => token_ids.len() as u64,
            Segment::Pages { pages, page_tokens } => {
                (pages.0.len() as u64).saturating_mul(u64::from(*page_tokens))
            }
        }
    }

    /// Whether it has no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends its token ids to `out`.
    pub fn write_tokens(&self, out: &mut Vec<u32>) {
        match self {
            Segment::Named { id, tokens } => {
                let seed = xxhash_rust::xxh3::xxh3_64(id.as_bytes());
                drawn(out, seed, *tokens);
            }
            Segment::Recorded { token_ids } => out.extend_from_slice(token_ids),
            Segment::Pages { pages, page_tokens } => {
                for page in &pages.0 {
                    drawn(out, *page, *page_tokens);
                }
            }
        }
    }
}

/// Appends `tokens` token ids drawn from `seed` alone.
fn drawn(out: &mut Vec<u32>, seed: u64, tokens: u32) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    out.extend((0..tokens).map(|_| rng.next_u32() % VOCABULARY));
}

impl TraceRequest {
    /// Prompt length in tokens.
    pub fn prompt_tokens(&self) -> u64 {
        self.prompt.iter().map(Segment::len).sum()
    }

    /// The prompt's token ids.
    pub fn tokens(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.prompt_tokens() as usize);
        for segment in &self.prompt {
            segment.write_tokens(&mut out);
        }
        out
    }
}

/// Why a trace cannot be read. Each message holds the error it carries, which is no
/// `source` too (a chain of sources would print it twice).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// Reading failed.
    #[error("reading the trace: {0}")]
    Io(std::io::Error),
    /// A line is not a request, or breaks a bound.
    #[error("trace line {line}: {message}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The trace holds more than [`MAX_REQUESTS`] requests.
    #[error("the trace holds more than {MAX_REQUESTS} requests")]
    TooLong,
    /// The trace is larger than [`MAX_TRACE_BYTES`].
    #[error("the trace is larger than {MAX_TRACE_BYTES} bytes")]
    TooLarge,
    /// Its arrivals span more than [`MAX_AT_US`].
    #[error("the arrivals span more than {MAX_AT_US} us (30 days)")]
    Span,
}

impl From<std::io::Error> for TraceError {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

/// Reads a trace: one request per line (blank lines skipped), arrivals never
/// decreasing.
///
/// # Errors
/// The first line that is not a request, breaks a bound or arrives before the line
/// above it.
pub fn read_trace(reader: impl BufRead) -> Result<Vec<TraceRequest>, TraceError> {
    let mut requests = Vec::new();
    let mut lines = Lines::new(reader);
    let mut total = 0u64;
    let mut buf = Vec::new();
    while lines.next(&mut buf, &mut total, |line, message| TraceError::Line {
        line,
        message,
    })? {
        let line = lines.line();
        let at = |message: String| TraceError::Line { line, message };
        let request: TraceRequest = serde_json::from_slice(&buf).map_err(|e| at(e.to_string()))?;
        if request.prompt_tokens() > MAX_PROMPT_TOKENS {
            return Err(at(format!(
                "the prompt is longer than {MAX_PROMPT_TOKENS} tokens"
            )));
        }
        if request.at_us > MAX_AT_US {
            return Err(at(format!("at_us is above {MAX_AT_US} (30 days)")));
        }
        if request.output_tokens > MAX_OUTPUT_TOKENS {
            return Err(at(format!("output_tokens is above {MAX_OUTPUT_TOKENS}")));
        }
        if let Some(previous) = requests.last().map(|r: &TraceRequest| r.at_us)
            && request.at_us < previous
        {
            return Err(at(format!(
                "at_us {} is before the line above's {previous}: a trace is in arrival order",
                request.at_us
            )));
        }
        if requests.len() == MAX_REQUESTS {
            return Err(TraceError::TooLong);
        }
        requests.push(request);
    }
    Ok(requests)
}

/// The lines of one reader, read under a trace's bounds: at most [`MAX_LINE_BYTES`]
/// a line, blank lines skipped, numbered from 1.
pub(crate) struct Lines<R> {
    reader: R,
    line: usize,
}

impl<R: BufRead> Lines<R> {
    pub(crate) fn new(reader: R) -> Self {
        Self { reader, line: 0 }
    }

    /// The number of the line read last.
    pub(crate) fn line(&self) -> usize {
        self.line
    }

    /// Reads the next line that is not blank into `buf`; `false` at the end. `total`
    /// counts the bytes of every reader under one [`MAX_TRACE_BYTES`]; `at` makes a
    /// line's error from its number and message.
    ///
    /// # Errors
    /// Reading failed, the line is too long, or the bytes in all are too many.
    pub(crate) fn next(
        &mut self,
        buf: &mut Vec<u8>,
        total: &mut u64,
        at: impl Fn(usize, String) -> TraceError,
    ) -> Result<bool, TraceError> {
        loop {
            buf.clear();
            self.line += 1;
            let read = std::io::Read::take(&mut self.reader, MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', buf)?;
            if read == 0 {
                return Ok(false);
            }
            if buf.len() > MAX_LINE_BYTES {
                return Err(at(self.line, format!("longer than {MAX_LINE_BYTES} bytes")));
            }
            *total += buf.len() as u64;
            if *total > MAX_TRACE_BYTES {
                return Err(TraceError::TooLarge);
            }
            if !buf.iter().all(u8::is_ascii_whitespace) {
                return Ok(true);
            }
        }
    }
}

/// Writes a trace, one request per line.
///
/// # Errors
/// Writing failed.
pub fn write_trace(mut out: impl std::io::Write, requests: &[TraceRequest]) -> std::io::Result<()> {
    for request in requests {
        serde_json::to_writer(&mut out, request)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}
