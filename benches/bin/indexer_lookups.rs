//! Lookups a second one `switchyard indexer` answers on one core.
//!
//! `cargo build --release -p switchyard -p switchyard-benches --bin switchyard --bin
//! indexer_lookups && taskset -c 1 target/release/indexer_lookups [ENGINES] [PROMPTS]
//! [SECONDS] [ENCODING] [MATCH] [DEPTH]` (defaults 64, 16, 10, `binary`, `full`, 1)
//! starts ENGINES simulated engines in this process, serves PROMPTS prompts of 256
//! blocks (4,096 tokens) on each, and starts `switchyard indexer` (the binary beside
//! this one) pinned to core 0 (`taskset -c 0`: its runtime has one worker). Once the
//! indexer has applied every KV event, 32 clients on this process's core, one
//! keep-alive HTTP/1.1 connection each, send lookups of those prompts for SECONDS, in
//! ENCODING (`binary`, what routers send, or `json`). With MATCH `full` each is a
//! full match on one engine (the longest walk); with `none` its first block is one no
//! engine holds (the walk ends there: what remains is the exchange). A client sends
//! DEPTH lookups at once, pipelined, and reads their answers before sending more: 1 is
//! what a router's pooled connections do; more shows what the indexer would answer if
//! the exchanges' cost were shared by several lookups. It prints the lookups answered
//! a second, the CPU of the indexer and of this process over the run (from /proc),
//! and the lookups per CPU second of the indexer.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use engine_sim::{RunningEngine, SimConfig};
use router_state::kv_events::{chain_hashes, namespace_seed};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::time::{Duration, Instant};

const BLOCK: usize = 16;
const BLOCKS: usize = 256;
const CLIENTS: usize = 32;
/// The media type of a binary lookup (docs/operations.md, "The shared prefix
/// indexer").
const BINARY_LOOKUP: &str = "application/vnd.switchyard.prefix-lookup";

fn tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/tokenizer-bytes/tokenizer.json")
}

fn config(sims: &[RunningEngine]) -> String {
    let engines: Vec<Value> = sims
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"id": format!("E{i}"), "url": s.url(), "role": "plain"}))
        .collect();
    json!({
        "listen": "127.0.0.1:0",
        "models": [{"id": "m", "tokenizer": tokenizer(), "block_size": BLOCK, "engines": engines,
                    "policies": {"plain": {"type": "cache_aware"}}}],
    })
    .to_string()
}

/// Utime plus stime of process `pid` (`self` for this one), in clock ticks.
fn cpu_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("a process's stat");
    let after = &stat[stat.rfind(')').expect("a comm field") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

fn ticks_per_second() -> f64 {
    let out = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("getconf");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("CLK_TCK")
}

async fn applied(client: &reqwest::Client, addr: &str) -> u64 {
    let text = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("the indexer's metrics")
        .text()
        .await
        .expect("a body");
    text.lines()
        .find_map(|l| {
            l.strip_prefix("switchyard_kv_feed_events_total{event=\"applied\"} ")?
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(0.0) as u64
}

fn prompt(seed: usize) -> Vec<u32> {
    (0..BLOCK * BLOCKS)
        .map(|i| u32::try_from((seed * 7_919 + i * 31) % 50_000).expect("small"))
        .collect()
}

/// A lookup of model `m`'s `hashes` in `encoding`, and its media type.
fn body(encoding: &str, hashes: &[u64]) -> (bytes::Bytes, &'static str) {
    match encoding {
        "json" => (
            json!({"model": "m", "hashes": hashes}).to_string().into(),
            "application/json",
        ),
        "binary" => {
            // Flags (none), the model name's length, the name, the hashes.
            let mut body = vec![0, 1, b'm'];
            for hash in hashes {
                body.extend_from_slice(&hash.to_le_bytes());
            }
            (body.into(), BINARY_LOOKUP)
        }
        other => panic!("ENCODING is binary or json, not {other}"),
    }
}

/// The indexer's process, stopped when dropped (a failed run included), and its
/// stdout, kept open until then so it never writes into a closed pipe.
struct Indexer {
    child: std::process::Child,
    stdout: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Drop for Indexer {
    fn drop(&mut self) {
        drop(self.child.kill());
        drop(self.child.wait());
    }
}

/// `switchyard indexer` on `file`, pinned to core 0, and its address.
fn start_indexer(file: &std::path::Path) -> (Indexer, String) {
    let binary = std::env::current_exe()
        .expect("this program")
        .with_file_name("switchyard");
    assert!(
        binary.exists(),
        "{} is missing: cargo build --release -p switchyard",
        binary.display()
    );
    let mut child = Command::new("taskset")
        .args(["-c", "0"])
        .arg(binary)
        .args(["indexer", "--listen", "127.0.0.1:0", "--config"])
        .arg(file)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("taskset starts the indexer");
    let stdout = child.stdout.take().expect("stdout");
    let mut indexer = Indexer {
        child,
        stdout: std::io::BufReader::new(stdout).lines(),
    };
    loop {
        let line = indexer
            .stdout
            .next()
            .expect("the indexer's ready line")
            .expect("its stdout");
        if let Ok(ready) = serde_json::from_str::<Value>(&line)
            && ready["event"] == "ready"
        {
            let addr = ready["addr"].as_str().expect("an address").to_owned();
            return (indexer, addr);
        }
    }
}

/// A client's keep-alive HTTP/1.1 connection to the indexer, written to and read
/// from directly: the cheapest client, so that its core is not what bounds the rate.
struct Connection {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
    sent: Vec<u8>,
    line: String,
    answer: Vec<u8>,
}

impl Connection {
    async fn open(addr: &str) -> Self {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("a connection");
        stream.set_nodelay(true).expect("nodelay");
        let (reader, writer) = stream.into_split();
        Self {
            reader: BufReader::new(reader),
            writer,
            sent: Vec::new(),
            line: String::new(),
            answer: Vec::new(),
        }
    }

    /// Sends `requests` (`depth` of them) in one write, then reads as many answers,
    /// each a 200.
    async fn exchange(&mut self, requests: impl Iterator<Item = &Vec<u8>>, depth: usize) {
        self.sent.clear();
        for request in requests {
            self.sent.extend_from_slice(request);
        }
        self.writer
            .write_all(&self.sent)
            .await
            .expect("a lookup sent");
        for _ in 0..depth {
            let mut length = None;
            let mut status = true;
            loop {
                self.line.clear();
                self.reader
                    .read_line(&mut self.line)
                    .await
                    .expect("an answer's head");
                let line = self.line.trim_end();
                if status {
                    assert!(line.starts_with("HTTP/1.1 200 "), "{line}");
                    status = false;
                } else if line.is_empty() {
                    break;
                } else if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = Some(value.trim().parse::<usize>().expect("a length"));
                }
            }
            self.answer.resize(length.expect("a content-length"), 0);
            self.reader
                .read_exact(&mut self.answer)
                .await
                .expect("an answer's body");
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(drive(&args));
}

/// Starts the engines and the indexer, fills the index, and measures.
async fn drive(args: &[String]) {
    let arg = |i: usize, default: usize| {
        args.get(i)
            .map_or(default, |n| n.parse().expect("a number"))
    };
    let (engines, prompts, seconds, depth) = (arg(1, 64), arg(2, 16), arg(3, 10), arg(6, 1));
    let encoding = args.get(4).map_or("binary", String::as_str);
    let full = match args.get(5).map_or("full", String::as_str) {
        "full" => true,
        "none" => false,
        other => panic!("MATCH is full or none, not {other}"),
    };
    let mut sims = Vec::new();
    for _ in 0..engines {
        let mut c = SimConfig::for_tests();
        c.model = "m".into();
        c.tokenizer = Some(tokenizer());
        c.page_size = 16;
        c.kv_port = Some(0);
        c.replay_port = Some(0);
        c.kv_capacity_tokens = (2 * prompts * BLOCK * BLOCKS) as u64;
        sims.push(engine_sim::start(c).await.expect("an engine"));
    }
    let file = std::env::temp_dir().join(format!("indexer-lookups-{}.yaml", std::process::id()));
    std::fs::write(&file, config(&sims)).expect("the config is written");
    let (indexer, addr) = start_indexer(&file);
    let client = reqwest::Client::new();

    let mut bodies = Vec::new();
    let mut media = "";
    for (e, sim) in sims.iter().enumerate() {
        for k in 0..prompts {
            let tokens = prompt(e * prompts + k);
            let mut hashes = chain_hashes(&tokens, BLOCK, namespace_seed(None));
            if !full {
                hashes[0] ^= 1;
            }
            let (lookup, kind) = body(encoding, &hashes);
            bodies.push(lookup);
            media = kind;
            sim.engine().serve(tokens, 1).await;
        }
    }
    let published: u64 = sims.iter().map(|s| s.engine().published_batches()).sum();
    while applied(&client, &addr).await < published {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer: Value = client
        .post(format!("http://{addr}/v1/prefix/lookup"))
        .body(bodies[0].clone())
        .header("content-type", media)
        .send()
        .await
        .expect("a lookup")
        .json()
        .await
        .expect("an answer");
    let expected = if full {
        json!([["E0", BLOCKS]])
    } else {
        json!([])
    };
    assert_eq!(answer["engines"], expected, "the match asked for");

    let requests: Arc<Vec<Vec<u8>>> = Arc::new(
        bodies
            .iter()
            .map(|body| {
                let mut request = format!(
                    "POST /v1/prefix/lookup HTTP/1.1\r\nhost: {addr}\r\ncontent-type: {media}\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                request.extend_from_slice(body);
                request
            })
            .collect(),
    );
    let (count, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let (ticks, pid) = (ticks_per_second(), indexer.child.id().to_string());
    let (cpu_before, own_before) = (cpu_ticks(&pid), cpu_ticks("self"));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (requests, count, stop, addr) = (
                Arc::clone(&requests),
                Arc::clone(&count),
                Arc::clone(&stop),
                addr.clone(),
            );
            tokio::spawn(async move {
                let mut connection = Connection::open(&addr).await;
                let mut i = c;
                while !stop.load(Ordering::Relaxed) {
                    let batch = (0..depth).map(|k| &requests[(i + k * CLIENTS) % requests.len()]);
                    connection.exchange(batch, depth).await;
                    count.fetch_add(depth as u64, Ordering::Relaxed);
                    i += depth * CLIENTS;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(seconds as u64)).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = (cpu_ticks(&pid) - cpu_before) as f64 / ticks;
    let own = (cpu_ticks("self") - own_before) as f64 / ticks;
    let lookups = count.load(Ordering::Relaxed) as f64;
    for task in tasks {
        task.await.expect("a client");
    }
    let walk = if full { "full match" } else { "no match" };
    println!(
        "{engines} engines x {prompts} prompts of {BLOCKS} blocks, {encoding} lookups ({walk}), {CLIENTS} clients x {depth} in flight, {elapsed:.1} s: {:.0} lookups/s, indexer CPU {:.0}% of a core, clients {:.0}%, {:.0} lookups per indexer CPU second",
        lookups / elapsed,
        100.0 * cpu / elapsed,
        100.0 * own / elapsed,
        lookups / cpu
    );
    drop(indexer);
    std::fs::remove_file(&file).expect("the config is removed");
    for sim in sims {
        sim.shutdown().await;
    }
}
