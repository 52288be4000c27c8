//! The load-feed subscriber against a simulated engine's real ZeroMQ load feed.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use router_state::{
    EngineId, EngineReportedLoadTable, FeedStats, LoadFeedSource, spawn_load_subscriber,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_from_a_real_feed_reach_the_table_and_track_the_engine() {
    let mut config = engine_sim::SimConfig::for_tests();
    config.kv_port = Some(0);
    config.load_port = Some(0);
    config.decode_tokens_per_sec = 20.0;
    let engine = engine_sim::start(config).await.expect("the engine starts");
    let table = Arc::new(EngineReportedLoadTable::default());
    let id = EngineId::from("E1");
    table.register(&id, NonZeroU32::MIN);
    let stats = Arc::new(FeedStats::default());
    let source = LoadFeedSource {
        engine: id.clone(),
        rank: 0,
        endpoint: format!("tcp://127.0.0.1:{}", engine.ports().load[0]),
        topic: "load".into(),
        max_message_bytes: router_state::DEFAULT_MAX_FEED_MESSAGE_BYTES,
        memory: router_state::FeedMemory::default(),
    };
    let feed = spawn_load_subscriber(Arc::clone(&table), source, Arc::clone(&stats));
    let guard = Duration::from_secs(20);
    let mut seen = tokio::time::timeout(guard, stats.applied_after(0))
        .await
        .expect("a first report arrives");
    let idle = table
        .snapshot()
        .observe(&id)
        .reported
        .expect("a fresh report");
    assert_eq!(
        (idle.running_requests, idle.max_kv_tokens),
        (0, Some(1 << 20))
    );
    assert!(idle.native.is_some(), "the sim publishes native reports");

    let url = format!("{}/v1/chat/completions", engine.url());
    let request = tokio::spawn(async move {
        let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000});
        reqwest::Client::new().post(url).json(&body).send().await
    });
    loop {
        seen = tokio::time::timeout(guard, stats.applied_after(seen))
            .await
            .expect("reports keep arriving");
        if table
            .snapshot()
            .observe(&id)
            .reported
            .is_some_and(|r| r.running_requests == 1)
        {
            break;
        }
    }
    request.abort();
    drop(feed);
    engine.shutdown().await;
    assert_eq!(
        stats.counts()[1..4].iter().map(|(_, n)| n).sum::<u64>(),
        0,
        "nothing was dropped"
    );
}
