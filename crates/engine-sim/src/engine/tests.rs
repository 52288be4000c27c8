use super::*;
use crate::faults::{FaultConfig, FaultSet};

fn spec(slots: u32) -> EngineSpec {
    EngineSpec {
        max_running_requests: slots,
        prefill_tokens_per_sec: 1000.0,
        decode_tokens_per_sec: 100.0,
        kv_capacity_tokens: 10_000,
        page_size: 10,
        dp_size: 1,
        serial_prefill: false,
    }
}

fn prompt(n: u32) -> Vec<u32> {
    (0..n).collect()
}

fn with_events(
    spec: EngineSpec,
    faults: FaultConfig,
) -> (SimEngine, mpsc::UnboundedReceiver<PublisherMsg>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        SimEngine::build(spec, Arc::new(FaultSet::new(faults)), vec![tx]),
        rx,
    )
}

#[tokio::test(start_paused = true)]
async fn prefill_and_decode_take_tokens_over_their_rates() {
    let engine = SimEngine::new(spec(4));
    let served = engine.serve(prompt(500), 20).await;
    assert_eq!(served.queued, Duration::ZERO);
    assert_eq!(served.time_to_first_token, Duration::from_millis(500));
    assert_eq!(served.total, Duration::from_millis(700));
    let load = engine.load();
    assert_eq!(
        (
            load.prefill_uncached_tokens_total,
            load.prefill_busy_us_total
        ),
        (500, 500_000)
    );
    assert_eq!(
        (
            load.running_requests,
            load.used_kv_tokens,
            load.total_tokens
        ),
        (0, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn the_same_long_prompt_twice_hits_the_cache_and_prefills_faster() {
    let engine = SimEngine::new(spec(4));
    let first = engine.serve(prompt(1005), 0).await;
    let second = engine.serve(prompt(1005), 0).await;
    assert_eq!(first.cached_tokens, 0);
    assert_eq!(second.cached_tokens, 1000, "every full page is cached");
    assert_eq!(first.time_to_first_token, Duration::from_millis(1005));
    assert_eq!(
        second.time_to_first_token,
        Duration::from_millis(5),
        "only the partial page is prefilled"
    );
}

#[tokio::test(start_paused = true)]
async fn requests_queue_behind_the_running_limit_and_report_it() {
    let engine = Arc::new(SimEngine::new(spec(1)));
    let first = tokio::spawn({
        let engine = Arc::clone(&engine);
        async move { engine.serve(prompt(1000), 0).await }
    });
    tokio::task::yield_now().await;
    let second = tokio::spawn({
        let engine = Arc::clone(&engine);
        async move { engine.serve((5000..5300).collect(), 0).await }
    });
    tokio::task::yield_now().await;
    let load = engine.load();
    assert_eq!((load.running_requests, load.waiting_requests), (1, 1));
    assert_eq!(
        (
            load.used_kv_tokens,
            load.waiting_uncached_tokens,
            load.total_tokens
        ),
        (1000, 300, 1300)
    );
    assert_eq!(first.await.unwrap().total, Duration::from_secs(1));
    let second = second.await.unwrap();
    assert_eq!(
        second.queued,
        Duration::from_secs(1),
        "waited for the only slot"
    );
    assert_eq!(second.time_to_first_token, Duration::from_millis(1300));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_request_frees_its_slot_counters_and_pages() {
    let engine = Arc::new(SimEngine::new(EngineSpec {
        kv_capacity_tokens: 20,
        ..spec(1)
    }));
    let running = tokio::spawn({
        let engine = Arc::clone(&engine);
        async move { engine.serve(prompt(20), 1000).await }
    });
    let waiting = tokio::spawn({
        let engine = Arc::clone(&engine);
        async move { engine.serve(prompt(50), 0).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(engine.load().waiting_requests, 1);
    waiting.abort();
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    assert!(waiting.await.unwrap_err().is_cancelled());
    let load = engine.load();
    assert_eq!(
        (
            load.running_requests,
            load.waiting_requests,
            load.total_tokens,
            load.used_kv_tokens
        ),
        (0, 0, 0, 0)
    );
    let other = engine.serve((100..120).collect(), 0).await;
    assert_eq!(other.queued, Duration::ZERO, "the slot is free again");
    assert_eq!(
        engine.ranks[0].cached_pages(),
        2,
        "the aborted request's pages were evictable"
    );
}

#[tokio::test(start_paused = true)]
async fn caching_pages_publishes_stores_and_evictions() {
    let (engine, mut rx) = with_events(
        EngineSpec {
            kv_capacity_tokens: 30,
            ..spec(4)
        },
        FaultConfig::default(),
    );
    engine.serve(prompt(25), 0).await;
    let Some(PublisherMsg::Batch(batch)) = rx.recv().await else {
        panic!("a batch")
    };
    let keys = page_keys(&prompt(25), 10, None);
    assert_eq!(
        batch,
        [KvEvent::Stored {
            hashes: vec![keys[0].hash, keys[1].hash],
            parent: None,
            tokens: prompt(20),
            block_size: 10,
            lora_name: None,
            medium: Medium::Gpu,
        }]
    );
    engine.serve(prompt(35), 0).await;
    let Some(PublisherMsg::Batch(batch)) = rx.recv().await else {
        panic!("a batch")
    };
    let longer = page_keys(&prompt(35), 10, None);
    assert_eq!(
        batch,
        [KvEvent::Stored {
            hashes: vec![longer[2].hash],
            parent: Some(longer[1].hash),
            tokens: (20..30).collect(),
            block_size: 10,
            lora_name: None,
            medium: Medium::Gpu,
        }]
    );
    engine.serve((900..920).collect(), 0).await;
    let Some(PublisherMsg::Batch(batch)) = rx.recv().await else {
        panic!("a batch")
    };
    assert!(
        matches!(&batch[0], KvEvent::Removed { hashes, medium: Medium::Gpu } if hashes.len() == 2),
        "{batch:?}"
    );
    engine.flush_cache();
    assert!(matches!(rx.recv().await, Some(PublisherMsg::Batch(b)) if b == [KvEvent::Cleared]));
}

#[tokio::test(start_paused = true)]
async fn the_restart_fault_empties_the_cache_and_restarts_the_publisher() {
    let faults = FaultConfig {
        restart_publisher_after_batches: Some(1),
        ..FaultConfig::default()
    };
    let (engine, mut rx) = with_events(spec(4), faults);
    engine.serve(prompt(20), 0).await;
    assert!(matches!(rx.recv().await, Some(PublisherMsg::Batch(_))));
    let again = engine.serve(prompt(20), 0).await;
    assert_eq!(
        again.cached_tokens, 0,
        "the restarted engine lost its cache"
    );
    assert!(matches!(rx.recv().await, Some(PublisherMsg::Restart)));
    assert!(matches!(rx.recv().await, Some(PublisherMsg::Batch(_))));
    assert_eq!(
        engine.serve(prompt(20), 0).await.cached_tokens,
        20,
        "the fault fires once"
    );
}

#[tokio::test(start_paused = true)]
async fn ranks_have_their_own_caches() {
    let engine = SimEngine::new(EngineSpec {
        dp_size: 2,
        ..spec(4)
    });
    let mut first = engine.start(prompt(20), Some(0));
    first.admit().await;
    assert_eq!(first.prefill().await, 0);
    drop(first);
    let mut other_rank = engine.start(prompt(20), Some(1));
    other_rank.admit().await;
    assert_eq!((other_rank.rank(), other_rank.prefill().await), (1, 0));
    let mut same_rank = engine.start(prompt(20), Some(2));
    same_rank.admit().await;
    assert_eq!((same_rank.rank(), same_rank.prefill().await), (0, 20));
}

#[tokio::test(start_paused = true)]
async fn serial_prefill_takes_one_request_at_a_time_in_arrival_order() {
    let engine = Arc::new(SimEngine::new(EngineSpec {
        serial_prefill: true,
        ..spec(4)
    }));
    let serve = |tokens: Vec<u32>| {
        let engine = Arc::clone(&engine);
        tokio::spawn(async move { engine.serve(tokens, 0).await })
    };
    let first = serve(prompt(500));
    tokio::task::yield_now().await;
    let second = serve((5000..5300).collect());
    tokio::task::yield_now().await;
    let load = engine.load();
    assert_eq!(
        (load.running_requests, load.waiting_requests),
        (1, 1),
        "the second waits for the prefill turn although slots are free"
    );
    let first = first.await.unwrap();
    let second = second.await.unwrap();
    assert_eq!(first.time_to_first_token, Duration::from_millis(500));
    assert_eq!(second.queued, Duration::from_millis(500));
    assert_eq!(
        second.time_to_first_token,
        Duration::from_millis(800),
        "its 300 tokens prefill after the first's 500, at the rank's 1000 a second"
    );
    let parallel = SimEngine::new(spec(4));
    let (a, b) = tokio::join!(
        parallel.serve(prompt(500), 0),
        parallel.serve((5000..5300).collect(), 0)
    );
    assert_eq!(
        (a.time_to_first_token, b.time_to_first_token),
        (Duration::from_millis(500), Duration::from_millis(300)),
        "without it, each request prefills on its own"
    );
}
