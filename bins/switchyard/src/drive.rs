//! `switchyard drive`: a trace's requests sent to a running router at their arrival
//! times, or by a closed loop of clients, each as a streamed SGLang `/generate` of the
//! trace's token ids, measured as `switchyard replay` measures its own (the same table
//! and JSON).

use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures_util::StreamExt;
use router_replay::{
    ClosedLoop, Outcome, RunReport, TraceRequest, oracle_cached_tokens, read_trace,
    siblings_on_first_engine, table,
};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Options of `switchyard drive`.
#[derive(Debug, clap::Args)]
pub(crate) struct DriveArgs {
    /// The trace: JSON lines, one request each, in arrival order.
    #[arg(long)]
    trace: PathBuf,
    /// The router's base URL.
    #[arg(long)]
    url: String,
    /// The model to ask for when a request names none.
    #[arg(long)]
    model: String,
    /// The name of the run in the table.
    #[arg(long, default_value = "live")]
    label: String,
    /// Every engine of the fleet, in the order to report them, so that one that
    /// answered nothing counts in the load spread (default: those that answered).
    #[arg(long, value_delimiter = ',')]
    engines: Vec<String>,
    /// The header carrying a request's session.
    #[arg(long, default_value = "x-session-id")]
    session_header: String,
    /// Tokens per page, for the oracle.
    #[arg(long, default_value_t = 16)]
    page_size: u32,
    /// Most requests in flight (1 to 65536); a request due while this many are
    /// waits, and its wait counts in its time to first token.
    #[arg(long, default_value_t = 4096)]
    max_in_flight: usize,
    /// Send the trace's requests from N clients in a closed loop instead of at their
    /// times: each client sends its next request as soon as its previous one
    /// completed, the earliest in the trace whose session has nothing in flight
    /// (1 to 65536); a request's time to first token counts from when it was sent.
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..=MAX_IN_FLIGHT as u64),
        conflicts_with = "max_in_flight"
    )]
    closed_loop: Option<u64>,
    /// Also write the summary, with TTFT percentiles, as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The most requests in flight a run may ask for.
const MAX_IN_FLIGHT: usize = 1 << 16;
/// The longest stream event read; a longer one fails its request.
const MAX_EVENT_BYTES: usize = 1 << 20;

/// What one request came back with.
struct Answer {
    engine: Option<String>,
    reason: Option<String>,
    status: u16,
    /// The router's error code, for an error answer.
    code: Option<String>,
    first_token: Option<Duration>,
    last_token: Duration,
    cached_tokens: u64,
}

/// A request sent: when, microseconds from the run's start, and how it ended.
struct Sent {
    at_us: u64,
    ended: Ended,
}

/// How a request ended.
enum Ended {
    Answered(Answer),
    /// It could not be sent or its answer could not be read.
    Failed(String),
}

pub(crate) fn run(args: &DriveArgs) -> anyhow::Result<()> {
    let file = std::fs::File::open(&args.trace)
        .with_context(|| format!("opening {}", args.trace.display()))?;
    let trace = read_trace(BufReader::new(file))
        .with_context(|| format!("reading {}", args.trace.display()))?;
    anyhow::ensure!(
        (1..=MAX_IN_FLIGHT).contains(&args.max_in_flight),
        "--max-in-flight must be 1 to {MAX_IN_FLIGHT}"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let sent = match args.closed_loop {
        None => runtime.block_on(send_all(args, &trace))?,
        Some(clients) => runtime.block_on(send_closed(args, &trace, clients as usize))?,
    };
    let mut answered: Vec<&String> = sent
        .iter()
        .filter_map(|s| match &s.ended {
            Ended::Answered(answer) => answer.engine.as_ref(),
            Ended::Failed(_) => None,
        })
        .collect();
    answered.sort();
    answered.dedup();
    let mut engines = args.engines.clone();
    for engine in answered {
        if !engines.contains(engine) {
            engines.push(engine.clone());
        }
    }
    let mut failed: Vec<String> = Vec::new();
    let outcomes: Vec<Outcome> = trace
        .iter()
        .zip(&sent)
        .map(|(request, sent)| {
            let mut outcome = Outcome::arrived(request);
            outcome.arrived_us = sent.at_us;
            let answer = match &sent.ended {
                Ended::Answered(answer) => answer,
                Ended::Failed(error) => {
                    outcome.failed = true;
                    failed.push(error.clone());
                    return outcome;
                }
            };
            match (answer.status, answer.code.as_deref()) {
                (200, _) => {
                    outcome.engine = answer
                        .engine
                        .as_ref()
                        .and_then(|e| engines.iter().position(|known| known == e));
                    outcome.reason.clone_from(&answer.reason);
                    outcome.ttft_us = answer.first_token.map(|d| d.as_micros() as u64);
                    outcome.finished_us = Some(sent.at_us + answer.last_token.as_micros() as u64);
                    outcome.cached_tokens = answer.cached_tokens;
                }
                (429, _) | (503, Some("at_capacity")) => outcome.rejected = true,
                (status, code) => {
                    outcome.failed = true;
                    failed.push(format!("status {status} {}", code.unwrap_or_default()));
                }
            }
            outcome
        })
        .collect();
    let report = RunReport::new(outcomes, engines);
    let mut summary = report.summary(&args.label, oracle_cached_tokens(&trace, args.page_size));
    summary.siblings_on_first_engine = siblings_on_first_engine(&trace, &report);
    print!("{}", table(std::slice::from_ref(&summary)));
    if let Some(path) = &args.json {
        let out =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        serde_json::to_writer_pretty(BufWriter::new(out), &[&summary])
            .with_context(|| format!("writing {}", path.display()))?;
    }
    anyhow::ensure!(
        failed.is_empty(),
        "{} requests failed (the first: {:?})",
        failed.len(),
        failed.iter().take(5).collect::<Vec<_>>()
    );
    Ok(())
}

/// The client, at most `connections` idle connections kept, and the URL requests go
/// to.
fn client(args: &DriveArgs, connections: usize) -> anyhow::Result<(reqwest::Client, String)> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .timeout(Duration::from_secs(600))
        .build()?;
    Ok((
        client,
        format!("{}/generate", args.url.trim_end_matches('/')),
    ))
}

/// The streamed `/generate` of `request`'s token ids.
fn post(
    args: &DriveArgs,
    client: &reqwest::Client,
    url: &str,
    request: &TraceRequest,
) -> reqwest::RequestBuilder {
    let body = json!({
        "model": request.model.as_deref().unwrap_or(&args.model),
        "input_ids": request.tokens(),
        "sampling_params": {"max_new_tokens": request.output_tokens, "ignore_eos": true},
        "stream": true,
    });
    let mut post = client.post(url).json(&body);
    if let Some(session) = &request.session {
        post = post.header(args.session_header.as_str(), session.as_str());
    }
    post
}

/// Sends one request due at `due`, its stream read to the end.
async fn ended(post: reqwest::RequestBuilder, due: Instant) -> Ended {
    match exchange(post, due).await {
        Ok(answer) => Ended::Answered(answer),
        Err(e) => Ended::Failed(format!("{e:#}")),
    }
}

/// Sends each request at its arrival time, at most `--max-in-flight` at once.
async fn send_all(args: &DriveArgs, trace: &[TraceRequest]) -> anyhow::Result<Vec<Sent>> {
    let (client, url) = client(args, args.max_in_flight)?;
    let gate = Arc::new(Semaphore::new(args.max_in_flight));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(trace.len());
    let mut reported = start;
    for (i, request) in trace.iter().enumerate() {
        let due = start + Duration::from_micros(request.at_us);
        tokio::time::sleep_until(due).await;
        let permit = Arc::clone(&gate).acquire_owned().await?;
        if reported.elapsed() >= Duration::from_secs(5) {
            reported = Instant::now();
            eprintln!(
                "  {}: sent {i} of {}, {} in flight",
                args.label,
                trace.len(),
                args.max_in_flight - gate.available_permits()
            );
        }
        let post = post(args, &client, &url, request);
        let at_us = request.at_us;
        tasks.push(tokio::spawn(async move {
            let ended = ended(post, due).await;
            drop(permit);
            Sent { at_us, ended }
        }));
    }
    let mut sent = Vec::with_capacity(tasks.len());
    for task in tasks {
        sent.push(task.await?);
    }
    Ok(sent)
}

/// Sends the requests from `clients` clients in a closed loop ([`ClosedLoop`]).
async fn send_closed(
    args: &DriveArgs,
    trace: &[TraceRequest],
    clients: usize,
) -> anyhow::Result<Vec<Sent>> {
    let (client, url) = client(args, clients)?;
    let mut order = ClosedLoop::new(trace, clients);
    let mut sent: Vec<Option<Sent>> = trace.iter().map(|_| None).collect();
    let mut tasks = JoinSet::new();
    let start = Instant::now();
    let mut reported = start;
    let mut completed = 0;
    loop {
        while let Some(index) = order.send() {
            let post = post(args, &client, &url, &trace[index]);
            let due = Instant::now();
            let at_us = (due - start).as_micros() as u64;
            tasks.spawn(async move {
                (
                    index,
                    Sent {
                        at_us,
                        ended: ended(post, due).await,
                    },
                )
            });
        }
        let Some(joined) = tasks.join_next().await else {
            break;
        };
        let (index, done) = joined?;
        order.completed(index);
        sent[index] = Some(done);
        completed += 1;
        if reported.elapsed() >= Duration::from_secs(5) {
            reported = Instant::now();
            eprintln!(
                "  {}: {completed} of {} completed, {} in flight",
                args.label,
                trace.len(),
                tasks.len()
            );
        }
    }
    sent.into_iter()
        .map(|s| s.context("a request the closed loop never sent"))
        .collect()
}

/// Sends one request due at `due` and reads its stream to the end.
async fn exchange(post: reqwest::RequestBuilder, due: Instant) -> anyhow::Result<Answer> {
    let response = post.send().await.context("sending a request")?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let mut answer = Answer {
        engine: header("x-switchyard-engine"),
        reason: header("x-switchyard-reason"),
        status: response.status().as_u16(),
        code: None,
        first_token: None,
        last_token: Duration::ZERO,
        cached_tokens: 0,
    };
    if answer.status != 200 {
        let body = response.bytes().await.context("reading an error answer")?;
        let error: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        answer.code = error["error"]["code"].as_str().map(str::to_owned);
        answer.last_token = due.elapsed();
        return Ok(answer);
    }
    let mut stream = response.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    let mut last_event = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("reading a stream")?;
        // An event boundary may straddle the chunks: look from just before the new bytes.
        let mut from = pending.len().saturating_sub(1);
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending[from..].windows(2).position(|w| w == b"\n\n") {
            let end = from + end;
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            from = 0;
            let Some(data) = event.strip_prefix(b"data: ") else {
                continue;
            };
            let data = data.trim_ascii_end();
            if data == b"[DONE]" {
                continue;
            }
            answer.first_token.get_or_insert_with(|| due.elapsed());
            last_event = data.to_vec();
        }
        anyhow::ensure!(
            pending.len() <= MAX_EVENT_BYTES,
            "a stream event longer than {MAX_EVENT_BYTES} bytes"
        );
    }
    answer.last_token = due.elapsed();
    let last: serde_json::Value =
        serde_json::from_slice(&last_event).context("the stream's last event")?;
    answer.cached_tokens = last["meta_info"]["cached_tokens"].as_u64().unwrap_or(0);
    Ok(answer)
}
