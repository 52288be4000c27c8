//! The soak's hostile clients, beside the well-behaved load: each sends, in turn, a
//! chat whose body makes the engines answer 500 (it holds [`POISON`], the text every
//! engine fails on, as real engines fail on some inputs), a completion whose
//! `temperature` is a 30 MiB array, a chat of a million tiny messages, and a chat
//! that smuggles the fields the router owns (bootstrap, transfer parameters, a rank);
//! and keeps [`IDLE`] connections open and idle, reopening them as the router closes
//! them. What each may get is fixed: 502 for the poison (never a breaker opened on a
//! healthy engine), 400 (or 503 `overloaded` when the body budget is spent) for the
//! huge bodies, 200 for the smuggled fields (they are taken out), and the injected
//! faults' own outcomes; anything else fails the run.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::timeout;

use super::http::Connection;
use super::load::{Class, Kind, Load, MODEL};

/// The text every engine of the soak answers 500 to.
pub(crate) const POISON: &str = "SOAK-POISON-INPUT";

/// Idle connections each hostile client keeps open.
const IDLE: usize = 32;

/// The pause between two hostile requests of a client: the huge bodies cost the
/// router (and the machine) a parse each.
const PAUSE: Duration = Duration::from_millis(500);

/// The longest a hostile request may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// What a hostile client sends.
#[derive(Debug, Clone, Copy)]
enum Attack {
    Poison,
    HugeScalar,
    ManyMessages,
    Smuggled,
}

impl Attack {
    const ALL: [Attack; 4] = [
        Attack::Poison,
        Attack::HugeScalar,
        Attack::ManyMessages,
        Attack::Smuggled,
    ];

    fn label(self) -> &'static str {
        match self {
            Attack::Poison => "a body engines fail on",
            Attack::HugeScalar => "temperature as a 30 MiB array",
            Attack::ManyMessages => "a million tiny messages",
            Attack::Smuggled => "router-owned fields smuggled",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Attack::HugeScalar => "/v1/completions",
            _ => "/v1/chat/completions",
        }
    }

    /// The classes of what it may get: expected, an injected fault's, or neither.
    fn class(self, status: u16, code: &str) -> Class {
        match (self, status, code) {
            (Attack::Poison, 502, "upstream_error") => Class::Ok,
            (Attack::HugeScalar | Attack::ManyMessages, 400, _) => Class::Ok,
            (Attack::HugeScalar | Attack::ManyMessages, 503, "overloaded") => Class::Ok,
            (Attack::Smuggled, 200, _) => Class::Ok,
            (Attack::Poison | Attack::Smuggled, 502..=504, _) => Class::Fault,
            _ => Class::Unexpected,
        }
    }
}

/// The bodies, built once.
struct Bodies {
    poison: Vec<u8>,
    huge_scalar: Vec<u8>,
    many_messages: Vec<u8>,
    smuggled: Vec<u8>,
}

impl Bodies {
    fn new() -> Self {
        let chat = |content: &str| {
            serde_json::json!({
                "model": MODEL,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 8,
            })
        };
        let mut smuggled = chat("a plain question");
        smuggled["kv_transfer_params"] =
            serde_json::json!({"do_remote_prefill": true, "remote_host": "10.9.9.9"});
        smuggled["bootstrap_host"] = "10.9.9.9".into();
        smuggled["bootstrap_room"] = 7.into();
        smuggled["data_parallel_rank"] = 3.into();
        Self {
            poison: chat(&format!("please fail: {POISON}"))
                .to_string()
                .into_bytes(),
            huge_scalar: format!(
                r#"{{"model":"{MODEL}","prompt":"hi","temperature":[{}[]]}}"#,
                "[],".repeat(10 << 20)
            )
            .into_bytes(),
            many_messages: format!(
                r#"{{"model":"{MODEL}","messages":[{}{{"role":"user","content":""}}]}}"#,
                r#"{"role":"user","content":""},"#.repeat(1_080_000)
            )
            .into_bytes(),
            smuggled: smuggled.to_string().into_bytes(),
        }
    }

    fn of(&self, attack: Attack) -> &[u8] {
        match attack {
            Attack::Poison => &self.poison,
            Attack::HugeScalar => &self.huge_scalar,
            Attack::ManyMessages => &self.many_messages,
            Attack::Smuggled => &self.smuggled,
        }
    }
}

/// Starts `clients` hostile clients.
pub(crate) fn start(load: &Arc<Load>, clients: u64) -> JoinSet<()> {
    let bodies = Arc::new(Bodies::new());
    let mut started = JoinSet::new();
    for _ in 0..clients {
        started.spawn(client(Arc::clone(load), Arc::clone(&bodies)));
    }
    started
}

async fn client(load: Arc<Load>, bodies: Arc<Bodies>) {
    let mut idle: Vec<Connection> = Vec::new();
    for attack in Attack::ALL.iter().cycle() {
        if load.stop.load(Ordering::Relaxed) {
            return;
        }
        keep_idle(&load, &mut idle).await;
        let (class, outcome) = match timeout(DEADLINE, send(&load.router, *attack, &bodies)).await {
            Ok(Ok((status, code))) => (attack.class(status, &code), format!("{status} {code}")),
            Ok(Err(e)) => (
                Class::Unexpected,
                format!("client: no response: {}", e.kind()),
            ),
            Err(_) => (
                Class::Unexpected,
                format!("client: no answer within {} s", DEADLINE.as_secs()),
            ),
        };
        load.tally.add(
            Kind::Hostile,
            class,
            format!("{outcome} ({})", attack.label()),
        );
        tokio::time::sleep(PAUSE).await;
    }
}

/// Tops the idle connections up to [`IDLE`]: each has had one answer and is kept
/// open without another request (one the router closed is replaced).
async fn keep_idle(load: &Load, idle: &mut Vec<Connection>) {
    let mut open = Vec::with_capacity(IDLE);
    for connection in idle.drain(..) {
        if connection.is_open() {
            open.push(connection);
        }
    }
    while open.len() < IDLE {
        let Ok(mut connection) = Connection::open(&load.router).await else {
            break;
        };
        if connection.send("GET", "/health", &[], b"").await.is_err() {
            break;
        }
        let Ok(mut response) = connection.response().await else {
            break;
        };
        if connection.body(&mut response).await.is_err() {
            break;
        }
        open.push(connection);
    }
    *idle = open;
}

/// Sends one attack on a connection of its own; its status and error code.
async fn send(router: &str, attack: Attack, bodies: &Bodies) -> io::Result<(u16, String)> {
    let mut connection = Connection::open(router).await?;
    // A router that refuses a body before reading it all answers and closes: the
    // write then breaks, but the answer is there to read.
    let sent = connection
        .send("POST", attack.path(), &[], bodies.of(attack))
        .await;
    let mut response = match (connection.response().await, sent) {
        (Ok(response), _) => response,
        (Err(_), Err(e)) | (Err(e), Ok(())) => return Err(e),
    };
    let body = connection.body(&mut response).await?;
    let code = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
        .unwrap_or_default();
    Ok((response.status, code))
}
