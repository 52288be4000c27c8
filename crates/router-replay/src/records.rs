//! Replayable decision records (`decisions.replayable`) read as a trace, and what
//! they say happened, so a replay of them can be set beside the live run they
//! recorded.
//!
//! Each record with a `replay` object becomes one request: arriving at its recorded
//! time (microseconds from the earliest record's), its prompt the recorded pages
//! ([`Segment::Pages`]) followed by the tokens after the last full page (drawn for
//! this request alone, so shared with none), its output the tokens the answer
//! reported (else the request's `max_tokens`, else 1; at most
//! [`MAX_OUTPUT_TOKENS`]), its session its session key
//! (else its routing key), as the record holds them: hashed when the router hashed
//! keys. Records are written as requests end, so they are sorted by arrival.
//! Records without a `replay` object (written before it was turned on) are counted
//! and left out.

use std::io::BufRead;

use serde::Deserialize;
use serde_json::Value;

use crate::report::{Outcome, RunReport};
use crate::trace::{
    Lines, MAX_AT_US, MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS, MAX_REQUESTS, PageHashes, Segment,
    TraceError, TraceRequest,
};

/// Records read as a trace, with what they say happened.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The requests, in arrival order.
    pub trace: Vec<TraceRequest>,
    /// What happened to each request of [`trace`](Self::trace), as recorded: its
    /// engine, outcome, first byte and end, and the cached tokens its engine
    /// reported. A streamed answer's first byte is its first token; an answer not
    /// streamed has its first byte when it is whole.
    pub happened: RunReport,
    /// The page size the prompts were hashed in, in tokens (`None` when no record
    /// has pages).
    pub page_tokens: Option<u32>,
    /// Records without a `replay` object, left out.
    pub not_replayable: usize,
    /// Requests whose prompt has no pages (their model has no tokenizer): replayed
    /// as prompts that share nothing.
    pub without_pages: usize,
    /// Requests served whose answer reported no output tokens: replayed with their
    /// `max_tokens`, or 1.
    pub without_output: usize,
    /// Whether each request of [`trace`](Self::trace) asked for a streamed answer
    /// (whose first byte is its first token).
    pub streamed: Vec<bool>,
}

/// The fields of a decision record a replay reads: `replay` first, the others only
/// of a record that has it.
#[derive(Debug, Deserialize)]
struct Record {
    #[serde(default)]
    replay: Option<ReplayFields>,
    #[serde(default)]
    model: Value,
    #[serde(default)]
    request: Value,
    #[serde(default)]
    pick: Value,
    #[serde(default)]
    result: Value,
}

/// A replayable record's other fields, read.
#[derive(Debug)]
struct Replayable {
    model: Option<String>,
    request: RecordedRequest,
    pick: Option<RecordedPick>,
    result: Option<RecordedResult>,
}

impl Replayable {
    fn of(record: Record) -> Result<Self, String> {
        fn read<T: serde::de::DeserializeOwned + Default>(
            field: &str,
            value: Value,
        ) -> Result<T, String> {
            if value.is_null() {
                return Ok(T::default());
            }
            serde_json::from_value(value).map_err(|e| format!("{field}: {e}"))
        }
        Ok(Self {
            model: read("model", record.model)?,
            request: read("request", record.request)?,
            pick: read("pick", record.pick)?,
            result: read("result", record.result)?,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
struct RecordedRequest {
    #[serde(default)]
    session_key: Option<String>,
    #[serde(default)]
    routing_key: Option<String>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
}

#[derive(Debug, Default, Deserialize)]
struct RecordedPick {
    engines: PickedEngines,
}

/// A plain pick, or a prefill/decode pair (whose prefill engine holds the prompt).
#[derive(Debug, Default, Deserialize)]
struct PickedEngines {
    #[serde(default)]
    plain: Option<Picked>,
    #[serde(default)]
    prefill: Option<Picked>,
}

#[derive(Debug, Clone, Deserialize)]
struct Picked {
    engine: String,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ReplayFields {
    arrival_unix_us: u64,
    prompt_tokens: u64,
    block_size: u32,
    #[serde(default)]
    pages: Option<PageHashes>,
}

#[derive(Debug, Default, Deserialize)]
struct RecordedResult {
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    code: String,
    #[serde(default)]
    first_byte_ms: Option<f64>,
    #[serde(default)]
    duration_ms: f64,
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    /// The engines that never started the request, and those picked next.
    #[serde(default)]
    retries: Vec<Retried>,
}

/// An engine that never started the request, and the engines picked next.
#[derive(Debug, Default, Deserialize)]
struct Retried {
    #[serde(default)]
    then: PickedEngines,
}

/// A record read, before the arrivals are made relative to the first.
struct Read {
    arrival_unix_us: u64,
    request: TraceRequest,
    happened: Outcome,
    engine: Option<String>,
    /// Served, but its answer reported no output tokens.
    without_output: bool,
    /// A streamed answer was asked for.
    streamed: bool,
}

/// The `code`s of capacity refusals recorded: the fleet's, a full or slow queue's.
const REFUSALS: [&str; 3] = ["at_capacity", "queue_full", "queue_timeout"];

/// Reads decision records (JSON lines; blank lines skipped) as a trace, in arrival
/// order, with what they say happened. `sources` are read in turn (a rotated file and
/// the current one), under one set of bounds: the trace's (line, total bytes,
/// requests, prompt and output lengths, 30 days from the first arrival to the last).
///
/// # Errors
/// A line that is not a JSON object or whose `replay` object is malformed, records
/// whose pages are of different sizes, or a bound broken; a line's error names its
/// source (by its place in `sources`, from 1) and line.
pub fn read_records<R: BufRead>(sources: Vec<R>) -> Result<Recorded, TraceError> {
    let mut read: Vec<Read> = Vec::new();
    let mut total = 0u64;
    let mut page_tokens: Option<u32> = None;
    let (mut not_replayable, mut without_pages, mut without_output) = (0, 0, 0);
    let mut buf = Vec::new();
    for (source, reader) in sources.into_iter().enumerate() {
        let mut lines = Lines::new(reader);
        let named = |line: usize, message: String| TraceError::Line {
            line,
            message: format!("(records {}) {message}", source + 1),
        };
        while lines.next(&mut buf, &mut total, named)? {
            let line = lines.line();
            let at = |message: String| named(line, message);
            let mut record: Record = serde_json::from_slice(&buf).map_err(|e| at(e.to_string()))?;
            let Some(replay) = record.replay.take() else {
                not_replayable += 1;
                continue;
            };
            match &replay.pages {
                // A prompt shorter than a page says nothing of the page size.
                Some(pages) if pages.0.is_empty() => {}
                Some(_) => match page_tokens {
                    None => page_tokens = Some(replay.block_size),
                    Some(size) if size == replay.block_size => {}
                    Some(size) => {
                        return Err(at(format!(
                            "pages of {} tokens after records with pages of {size}: replay one page size at a time",
                            replay.block_size
                        )));
                    }
                },
                None => without_pages += 1,
            }
            let record = Replayable::of(record).map_err(at)?;
            if read.len() == MAX_REQUESTS {
                return Err(TraceError::TooLong);
            }
            let request = request_of(record, replay, read.len()).map_err(at)?;
            if request.without_output {
                without_output += 1;
            }
            read.push(request);
        }
    }
    read.sort_by_key(|r| r.arrival_unix_us);
    let first = read.first().map_or(0, |r| r.arrival_unix_us);
    if let Some(last) = read.last()
        && last.arrival_unix_us - first > MAX_AT_US
    {
        return Err(TraceError::Span);
    }
    let mut engines: Vec<String> = Vec::new();
    let mut trace = Vec::with_capacity(read.len());
    let mut outcomes = Vec::with_capacity(read.len());
    let streamed = read.iter().map(|r| r.streamed).collect();
    for mut r in read {
        let at_us = r.arrival_unix_us - first;
        r.request.at_us = at_us;
        r.happened.arrived_us = at_us;
        r.happened.finished_us = r.happened.finished_us.map(|us| us.saturating_add(at_us));
        r.happened.engine = r
            .engine
            .map(|id| match engines.iter().position(|e| *e == id) {
                Some(place) => place,
                None => {
                    engines.push(id);
                    engines.len() - 1
                }
            });
        trace.push(r.request);
        outcomes.push(r.happened);
    }
    Ok(Recorded {
        trace,
        happened: RunReport::new(outcomes, engines),
        page_tokens,
        not_replayable,
        without_pages,
        without_output,
        streamed,
    })
}

/// The request `record` describes (its `replay` object taken out), the `place`-th
/// read, and what happened to it, its times still from the request's own arrival.
fn request_of(record: Replayable, replay: ReplayFields, place: usize) -> Result<Read, String> {
    let Replayable {
        model,
        request,
        pick,
        result,
    } = record;
    if replay.prompt_tokens > MAX_PROMPT_TOKENS {
        return Err(format!(
            "the prompt is longer than {MAX_PROMPT_TOKENS} tokens"
        ));
    }
    let mut prompt = Vec::new();
    let mut paged = 0u64;
    if let Some(pages) = replay.pages {
        if replay.block_size == 0 {
            return Err("pages of 0 tokens".into());
        }
        paged = (pages.0.len() as u64).saturating_mul(u64::from(replay.block_size));
        if paged > replay.prompt_tokens {
            return Err(format!(
                "{} pages of {} tokens are more than the prompt's {} tokens",
                pages.0.len(),
                replay.block_size,
                replay.prompt_tokens
            ));
        }
        prompt.push(Segment::Pages {
            pages,
            page_tokens: replay.block_size,
        });
    }
    let rest = replay.prompt_tokens - paged;
    if rest > 0 {
        // Drawn for this request alone: its place among the records read is its own.
        prompt.push(Segment::Named {
            id: format!("tail {place}"),
            tokens: u32::try_from(rest).unwrap_or(u32::MAX),
        });
    }
    let completion = result.as_ref().and_then(|r| r.completion_tokens);
    let output_tokens = completion
        .or(request.max_output_tokens)
        .unwrap_or(1)
        .clamp(1, u64::from(MAX_OUTPUT_TOKENS));
    let output_tokens = u32::try_from(output_tokens).unwrap_or(MAX_OUTPUT_TOKENS);
    let trace_request = TraceRequest {
        at_us: 0,
        model,
        session: request.session_key.or(request.routing_key),
        prompt,
        output_tokens,
    };
    let mut happened = Outcome::arrived(&trace_request);
    // A retried request went, in the end, to the last engines picked for it.
    let retried = result
        .as_ref()
        .and_then(|r| r.retries.last())
        .map(|r| &r.then);
    let picked = match retried {
        Some(then) => then.plain.as_ref().or(then.prefill.as_ref()).cloned(),
        None => pick.and_then(|p| p.engines.plain.or(p.engines.prefill)),
    };
    let engine = picked.as_ref().map(|p| p.engine.clone());
    happened.reason = picked.and_then(|p| p.reason);
    // Times past the trace's span are not a request's: held to it.
    let us = |ms: f64| ((ms.max(0.0) * 1000.0) as u64).min(MAX_AT_US);
    let mut without_output = false;
    match &result {
        Some(result)
            if result.outcome == "ok" && result.status.is_some_and(|s| (200..300).contains(&s)) =>
        {
            happened.ttft_us = result.first_byte_ms.map(us);
            happened.finished_us = Some(us(result.duration_ms));
            happened.cached_tokens = result
                .cached_tokens
                .unwrap_or(0)
                .min(happened.prompt_tokens);
            without_output = completion.is_none();
        }
        Some(result) if result.status == Some(429) || REFUSALS.contains(&result.code.as_str()) => {
            happened.rejected = true;
        }
        _ => happened.failed = true,
    }
    Ok(Read {
        arrival_unix_us: replay.arrival_unix_us,
        request: trace_request,
        happened,
        engine,
        without_output,
        streamed: request.stream,
    })
}

#[cfg(test)]
mod tests;
