//! KV-cache events and their msgpack encoding, as SGLang's msgspec structs produce it.
//!
//! A batch is the positional array `[ts, events, attn_dp_rank]`. Events are tagged maps
//! (`type` first, then fields in declaration order, `None` optionals omitted) or, in the
//! legacy form, positional arrays with the tag first.

/// How KV events are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "server", derive(clap::ValueEnum))]
pub enum EventForm {
    /// Tagged msgpack maps (vLLM 0.26+, current SGLang).
    Map,
    /// Legacy positional arrays with the tag first (older vLLM and SGLang).
    Array,
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Pages cached: their hashes in chain order, the page they extend, and all their
    /// tokens.
    Stored {
        /// The pages' hashes, in chain order.
        hashes: Vec<i64>,
        /// The hash of the cached page they extend, if any.
        parent: Option<i64>,
        /// Every page's tokens.
        tokens: Vec<u32>,
        /// Tokens per page.
        block_size: u32,
        /// The LoRA adapter whose pages these are (vLLM's field; `None` omitted).
        lora_name: Option<std::sync::Arc<str>>,
        /// The tier the pages are cached on.
        medium: Medium,
    },
    /// Pages evicted.
    Removed {
        /// The evicted pages' hashes.
        hashes: Vec<i64>,
        /// The tier they were evicted from.
        medium: Medium,
    },
    /// The whole cache was flushed.
    Cleared,
}

/// A storage tier, as engines name it in their events' `medium`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    /// Accelerator memory, where a simulated engine caches.
    Gpu,
    /// Host memory, where an engine offloads pages (modelled by replays).
    Cpu,
}

impl Medium {
    /// The name engines publish.
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
        }
    }
}

const INFALLIBLE: &str = "writing to a Vec cannot fail";

/// Encodes one batch of rank `rank`, stamped `ts` (seconds since the Unix epoch).
pub fn encode_batch(ts: f64, events: &[KvEvent], rank: u32, form: EventForm) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 64);
    rmp::encode::write_array_len(&mut out, 3).expect(INFALLIBLE);
    rmp::encode::write_f64(&mut out, ts).expect(INFALLIBLE);
    rmp::encode::write_array_len(&mut out, events.len() as u32).expect(INFALLIBLE);
    for event in events {
        match form {
            EventForm::Map => encode_map(&mut out, event),
            EventForm::Array => encode_array(&mut out, event),
        }
    }
    write_int(&mut out, i64::from(rank));
    out
}

fn encode_map(out: &mut Vec<u8>, event: &KvEvent) {
    match event {
        KvEvent::Stored {
            hashes,
            parent,
            tokens,
            block_size,
            lora_name,
            medium,
        } => {
            let fields = if lora_name.is_some() { 8 } else { 7 };
            rmp::encode::write_map_len(out, fields).expect(INFALLIBLE);
            write_str(out, "type");
            write_str(out, "BlockStored");
            write_str(out, "block_hashes");
            write_ints(out, hashes);
            write_str(out, "parent_block_hash");
            write_opt_int(out, *parent);
            write_str(out, "token_ids");
            write_tokens(out, tokens);
            write_str(out, "block_size");
            write_int(out, i64::from(*block_size));
            write_str(out, "lora_id");
            rmp::encode::write_nil(out).expect(INFALLIBLE);
            write_str(out, "medium");
            write_str(out, medium.as_str());
            if let Some(lora_name) = lora_name {
                write_str(out, "lora_name");
                write_str(out, lora_name);
            }
        }
        KvEvent::Removed { hashes, medium } => {
            rmp::encode::write_map_len(out, 3).expect(INFALLIBLE);
            write_str(out, "type");
            write_str(out, "BlockRemoved");
            write_str(out, "block_hashes");
            write_ints(out, hashes);
            write_str(out, "medium");
            write_str(out, medium.as_str());
        }
        KvEvent::Cleared => {
            rmp::encode::write_map_len(out, 1).expect(INFALLIBLE);
            write_str(out, "type");
            write_str(out, "AllBlocksCleared");
        }
    }
}

fn encode_array(out: &mut Vec<u8>, event: &KvEvent) {
    match event {
        KvEvent::Stored {
            hashes,
            parent,
            tokens,
            block_size,
            lora_name,
            medium,
        } => {
            let fields = if lora_name.is_some() { 8 } else { 7 };
            rmp::encode::write_array_len(out, fields).expect(INFALLIBLE);
            write_str(out, "BlockStored");
            write_ints(out, hashes);
            write_opt_int(out, *parent);
            write_tokens(out, tokens);
            write_int(out, i64::from(*block_size));
            rmp::encode::write_nil(out).expect(INFALLIBLE);
            write_str(out, medium.as_str());
            if let Some(lora_name) = lora_name {
                write_str(out, lora_name);
            }
        }
        KvEvent::Removed { hashes, medium } => {
            rmp::encode::write_array_len(out, 3).expect(INFALLIBLE);
            write_str(out, "BlockRemoved");
            write_ints(out, hashes);
            write_str(out, medium.as_str());
        }
        KvEvent::Cleared => {
            rmp::encode::write_array_len(out, 1).expect(INFALLIBLE);
            write_str(out, "AllBlocksCleared");
        }
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    rmp::encode::write_str(out, s).expect(INFALLIBLE);
}

/// An integer in its smallest msgpack form: unsigned encodings for non-negative
/// values, signed ones for negative values (msgspec's choice).
fn write_int(out: &mut Vec<u8>, v: i64) {
    match u64::try_from(v) {
        Ok(u) => {
            rmp::encode::write_uint(out, u).expect(INFALLIBLE);
        }
        Err(_) => {
            rmp::encode::write_sint(out, v).expect(INFALLIBLE);
        }
    }
}

fn write_opt_int(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => write_int(out, v),
        None => rmp::encode::write_nil(out).expect(INFALLIBLE),
    }
}

fn write_ints(out: &mut Vec<u8>, values: &[i64]) {
    rmp::encode::write_array_len(out, values.len() as u32).expect(INFALLIBLE);
    for v in values {
        write_int(out, *v);
    }
}

fn write_tokens(out: &mut Vec<u8>, tokens: &[u32]) {
    rmp::encode::write_array_len(out, tokens.len() as u32).expect(INFALLIBLE);
    for t in tokens {
        rmp::encode::write_uint(out, u64::from(*t)).expect(INFALLIBLE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_a_map_batch_byte_for_byte() {
        let events = [
            KvEvent::Stored {
                hashes: vec![-5, 300],
                parent: None,
                tokens: vec![1, 2],
                block_size: 1,
                lora_name: None,
                medium: Medium::Gpu,
            },
            KvEvent::Cleared,
        ];
        let bytes = encode_batch(1.5, &events, 0, EventForm::Map);
        let mut expected = vec![0x93, 0xcb];
        expected.extend(1.5f64.to_be_bytes());
        expected.push(0x92);
        expected.push(0x87);
        for (key, value) in [
            ("type", &b"\xabBlockStored"[..]),
            ("block_hashes", &[0x92, 0xfb, 0xcd, 0x01, 0x2c]),
            ("parent_block_hash", &[0xc0]),
            ("token_ids", &[0x92, 0x01, 0x02]),
            ("block_size", &[0x01]),
            ("lora_id", &[0xc0]),
            ("medium", b"\xa3GPU"),
        ] {
            expected.push(0xa0 | key.len() as u8);
            expected.extend(key.as_bytes());
            expected.extend(value);
        }
        expected.extend([0x81, 0xa4]);
        expected.extend(b"type");
        expected.push(0xb0);
        expected.extend(b"AllBlocksCleared");
        expected.push(0x00);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn encodes_legacy_arrays_with_the_tag_first() {
        let bytes = encode_batch(
            0.0,
            &[KvEvent::Removed {
                hashes: vec![7],
                medium: Medium::Gpu,
            }],
            3,
            EventForm::Array,
        );
        let tail = &bytes[10..];
        let mut expected = vec![0x91, 0x93, 0xac];
        expected.extend(b"BlockRemoved");
        expected.extend([0x91, 0x07, 0xa3]);
        expected.extend(b"GPU");
        expected.push(0x03);
        assert_eq!(tail, expected);
    }
}
