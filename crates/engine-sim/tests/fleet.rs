//! Several engines in one process, and synthetic KV traffic on the wire.

use crate::common;

use common::*;
use engine_sim::{FleetConfig, free_port_ranges, start_fleet};

#[tokio::test]
async fn every_engine_of_a_fleet_serves_on_its_own_ports() {
    let mut engine = config();
    engine.dp_size = 2;
    engine.replay_port = None;
    [engine.kv_port, engine.load_port] = free_port_ranges([6, 6]).map(Some);
    let (kv, load) = (engine.kv_port.unwrap(), engine.load_port.unwrap());
    let fleet = start_fleet(&FleetConfig::new(3, engine))
        .await
        .expect("the engines start");
    assert_eq!(fleet.len(), 3);
    for (i, engine) in fleet.iter().enumerate() {
        let i = i as u16;
        assert_eq!(engine.ports().kv, [kv + 2 * i, kv + 2 * i + 1]);
        assert_eq!(engine.ports().load, [load + 2 * i, load + 2 * i + 1]);
        let (status, _) = chat(engine, &chat_body("hello")).await;
        assert_eq!(status, 200, "engine {i} serves");
        let info = get_json(format!("{}/server_info", engine.url())).await;
        assert_eq!(info["kv_events"]["endpoint_port_base"], kv + 2 * i);
    }
    let http: std::collections::HashSet<_> = fleet.iter().map(|e| e.ports().http).collect();
    assert_eq!(http.len(), 3, "each engine has its own HTTP port");
    for _ in 0..2 {
        let status = client()
            .get(format!("{}/health", fleet[1].url()))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200);
    }
    let probes: Vec<u64> = fleet.iter().map(|e| e.health_probes()).collect();
    assert_eq!(probes, [0, 2, 0], "probes are counted by the engine probed");
    let visits = get_json(format!("{}/admin/visits", fleet[1].url())).await;
    assert_eq!(visits["health_probes"], 2);
    assert_eq!(visits["visits"]["answered"], 1);
    for engine in fleet {
        engine.shutdown().await;
    }
}

#[tokio::test]
async fn a_fleet_whose_ports_would_pass_65535_is_refused() {
    let mut engine = config();
    engine.port = 65_535;
    let error = FleetConfig::new(2, engine)
        .engine_config(1)
        .expect_err("engine 1 would need port 65536");
    assert!(error.contains("--port"), "{error}");
}

#[tokio::test]
async fn synthetic_pages_are_published_as_block_stored_chains() {
    let mut config = config();
    config.synthetic_kv_blocks_per_sec = 100.0;
    let engine = engine(config).await;
    let mut sub = subscribe(engine.ports().kv[0], "").await;
    let mut previous: Option<i64> = None;
    let mut stored = 0;
    while stored < 20 {
        let (_, _, payload) = within("a synthetic batch", recv(&mut sub)).await;
        let (events, rank) = batch_events(&payload);
        assert_eq!(rank, 0);
        for event in &events {
            assert_eq!(field(event, "type").as_str(), Some("BlockStored"));
            let hashes = field(event, "block_hashes").as_array().unwrap();
            assert_eq!(
                field(event, "token_ids").as_array().unwrap().len(),
                hashes.len() * 16,
                "every page's tokens"
            );
            let parent = field(event, "parent_block_hash").as_i64();
            if let (Some(parent), Some(_)) = (parent, previous) {
                assert_eq!(Some(parent), previous, "a page extends the document");
            }
            previous = hashes.last().and_then(rmpv::Value::as_i64);
            stored += hashes.len();
        }
    }
    assert_eq!(engine.visits().answered, 0, "no request caused them");
    engine.shutdown().await;
}
