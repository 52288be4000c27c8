//! Builders for fleets and load reports in tests (feature `test-util`).

use std::sync::Arc;

use crate::engine::{Engine, Role};
use crate::load_monitor::{LOAD_STAT_TAG, LoadReport, NativeLoad};

mod redis_server;

pub use redis_server::RedisServer;

/// `n` healthy engines `{prefix}0..` of one model and role, sorted by id.
pub fn fleet(model: &str, role: Role, prefix: &str, n: usize) -> Vec<Arc<Engine>> {
    let width = n.saturating_sub(1).to_string().len();
    (0..n)
        .map(|i| {
            let id = format!("{prefix}{i:0width$}");
            Arc::new(Engine::new(
                id.as_str(),
                format!("http://{id}.test"),
                model,
                role,
            ))
        })
        .collect()
}

/// A basic report: running, waiting, KV tokens in use and capacity.
pub fn basic_report(running: u64, waiting: u64, used_kv: u64, max_kv: u64) -> LoadReport {
    LoadReport {
        running_requests: running,
        waiting_requests: waiting,
        used_kv_tokens: used_kv,
        max_kv_tokens: (max_kv > 0).then_some(max_kv),
        dp_rank: Some(0),
        native: None,
    }
}

/// Adds the native extension to a report.
pub fn with_native(report: LoadReport, native: NativeLoad) -> LoadReport {
    LoadReport {
        native: Some(native),
        ..report
    }
}

/// Encodes a report as msgpack exactly as the SGLang publisher's msgspec encoder does:
/// a tagged array, integers in their smallest encoding, a nil rank when absent; six
/// elements for a basic report, eleven with the native extension.
pub fn encode_load_stat(report: &LoadReport) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    let len = if report.native.is_some() { 11 } else { 6 };
    let write = |out: &mut Vec<u8>, v: u64| {
        rmp::encode::write_uint(out, v).expect("writing to a Vec cannot fail");
    };
    rmp::encode::write_array_len(&mut out, len).expect("writing to a Vec cannot fail");
    rmp::encode::write_str(&mut out, LOAD_STAT_TAG).expect("writing to a Vec cannot fail");
    write(&mut out, report.running_requests);
    write(&mut out, report.waiting_requests);
    write(&mut out, report.used_kv_tokens);
    write(&mut out, report.max_kv_tokens.unwrap_or(0));
    match report.dp_rank {
        Some(rank) => match u64::try_from(rank) {
            Ok(rank) => write(&mut out, rank),
            Err(_) => {
                rmp::encode::write_sint(&mut out, rank).expect("writing to a Vec cannot fail");
            }
        },
        None => rmp::encode::write_nil(&mut out).expect("writing to a Vec cannot fail"),
    }
    if let Some(n) = report.native {
        for v in [
            n.waiting_uncached_tokens,
            n.total_tokens,
            n.max_running_requests,
            n.prefill_uncached_tokens_total,
            n.prefill_busy_us_total,
        ] {
            write(&mut out, v);
        }
    }
    out
}

/// A KV-event batch storing the full pages of `tokens` on the device, as one block
/// each (engine hashes 1, 2, ...), without a parent.
pub fn stored_batch(tokens: &[u32], block_size: u32) -> crate::kv_events::KvBatch {
    use crate::kv_events::{BlockStored, KvBatch, KvEvent, Tier};
    let pages = tokens.len() / block_size.max(1) as usize;
    KvBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: (1..=pages as u64).collect(),
            parent: None,
            tokens: tokens[..pages * block_size as usize].to_vec(),
            block_size,
            tier: Tier::Device,
            namespace: None,
            group_idx: None,
            group_kind: None,
        })],
        dp_rank: None,
        dropped: vec![],
    }
}
