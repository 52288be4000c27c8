//! KV events, replay and the load feed, received by real ZeroMQ sockets.

use crate::common;

use common::*;
use engine_sim::free_port_ranges;
use engine_sim::{EventForm, LoadForm};
use serde_json::json;

#[tokio::test]
async fn a_subscriber_receives_block_stored_batches_in_sequence() {
    let engine = engine(config()).await;
    let mut sub = subscribe(engine.ports().kv[0], "").await;
    let next = await_kv_subscription(&engine, &mut sub).await;
    let (_, first) = chat(
        &engine,
        &json!({"model": "m", "messages": [], "input_ids": (0..40).collect::<Vec<u32>>()}),
    )
    .await;
    assert_eq!(first["usage"]["prompt_tokens"], 40);
    let (topic, seq, payload) = recv_from(&mut sub, next).await;
    assert_eq!(
        (topic.as_ref(), seq),
        (&b""[..], next),
        "empty topic, the next sequence number"
    );
    let (events, rank) = batch_events(&payload);
    assert_eq!(rank, 0);
    assert_eq!(events.len(), 1);
    let stored = &events[0];
    assert_eq!(field(stored, "type").as_str(), Some("BlockStored"));
    assert_eq!(
        field(stored, "block_hashes").as_array().unwrap().len(),
        2,
        "two full 16-token pages"
    );
    assert!(field(stored, "parent_block_hash").is_nil());
    let tokens: Vec<u64> = field(stored, "token_ids")
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(tokens, (0..32).collect::<Vec<u64>>());
    assert_eq!(field(stored, "block_size").as_u64(), Some(16));
    assert!(field(stored, "lora_id").is_nil());
    assert_eq!(field(stored, "medium").as_str(), Some("GPU"));
    let last_hash = field(stored, "block_hashes").as_array().unwrap()[1]
        .as_i64()
        .unwrap();

    chat(
        &engine,
        &json!({"model": "m", "messages": [], "input_ids": (0..64).collect::<Vec<u32>>()}),
    )
    .await;
    let (_, seq, payload) = recv(&mut sub).await;
    assert_eq!(seq, next + 1);
    let (events, _) = batch_events(&payload);
    assert_eq!(
        field(&events[0], "parent_block_hash").as_i64(),
        Some(last_hash),
        "the chain continues"
    );
    assert_eq!(field(&events[0], "token_ids").as_array().unwrap().len(), 32);
    engine.shutdown().await;
}

#[tokio::test]
async fn the_legacy_form_sends_positional_arrays_with_the_tag_first() {
    let mut config = config();
    config.kv_event_form = EventForm::Array;
    let engine = engine(config).await;
    chat(
        &engine,
        &json!({"model": "m", "messages": [], "input_ids": (0..16).collect::<Vec<u32>>()}),
    )
    .await;
    engine.engine().flush_cache();
    let batches = replay(engine.ports().replay[0], 0).await;
    let stored = batch_events(&batches[0].1).0;
    let fields = stored[0].as_array().expect("an array event");
    assert_eq!(fields[0].as_str(), Some("BlockStored"));
    assert_eq!(
        fields.len(),
        7,
        "[tag, hashes, parent, tokens, block_size, lora_id, medium]"
    );
    assert_eq!(
        (fields[4].as_u64(), fields[6].as_str()),
        (Some(16), Some("GPU"))
    );
    let cleared = batch_events(&batches[1].1).0;
    assert_eq!(
        cleared[0].as_array().unwrap().len(),
        1,
        "[\"AllBlocksCleared\"]"
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn replay_answers_a_range_and_sends_the_end_marker() {
    let mut config = config();
    config.replay_buffer = 3;
    let engine = engine(config).await;
    for salt in ["a", "b", "c", "d", "e"] {
        chat(&engine, &chat_body(&words(40, salt))).await;
    }
    let port = engine.ports().replay[0];
    let seqs =
        |batches: Vec<(u64, bytes::Bytes)>| batches.into_iter().map(|(s, _)| s).collect::<Vec<_>>();
    assert_eq!(seqs(replay(port, 3).await), [3, 4]);
    assert_eq!(
        seqs(replay(port, 0).await),
        [2, 3, 4],
        "history before the buffer is gone: replay starts later"
    );
    assert!(
        replay(port, 9).await.is_empty(),
        "nothing after the newest batch, just the end marker"
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn each_rank_publishes_on_its_own_port_with_its_rank() {
    let mut config = config();
    config.dp_size = 2;
    let [kv_base, replay_base] = free_port_ranges([2, 2]);
    config.kv_port = Some(kv_base);
    config.replay_port = Some(replay_base);
    config.load_port = None;
    let engine = engine(config).await;
    let ports = engine.ports().clone();
    assert_eq!(ports.kv[1], ports.kv[0] + 1);
    for salt in ["r0", "r1"] {
        chat(&engine, &chat_body(&words(40, salt))).await;
    }
    for rank in 0..2 {
        let batches = replay(ports.replay[rank], 0).await;
        assert_eq!(batches.len(), 1, "rank {rank} served one request");
        assert_eq!(batches[0].0, 0, "each rank's sequence starts at 0");
        assert_eq!(batch_events(&batches[0].1).1, rank as i64);
    }
    engine.shutdown().await;
}

#[tokio::test]
async fn the_load_feed_publishes_native_and_basic_load_stats() {
    let engine = engine(config()).await;
    let mut sub = subscribe(engine.ports().load[0], "load").await;
    let fields = next_load(&mut sub).await;
    assert_eq!(
        fields.len(),
        10,
        "native: five basic fields then five native fields"
    );
    assert_eq!(
        (fields[0], fields[1], fields[3], fields[4]),
        (0, 0, 1 << 20, 0),
        "idle, capacity, rank 0"
    );
    assert_eq!(fields[7], 64, "max_running_requests");
    engine.shutdown().await;

    let mut config = config();
    config.load_form = LoadForm::Basic;
    let engine = common::engine(config).await;
    let mut sub = subscribe(engine.ports().load[0], "").await;
    assert_eq!(
        next_load(&mut sub).await.len(),
        5,
        "basic: running, waiting, used, capacity, rank"
    );
    engine.shutdown().await;
}

async fn admin(engine: &engine_sim::RunningEngine, path: &str, body: serde_json::Value) {
    let response = client()
        .post(format!("{}{path}", engine.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
}

#[tokio::test]
async fn dropped_batches_leave_a_sequence_gap_that_replay_repairs() {
    let engine = engine(config()).await;
    let mut sub = subscribe(engine.ports().kv[0], "").await;
    let next = await_kv_subscription(&engine, &mut sub).await;
    admin(&engine, "/admin/faults", json!({"drop_event_batches": 2})).await;
    for salt in ["g1", "g2", "g3"] {
        chat(&engine, &chat_body(&words(40, salt))).await;
    }
    let (_, seq, _) = recv_from(&mut sub, next).await;
    assert_eq!(
        seq,
        next + 2,
        "two batches were left out of the live stream"
    );
    let replayed: Vec<u64> = replay(engine.ports().replay[0], next)
        .await
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(
        replayed,
        [next, next + 1, next + 2],
        "replay has the missing batches"
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn a_publisher_restart_starts_the_sequence_again_at_zero() {
    let engine = engine(config()).await;
    let mut sub = subscribe(engine.ports().kv[0], "").await;
    let next = await_kv_subscription(&engine, &mut sub).await;
    let body = chat_body(&words(40, "same"));
    chat(&engine, &body).await;
    let (_, seq, _) = recv_from(&mut sub, next).await;
    assert_eq!(seq, next);
    admin(&engine, "/admin/restart_publisher", json!({})).await;
    let (_, after) = chat(&engine, &body).await;
    assert_eq!(
        after["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "a restarted engine has an empty cache"
    );
    let (_, seq, payload) = recv(&mut sub).await;
    assert_eq!(seq, 0, "the sequence goes back to 0");
    assert_eq!(
        field(&batch_events(&payload).0[0], "type").as_str(),
        Some("BlockStored")
    );
    let replayed: Vec<u64> = replay(engine.ports().replay[0], 0)
        .await
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(replayed, [0], "the replay history restarted too");
    engine.shutdown().await;
}

#[tokio::test]
async fn an_idle_engine_still_reports_its_load_every_second() {
    let engine = engine(config()).await;
    let mut sub = subscribe(engine.ports().load[0], "").await;
    let (_, first_seq, first) = recv(&mut sub).await;
    let (_, second_seq, second) = recv(&mut sub).await;
    assert_eq!(
        second_seq,
        first_seq + 1,
        "a heartbeat follows without any change"
    );
    assert_eq!(first, second, "an unchanged load is re-sent as is");
    engine.shutdown().await;
}
