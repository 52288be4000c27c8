use super::*;

/// Batches the real publishers produced (testdata/kv-events/capture.py).
fn frame(name: &str) -> Vec<u8> {
    let line = include_str!("../../../../../testdata/kv-events/frames.txt")
        .lines()
        .find(|l| l.split(' ').next() == Some(name))
        .unwrap_or_else(|| panic!("fixture {name}"));
    let hex = line.split(' ').nth(3).expect("payload column");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn events(name: &str) -> Vec<KvEvent> {
    let batch = decode_batch(&frame(name)).unwrap();
    assert!(batch.dropped.is_empty(), "{name}: {:?}", batch.dropped);
    batch.events
}

fn stored(name: &str) -> BlockStored {
    match events(name).remove(0) {
        KvEvent::Stored(s) => s,
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn sglang_map_events_with_negative_hashes() {
    let batch = decode_batch(&frame("sglang.map.stored")).unwrap();
    assert_eq!((batch.ts, batch.dp_rank), (1.5, Some(0)));
    let s = stored("sglang.map.stored");
    assert_eq!(s.block_hashes, [-5i64 as u64, 7]);
    assert_eq!(
        (s.parent, s.block_size, s.tier, s.namespace.as_deref()),
        (None, 16, Tier::Device, None)
    );
    assert_eq!(s.tokens, (1..=32).collect::<Vec<u32>>());
    let child = stored("sglang.map.stored_child_cpu_salted");
    assert_eq!(child.block_hashes, [i64::MIN as u64]);
    assert_eq!((child.parent, child.tier), (Some(7), Tier::Host));
    assert_eq!(
        child.namespace.as_deref(),
        Some("adapter-1\u{1}salt:tenant-a")
    );
    let bigram = stored("sglang.map.stored_bigram");
    assert_eq!(
        bigram.tokens,
        (100..116).collect::<Vec<u32>>(),
        "the first of each pair"
    );
    assert_eq!(
        events("sglang.map.removed"),
        [KvEvent::Removed(BlockRemoved {
            block_hashes: vec![7],
            tier: Some(Tier::Device)
        })]
    );
    assert_eq!(events("sglang.map.cleared"), [KvEvent::AllCleared]);
    let mixed = events("sglang.map.mixed");
    assert_eq!(mixed.len(), 3);
    assert_eq!(
        mixed[1],
        KvEvent::Removed(BlockRemoved {
            block_hashes: vec![-5i64 as u64],
            tier: None
        }),
        "no medium: every tier"
    );
}

#[test]
fn sglang_legacy_array_events() {
    let s = stored("sglang.array.stored");
    assert_eq!(
        (s.block_hashes, s.parent, s.tier),
        (vec![-5i64 as u64, 7], None, Tier::Device)
    );
    let no_medium = stored("sglang.array.stored_no_medium");
    assert_eq!(
        (no_medium.parent, no_medium.tier),
        (Some(7), Tier::Device),
        "a trailing medium may be omitted"
    );
    assert_eq!(
        events("sglang.array.removed"),
        [KvEvent::Removed(BlockRemoved {
            block_hashes: vec![7],
            tier: Some(Tier::Device)
        })]
    );
    assert_eq!(events("sglang.array.cleared"), [KvEvent::AllCleared]);
}

#[test]
fn vllm_map_events_with_uint64_and_bin_hashes() {
    let s = stored("vllm.map.stored_u64");
    assert_eq!(s.block_hashes, [u64::MAX - 4, 1 << 63]);
    let bin = stored("vllm.map.stored_bin_cpu");
    assert_eq!(
        bin.block_hashes,
        [u64::from_be_bytes([24, 25, 26, 27, 28, 29, 30, 31])],
        "the digest's last 8 bytes"
    );
    assert_eq!(
        (bin.parent, bin.tier, bin.namespace.as_deref()),
        (Some(1 << 63), Tier::Host, Some("adapter-1"))
    );
    assert_eq!(
        (bin.group_idx, bin.group_kind.as_deref()),
        (Some(0), Some("full_attention"))
    );
    let window = stored("vllm.map.stored_sliding_window_group");
    assert_eq!(
        (window.group_idx, window.group_kind.as_deref()),
        (Some(1), Some("sliding_window"))
    );
    assert_eq!(
        events("vllm.map.removed_u64"),
        [KvEvent::Removed(BlockRemoved {
            block_hashes: vec![u64::MAX - 4],
            tier: Some(Tier::Device)
        })]
    );
    assert_eq!(events("vllm.map.cleared"), [KvEvent::AllCleared]);
    let two = decode_batch(&frame("vllm.map.two_element_batch")).unwrap();
    assert_eq!(
        (two.dp_rank, two.events.as_slice()),
        (None, &[KvEvent::AllCleared][..]),
        "a two-element batch has no rank"
    );
}

#[test]
fn vllm_legacy_array_events_with_trailing_fields() {
    let s = stored("vllm.array.stored_u64");
    assert_eq!(
        (s.block_hashes, s.block_size, s.tier),
        (vec![u64::MAX - 4, 1 << 63], 16, Tier::Device)
    );
    assert_eq!(
        events("vllm.array.removed_u64"),
        [KvEvent::Removed(BlockRemoved {
            block_hashes: vec![u64::MAX - 4],
            tier: Some(Tier::Device)
        })]
    );
}

fn encode(value: rmpv::Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).unwrap();
    out
}

#[test]
fn a_bad_event_costs_the_event_and_a_bad_batch_the_batch() {
    use rmpv::Value;
    let good = Value::Map(vec![(Value::from("type"), Value::from("AllBlocksCleared"))]);
    let unknown = Value::Map(vec![(Value::from("type"), Value::from("BlockMoved"))]);
    let bad_hash = Value::Map(vec![
        (Value::from("type"), Value::from("BlockRemoved")),
        (
            Value::from("block_hashes"),
            Value::Array(vec![Value::from("x")]),
        ),
    ]);
    let bad_medium = Value::Array(vec![
        Value::from("BlockStored"),
        Value::Array(vec![Value::from(1)]),
        Value::Nil,
        Value::Array(vec![Value::from(1); 4]),
        Value::from(4),
        Value::Nil,
        Value::from("TAPE"),
    ]);
    let extra_key = Value::Map(vec![
        (Value::from("type"), Value::from("AllBlocksCleared")),
        (Value::from("future_field"), Value::from(3)),
    ]);
    let batch = Value::Array(vec![
        Value::from(1.0),
        Value::Array(vec![
            good,
            unknown,
            bad_hash,
            bad_medium,
            Value::from(5),
            extra_key,
        ]),
        Value::Nil,
        Value::from("extra trailing element"),
    ]);
    let decoded = decode_batch(&encode(batch)).unwrap();
    assert_eq!(decoded.events, [KvEvent::AllCleared, KvEvent::AllCleared]);
    let reasons: Vec<_> = decoded.dropped.iter().map(EventError::reason).collect();
    assert_eq!(
        reasons,
        [
            "unknown_event_type",
            "bad_field",
            "unknown_medium",
            "event_shape"
        ]
    );
    assert_eq!(decoded.dropped[2].to_string(), "unknown medium \"TAPE\"");
    assert_eq!(
        decode_batch(&[0x92, 0xcb, 0x3f]).unwrap_err().reason(),
        "batch_not_msgpack",
        "truncated"
    );
    assert_eq!(
        decode_batch(&encode(Value::from(3))).unwrap_err().reason(),
        "batch_shape"
    );
    assert_eq!(
        decode_batch(&encode(Value::Array(vec![Value::from(1.0)]))).unwrap_err(),
        BatchError::Shape
    );
}

#[test]
fn a_batchs_age_is_how_long_before_now_it_was_stamped_within_bounds() {
    let stamped = |ts: f64| KvBatch {
        ts,
        events: Vec::new(),
        dp_rank: None,
        dropped: Vec::new(),
    };
    assert_eq!(stamped(100.0).age_at(102.5), Duration::from_millis(2500));
    assert_eq!(
        stamped(103.0).age_at(102.5),
        Duration::ZERO,
        "a publisher clock a little ahead"
    );
    assert_eq!(stamped(f64::NAN).age_at(102.5), Duration::ZERO);
    assert_eq!(stamped(f64::NEG_INFINITY).age_at(102.5), MAX_FEED_AGE);
    assert_eq!(stamped(0.0).age_at(1e12), MAX_FEED_AGE);
}
