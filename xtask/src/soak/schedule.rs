//! The soak's schedule: every phase each faulty engine moves on to its next fault
//! (`POST /admin/faults` on the simulated engine), and every change period one of the
//! floating engines is removed from or added back to the router through its admin
//! API. Every call's result is counted with the load's outcomes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, interval_at};

use super::http::call;
use super::load::{Class, Kind, MODEL, Tally};

/// How long each fault stays on.
const PHASE: Duration = Duration::from_secs(15);
/// How often a floating engine leaves or rejoins.
const CHANGE: Duration = Duration::from_secs(20);

/// The faults each faulty engine cycles through, as `POST /admin/faults` bodies (the
/// body replaces the whole set, so each switches the previous fault off).
const FAULTS: &[(&str, &str)] = &[
    ("none", "{}"),
    ("500s", r#"{"error_rate": 0.3}"#),
    ("hang", r#"{"hang_before_first_byte": true}"#),
    ("mid-stream disconnect", r#"{"disconnect_after_chunks": 3}"#),
    ("health flap", r#"{"fail_health": true}"#),
    (
        "KV publisher restart",
        r#"{"restart_publisher_after_batches": 20}"#,
    ),
    ("KV event gap", r#"{"drop_event_batches": 5}"#),
];

/// A simulated engine of the soak.
#[derive(Debug, Clone)]
pub(crate) struct Engine {
    pub(crate) id: String,
    /// `host:port` of its HTTP server.
    pub(crate) addr: String,
    /// Whether faults are injected into it.
    pub(crate) faulty: bool,
    /// Whether it starts outside the router and is added and removed through the
    /// admin API.
    pub(crate) floating: bool,
}

/// The router's admin API and the engines the schedule works on.
#[derive(Debug)]
pub(crate) struct Fleet {
    pub(crate) router: String,
    pub(crate) token: String,
    pub(crate) engines: Vec<Engine>,
}

/// Runs the schedule until aborted.
pub(crate) async fn run(fleet: Arc<Fleet>, tally: Arc<Tally>) {
    let started = Instant::now();
    let tick = Duration::from_secs(5);
    let mut ticks = interval_at(started + tick, tick);
    let mut registered: BTreeSet<String> = fleet
        .engines
        .iter()
        .filter(|e| !e.floating)
        .map(|e| e.id.clone())
        .collect();
    let floating: Vec<&Engine> = fleet.engines.iter().filter(|e| e.floating).collect();
    let (mut phase, mut change) = (0usize, 0usize);
    loop {
        ticks.tick().await;
        let elapsed = started.elapsed();
        if elapsed >= PHASE * u32::try_from(phase + 1).unwrap_or(u32::MAX) {
            phase += 1;
            let mut switched = Vec::new();
            for (offset, engine) in fleet.engines.iter().filter(|e| e.faulty).enumerate() {
                let (name, body) = FAULTS[(phase + offset) % FAULTS.len()];
                set_faults(engine, body, &tally).await;
                switched.push(format!("{} {name}", engine.id));
            }
            eprintln!(
                "[{:>4} s] faults: {}",
                elapsed.as_secs(),
                switched.join(", ")
            );
        }
        if !floating.is_empty() && elapsed >= CHANGE * u32::try_from(change + 1).unwrap_or(u32::MAX)
        {
            let engine = floating[change % floating.len()];
            change += 1;
            let done = if registered.remove(&engine.id) {
                remove(&fleet, engine, &tally).await;
                "removed"
            } else {
                add(&fleet, engine, &tally).await;
                registered.insert(engine.id.clone());
                "added"
            };
            eprintln!("[{:>4} s] engine {} {done}", elapsed.as_secs(), engine.id);
        }
    }
}

/// Switches every fault off on every engine.
pub(crate) async fn clear_faults(fleet: &Fleet, tally: &Tally) {
    for engine in fleet.engines.iter().filter(|e| e.faulty) {
        set_faults(engine, FAULTS[0].1, tally).await;
    }
}

/// Replaces the engine's fault set with `body`, keeping the failure on the hostile
/// clients' poisoned input every engine has.
async fn set_faults(engine: &Engine, body: &str, tally: &Tally) {
    let mut faults: serde_json::Value = serde_json::from_str(body).expect("a fault set is JSON");
    faults["error_on"] = super::hostile::POISON.into();
    let body = faults.to_string();
    let result = call(&engine.addr, "POST", "/admin/faults", &[], body.as_bytes()).await;
    count(tally, "POST /admin/faults", result, 200);
}

async fn add(fleet: &Fleet, engine: &Engine, tally: &Tally) {
    let body = serde_json::json!({
        "id": engine.id,
        "url": format!("http://{}", engine.addr),
        "model": MODEL,
        "role": "plain",
    })
    .to_string();
    let authorization = format!("Bearer {}", fleet.token);
    let result = call(
        &fleet.router,
        "POST",
        "/workers",
        &[("authorization", &authorization)],
        body.as_bytes(),
    )
    .await;
    count(tally, "POST /workers", result, 201);
}

async fn remove(fleet: &Fleet, engine: &Engine, tally: &Tally) {
    let authorization = format!("Bearer {}", fleet.token);
    let result = call(
        &fleet.router,
        "DELETE",
        &format!("/workers/{}", engine.id),
        &[("authorization", &authorization)],
        b"",
    )
    .await;
    count(tally, "DELETE /workers", result, 204);
}

fn count(tally: &Tally, what: &str, result: std::io::Result<(u16, Vec<u8>)>, expected: u16) {
    match result {
        Ok((status, _)) if status == expected => {
            tally.add(Kind::Admin, Class::Ok, format!("{what} {status}"));
        }
        Ok((status, body)) => tally.add(
            Kind::Admin,
            Class::Unexpected,
            format!("{what} {status}: {}", String::from_utf8_lossy(&body)),
        ),
        Err(e) => tally.add(Kind::Admin, Class::Unexpected, format!("{what}: {e}")),
    }
}
