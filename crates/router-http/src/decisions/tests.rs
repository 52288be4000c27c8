use std::time::Duration;

use super::*;

fn config(dir: &Path, sample_ratio: f64) -> DecisionsConfig {
    DecisionsConfig::new(dir.join("decisions.jsonl"), sample_ratio)
}

#[test]
fn exactly_every_nth_request_is_sampled() {
    let dir = tempdir();
    for (ratio, every) in [(1.0, 1), (0.5, 2), (0.01, 100), (0.25, 4)] {
        let log = DecisionLog::open(&config(&dir, ratio), Family::default()).unwrap();
        let sampled: Vec<u64> = (1..=400).filter(|_| log.sample()).collect();
        let expected: Vec<u64> = (1..=400).filter(|n| n % every == 0).collect();
        assert_eq!(sampled, expected, "ratio {ratio}");
    }
}

fn tempdir() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "switchyard-decisions-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn written(family: &Family<OutcomeLabels, Counter>, outcome: &'static str) -> u64 {
    family.get_or_create(&OutcomeLabels { outcome }).get()
}

#[tokio::test(start_paused = true)]
async fn records_are_written_as_lines_and_the_file_rotates_at_its_bound() {
    let dir = tempdir();
    let mut config = config(&dir, 1.0);
    config.max_file_bytes = 1 << 20;
    let family = Family::default();
    let log = Arc::new(DecisionLog::open(&config, family.clone()).unwrap());
    let pad = "x".repeat(12_000);
    for i in 0..200 {
        let mut record = PendingRecord::new(
            Arc::clone(&log),
            json!({"n": i, "pad": pad}),
            "id",
            Instant::now(),
        );
        tokio::time::advance(Duration::from_millis(3)).await;
        record.relayed();
        record.finish(
            200,
            "ok",
            "ok",
            Usage {
                prompt_tokens: Some(9),
                cached_tokens: Some(7),
                completion_tokens: Some(3),
            },
        );
    }
    // Records count as written once flushed.
    let written_all = async {
        while written(&family, "written") < 200 {
            tokio::task::yield_now().await;
            std::thread::yield_now();
        }
    };
    drop(log);
    tokio::time::timeout(Duration::from_secs(3600), written_all)
        .await
        .expect("every record is written");
    assert_eq!(written(&family, "dropped"), 0);
    let current = std::fs::read_to_string(dir.join("decisions.jsonl")).unwrap();
    let older = std::fs::read_to_string(dir.join("decisions.jsonl.1")).unwrap();
    assert!(current.len() as u64 <= config.max_file_bytes);
    assert!(older.len() as u64 <= config.max_file_bytes);
    let last: Value = serde_json::from_str(current.lines().last().unwrap()).unwrap();
    assert_eq!(last["n"], 199);
    assert_eq!(last["request_id"], "id");
    assert_eq!(last["result"]["status"], 200);
    assert_eq!(last["result"]["prompt_tokens"], 9);
    assert_eq!(last["result"]["cached_tokens"], 7);
    assert_eq!(last["result"]["completion_tokens"], 3);
    assert_eq!(last["result"]["first_byte_ms"], 3.0);
    assert_eq!(last["result"]["retries"], json!([]));
    let first_kept: Value = serde_json::from_str(older.lines().next().unwrap()).unwrap();
    let kept = older.lines().count() + current.lines().count();
    assert_eq!(
        first_kept["n"].as_u64().unwrap() as usize + kept,
        200,
        "the two files hold the latest records, in order"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_full_queue_or_an_oversized_record_is_dropped_and_counted() {
    // A log whose queue nobody reads: the test holds the receiving end.
    let (queue, lines) = sync_channel(1);
    let family = Family::default();
    let log = DecisionLog {
        sampled: Share::new(1.0),
        queue,
        queued: Arc::default(),
        counts: Counts {
            family: family.clone(),
            logged: Arc::default(),
        },
        key_hashing: None,
        page_hashing: None,
        tokenizing: Arc::new(Semaphore::new(RECORD_TOKENIZING)),
    };
    for _ in 0..100 {
        log.send("{}".into());
    }
    assert_eq!(written(&family, "dropped"), 99);
    log.send("x".repeat(MAX_RECORD_BYTES + 1));
    assert_eq!(written(&family, "dropped"), 100);
    assert_eq!(lines.try_iter().count(), 1);
}

#[test]
fn a_record_dropped_unfinished_is_queued_as_cancelled() {
    let (queue, lines) = sync_channel(4);
    let log = Arc::new(DecisionLog {
        sampled: Share::new(1.0),
        queue,
        queued: Arc::default(),
        counts: Counts {
            family: Family::default(),
            logged: Arc::default(),
        },
        key_hashing: None,
        page_hashing: None,
        tokenizing: Arc::new(Semaphore::new(RECORD_TOKENIZING)),
    });
    drop(PendingRecord::new(
        Arc::clone(&log),
        json!({}),
        "gone",
        Instant::now(),
    ));
    PendingRecord::new(Arc::clone(&log), json!({}), "done", Instant::now()).finish(
        503,
        "server_error",
        "x",
        Usage::default(),
    );
    let records: Vec<Value> = lines
        .try_iter()
        .map(|l| serde_json::from_str(&l).unwrap())
        .collect();
    assert_eq!(records.len(), 2, "each record queued once");
    assert_eq!(records[0]["request_id"], "gone");
    assert_eq!(records[0]["result"]["status"], Value::Null);
    assert_eq!(records[0]["result"]["code"], "client_disconnected");
    assert_eq!(records[1]["result"]["status"], 503);
}

/// Every line of the records' file once `records` (a record each) are written.
async fn lines_written(config: &DecisionsConfig, records: &[Value]) -> Vec<Value> {
    let family = Family::default();
    let log = Arc::new(DecisionLog::open(config, family.clone()).unwrap());
    for decision in records {
        PendingRecord::new(Arc::clone(&log), decision.clone(), "id", Instant::now()).finish(
            200,
            "ok",
            "ok",
            Usage::default(),
        );
    }
    drop(log);
    let all = records.len() as u64;
    let ended = || ["written", "dropped", "failed"].map(|outcome| written(&family, outcome));
    while ended().iter().sum::<u64>() < all {
        tokio::task::yield_now().await;
        std::thread::yield_now();
    }
    assert_eq!(ended(), [all, 0, 0], "every record is written");
    std::fs::read_to_string(&config.path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_files_are_created_readable_by_their_owner_alone() {
    let dir = tempdir();
    let mut config = config(&dir, 1.0);
    config.max_file_bytes = 1 << 20;
    let pad = "x".repeat(200_000);
    let records: Vec<Value> = (0..6).map(|n| json!({"n": n, "pad": pad})).collect();
    lines_written(&config, &records).await;
    for file in ["decisions.jsonl", "decisions.jsonl.1"] {
        let mode = std::fs::metadata(dir.join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file}, a rotation's included");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(start_paused = true)]
async fn keys_are_recorded_verbatim_or_as_keyed_hashes_on_request() {
    let request = |session: &str| json!({"request": {"session_key": session, "routing_key": "tenant-7", "prompt_tokens": 3}});
    let records = [request("alice"), request("alice"), request("bob")];
    let dir = tempdir();
    let verbatim = lines_written(&config(&dir, 1.0), &records).await;
    assert_eq!(verbatim[0]["request"]["session_key"], "alice");
    assert_eq!(verbatim[0]["request"]["routing_key"], "tenant-7");

    let mut hashing = config(&dir, 1.0);
    hashing.path = dir.join("hashed.jsonl");
    hashing.hash_keys = true;
    let hashed = lines_written(&hashing, &records).await;
    let key = |line: &Value, field: &str| line["request"][field].as_str().unwrap().to_owned();
    let (alice, again, bob) = (
        key(&hashed[0], "session_key"),
        key(&hashed[1], "session_key"),
        key(&hashed[2], "session_key"),
    );
    assert_eq!(alice, again, "equal keys, equal hashes");
    assert_ne!(alice, bob);
    assert!(
        alice.len() == 16 && alice.bytes().all(|b| b.is_ascii_hexdigit()),
        "{alice}"
    );
    let text = std::fs::read_to_string(&hashing.path).unwrap();
    assert!(
        !text.contains("alice") && !text.contains("bob") && !text.contains("tenant-7"),
        "{text}"
    );
    assert_eq!(
        hashed[0]["request"]["prompt_tokens"], 3,
        "the rest as it was"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_record_whose_pages_are_still_being_hashed_is_written_once_they_are() {
    let dir = tempdir();
    let family = Family::default();
    let log = Arc::new(DecisionLog::open(&config(&dir, 1.0), family.clone()).unwrap());
    // The first record's pages come after its request ended; the second's never
    // come (their task ended without them); the third's client left before the
    // answer, its pages still to come.
    let (late, late_made) = tokio::sync::oneshot::channel();
    let (gone, gone_made) = tokio::sync::oneshot::channel::<Value>();
    let (left, left_made) = tokio::sync::oneshot::channel();
    for (n, made) in [late_made, gone_made, left_made].into_iter().enumerate() {
        let mut record =
            PendingRecord::new(Arc::clone(&log), json!({"n": n}), "id", Instant::now());
        record.with_replay(replay::Replay::Pending(made));
        if n < 2 {
            record.finish(200, "ok", "ok", Usage::default());
        }
    }
    drop(gone);
    assert_eq!(
        written(&family, "written"),
        0,
        "the late ones wait for their pages"
    );
    late.send(json!({"pages": "00000000000000aa"})).unwrap();
    left.send(json!({"pages": "00000000000000bb"})).unwrap();
    let all_written = async {
        while written(&family, "written") < 3 {
            tokio::task::yield_now().await;
            std::thread::yield_now();
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all_written)
        .await
        .expect("every record is written");
    let text = std::fs::read_to_string(dir.join("decisions.jsonl")).unwrap();
    let mut records: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    records.sort_by_key(|r| r["n"].as_u64());
    assert_eq!(records[0]["replay"]["pages"], "00000000000000aa");
    assert!(
        records[1].get("replay").is_none(),
        "no pages, still recorded"
    );
    assert_eq!(records[2]["replay"]["pages"], "00000000000000bb");
    assert_eq!(records[2]["result"]["outcome"], "cancelled");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn recorded_requests_are_tokenized_for_their_records_one_at_a_time() {
    let dir = tempdir();
    let family = Family::default();
    let mut config = config(&dir, 1.0);
    config.replayable = true;
    let log = DecisionLog::open(&config, family.clone()).unwrap();
    let first = log.tokenizing().expect("leave to tokenize one");
    assert!(log.tokenizing().is_none(), "a second waits for none");
    assert_eq!(written(&family, "unpaged"), 1);
    drop(first);
    assert!(log.tokenizing().is_some());
    assert_eq!(written(&family, "unpaged"), 1);
    std::fs::remove_dir_all(dir).unwrap();
}
