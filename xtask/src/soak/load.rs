//! The soak's load: client connections that each send chat requests one after
//! another on a kept-alive connection: JSON answers, SSE streams read to the end, and
//! streams the client abandons after a few events by closing the connection. Every
//! answer is sorted into an outcome and counted.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::timeout;

use super::http::{Connection, Response};

/// The model the soak's router serves.
pub(crate) const MODEL: &str = "soak-model";

/// The longest a request may take before the client gives up and counts it stuck.
const REQUEST_DEADLINE: Duration = Duration::from_secs(30);

/// Shared system prompts, so cache-aware routing finds prefixes on the engines.
const SYSTEM_PROMPTS: u64 = 8;

const WORDS: &[&str] = &[
    "route", "engine", "token", "prefix", "cache", "bucket", "stream", "health", "probe", "decode",
    "prefill", "switch", "yard", "signal", "queue", "budget",
];

/// What a client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Json,
    Stream,
    Cancelled,
    /// Calls of the schedule: faults switched, engines added and removed.
    Admin,
    /// The hostile clients' requests.
    Hostile,
}

impl Kind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Json => "JSON",
            Kind::Stream => "SSE",
            Kind::Cancelled => "SSE cancelled by the client",
            Kind::Admin => "admin and fault calls",
            Kind::Hostile => "hostile",
        }
    }
}

/// Whether an outcome is a success, what an injected fault produces, or a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Class {
    Ok,
    Fault,
    Unexpected,
}

impl Class {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Class::Ok => "ok",
            Class::Fault => "injected fault",
            Class::Unexpected => "UNEXPECTED",
        }
    }
}

/// Outcome counts by request kind and outcome.
#[derive(Debug, Default)]
pub(crate) struct Tally(Mutex<BTreeMap<(Kind, String), (Class, u64)>>);

impl Tally {
    pub(crate) fn add(&self, kind: Kind, class: Class, outcome: String) {
        let mut counts = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        counts.entry((kind, outcome)).or_insert((class, 0)).1 += 1;
    }

    /// Every outcome with its class and count.
    pub(crate) fn snapshot(&self) -> Vec<(Kind, String, Class, u64)> {
        let counts = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        counts
            .iter()
            .map(|((kind, outcome), (class, n))| (*kind, outcome.clone(), *class, *n))
            .collect()
    }
}

/// What the clients share.
#[derive(Debug)]
pub(crate) struct Load {
    /// The router's address.
    pub(crate) router: String,
    /// Engines no fault is ever injected into.
    pub(crate) clean: BTreeSet<String>,
    /// Set to stop: each client finishes its current request.
    pub(crate) stop: AtomicBool,
    pub(crate) tally: Tally,
}

/// Starts `connections` clients.
pub(crate) fn start(load: &Arc<Load>, connections: u64) -> JoinSet<()> {
    let mut clients = JoinSet::new();
    for id in 0..connections {
        clients.spawn(client(Arc::clone(load), id));
    }
    clients
}

/// A small, seedable generator (splitmix64).
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

async fn client(load: Arc<Load>, id: u64) {
    let mut draws = Draws(id);
    let mut connection: Option<Connection> = None;
    while !load.stop.load(Ordering::Relaxed) {
        let kind = match draws.below(10) {
            0..4 => Kind::Json,
            4..8 => Kind::Stream,
            _ => Kind::Cancelled,
        };
        let mut open = match connection.take() {
            Some(open) => open,
            None => match Connection::open(&load.router).await {
                Ok(open) => open,
                Err(e) => {
                    load.tally.add(
                        kind,
                        Class::Unexpected,
                        format!("client: connect failed: {e}"),
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let body = chat_body(kind, &mut draws);
        let cancel_after = 1 + draws.below(3);
        match timeout(
            REQUEST_DEADLINE,
            exchange(&mut open, kind, &body, cancel_after, &load.clean),
        )
        .await
        {
            Ok(Ok((class, outcome, keep))) => {
                load.tally.add(kind, class, outcome);
                if keep {
                    connection = Some(open);
                }
            }
            Ok(Err(e)) if kind != Kind::Json && broken(&e) => load.tally.add(
                kind,
                Class::Fault,
                "no status: closed (a stream cut right after its head)".into(),
            ),
            Ok(Err(e)) => load.tally.add(
                kind,
                Class::Unexpected,
                format!("client: no response: {}", e.kind()),
            ),
            Err(_) => load.tally.add(
                kind,
                Class::Unexpected,
                format!("client: no answer within {} s", REQUEST_DEADLINE.as_secs()),
            ),
        }
    }
}

/// Whether the router closed the connection: when an engine cuts a stream right
/// after its head, the router's server may close the client's connection before it
/// has flushed the 200 head (the fault's outcome, but seen before any status).
fn broken(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
    )
}

/// A chat request: one of the shared system prompts and a short varied question.
fn chat_body(kind: Kind, draws: &mut Draws) -> Vec<u8> {
    let system = draws.below(SYSTEM_PROMPTS);
    let system_prompt = format!(
        "You are assistant {system} of the soak test. {}",
        "Answer briefly and precisely; cite the routing rules you rely on. ".repeat(12)
    );
    let words = 10 + draws.below(50);
    let question: Vec<&str> = (0..words)
        .map(|_| WORDS[draws.below(WORDS.len() as u64) as usize])
        .collect();
    let max_tokens = if kind == Kind::Cancelled {
        64
    } else {
        8 + draws.below(25)
    };
    serde_json::json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": question.join(" ")},
        ],
        "max_tokens": max_tokens,
        "stream": kind != Kind::Json,
    })
    .to_string()
    .into_bytes()
}

/// Sends one request and reads its answer: the outcome's class and name, and whether
/// the connection can be used again.
async fn exchange(
    connection: &mut Connection,
    kind: Kind,
    body: &[u8],
    cancel_after: u64,
    clean: &BTreeSet<String>,
) -> io::Result<(Class, String, bool)> {
    connection
        .send("POST", "/v1/chat/completions", &[], body)
        .await?;
    let mut response = connection.response().await?;
    if response.status != 200 {
        return Ok(match connection.body(&mut response).await {
            Ok(body) => {
                let class = match response.status {
                    502..=504 => Class::Fault,
                    _ => Class::Unexpected,
                };
                (
                    class,
                    format!("{} {}", response.status, error_code(&body)),
                    response.keep_alive(),
                )
            }
            Err(_) => (
                Class::Unexpected,
                format!("{} with a cut body", response.status),
                false,
            ),
        });
    }
    let engine = response
        .header("x-switchyard-engine")
        .unwrap_or("no engine header")
        .to_owned();
    let cut_class = |kind: Kind| {
        if kind == Kind::Json || clean.contains(&engine) {
            Class::Unexpected
        } else {
            Class::Fault
        }
    };
    if kind == Kind::Json {
        return Ok(match connection.body(&mut response).await {
            Ok(body) if body.windows(9).any(|w| w == b"\"choices\"") => {
                (Class::Ok, "200".into(), response.keep_alive())
            }
            Ok(_) => (Class::Unexpected, "200 without choices".into(), false),
            Err(_) => (cut_class(kind), format!("200 body cut on {engine}"), false),
        });
    }
    let limit = if kind == Kind::Cancelled {
        cancel_after
    } else {
        u64::MAX
    };
    let (ended, events, body) = read_events(connection, &mut response, limit).await;
    let done = body.windows(12).any(|w| w == b"data: [DONE]");
    Ok(match ended {
        Ended::Cancelled => (Class::Ok, "200 cancelled mid-stream".into(), false),
        Ended::Complete if done => (Class::Ok, "200".into(), response.keep_alive()),
        Ended::Complete => (
            cut_class(kind),
            format!("200 stream ended without [DONE] on {engine}"),
            false,
        ),
        Ended::Cut => (
            cut_class(kind),
            format!(
                "200 stream cut on {engine}{}",
                if events == 0 { " before any event" } else { "" }
            ),
            false,
        ),
    })
}

/// How a stream's reading ended.
enum Ended {
    /// The body ended as framed.
    Complete,
    /// The connection broke inside the body.
    Cut,
    /// The client had read as many events as it wanted.
    Cancelled,
}

/// Reads a stream until it ends or `limit` events arrived: how it ended, the events
/// seen and the bytes read.
async fn read_events(
    connection: &mut Connection,
    response: &mut Response,
    limit: u64,
) -> (Ended, u64, Vec<u8>) {
    let mut body = Vec::new();
    loop {
        let events = body.windows(5).filter(|w| w == b"data:").count() as u64;
        if events >= limit {
            return (Ended::Cancelled, events, body);
        }
        match connection.next_piece(response).await {
            Ok(Some(piece)) => body.extend_from_slice(&piece),
            Ok(None) => return (Ended::Complete, events, body),
            Err(_) => return (Ended::Cut, events, body),
        }
    }
}

/// The `error.code` of an error body, or a note that it has none.
fn error_code(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "(no error code)".into())
}
