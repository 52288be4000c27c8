//! The SGLang `LoadStat` gauge payload, as the engine's msgspec encoder writes it, and
//! how often a rank publishes it.

use std::time::Duration;

use crate::engine::LoadSample;

/// How often a rank looks at its load to publish it.
pub const LOAD_TICK: Duration = Duration::from_millis(20);

/// The longest a rank goes without publishing its load, changed or not.
pub const LOAD_REPUBLISH: Duration = Duration::from_secs(1);

/// What the load feed publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "server", derive(clap::ValueEnum))]
pub enum LoadForm {
    /// The eleven-field `LoadStat` with queue tokens and prefill counters.
    Native,
    /// The six-field `LoadStat` of older publishers.
    Basic,
}

/// Encodes a native `LoadStat`: a msgpack array of the tag and ten integers (the rank
/// as nil when absent), each in its smallest msgpack form, as msgspec does.
pub fn encode_load_stat(sample: &LoadSample, dp_rank: Option<u32>) -> Vec<u8> {
    let mut out = encode_head(sample, dp_rank, 11);
    let native = [
        sample.waiting_uncached_tokens,
        sample.total_tokens,
        sample.max_running_requests,
        sample.prefill_uncached_tokens_total,
        sample.prefill_busy_us_total,
    ];
    for v in native {
        rmp::encode::write_uint(&mut out, v).expect(INFALLIBLE);
    }
    out
}

/// Encodes the six-element `LoadStat` of publishers that predate the native fields.
pub fn encode_basic_load_stat(sample: &LoadSample, dp_rank: Option<u32>) -> Vec<u8> {
    encode_head(sample, dp_rank, 6)
}

const INFALLIBLE: &str = "writing to a Vec cannot fail";

fn encode_head(sample: &LoadSample, dp_rank: Option<u32>, len: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    rmp::encode::write_array_len(&mut out, len).expect(INFALLIBLE);
    rmp::encode::write_str(&mut out, "LoadStat").expect(INFALLIBLE);
    let head = [
        sample.running_requests,
        sample.waiting_requests,
        sample.used_kv_tokens,
        sample.max_kv_tokens,
    ];
    for v in head {
        rmp::encode::write_uint(&mut out, v).expect(INFALLIBLE);
    }
    match dp_rank {
        Some(rank) => {
            rmp::encode::write_uint(&mut out, u64::from(rank)).expect(INFALLIBLE);
        }
        None => rmp::encode::write_nil(&mut out).expect(INFALLIBLE),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Payloads the real SGLang publisher produced (testdata/sglang/gen_load_stat.py).
    fn golden(name: &str) -> String {
        include_str!("../../../testdata/sglang/load_stat.txt")
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .expect("fixture present")
            .to_owned()
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn matches_the_real_publisher_byte_for_byte() {
        let sample = LoadSample {
            running_requests: 3,
            waiting_requests: 2,
            used_kv_tokens: 4096,
            max_kv_tokens: 65536,
            waiting_uncached_tokens: 1500,
            total_tokens: 9000,
            max_running_requests: 64,
            prefill_uncached_tokens_total: 120_000,
            prefill_busy_us_total: 4_000_000,
        };
        assert_eq!(
            hex(&encode_load_stat(&sample, Some(1))),
            golden("native_rank1")
        );
        let defaults = LoadSample {
            running_requests: 3,
            waiting_requests: 2,
            used_kv_tokens: 4096,
            ..LoadSample::default()
        };
        assert_eq!(
            hex(&encode_load_stat(&defaults, None)),
            golden("defaults_only")
        );
    }
}
