//! What an engine says about itself in `/server_info` (SGLang): its disaggregation
//! mode, ports, data-parallel ranks, where it publishes load reports and KV events,
//! and what its KV hand-over between prefill and decode engines needs.

use serde_json::Value;

use crate::url::url_host;

/// What an engine's `/server_info` says about it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerInfo {
    /// Whether the engine served `/server_info` (SGLang does; vLLM has none and
    /// answers 404, which leaves every other field empty).
    pub served: bool,
    /// From `disaggregation_mode`: `None` when the engine does not say it, or says a
    /// mode this crate does not know.
    pub disaggregation_mode: Option<DisaggregationMode>,
    /// From `disaggregation_bootstrap_port`.
    pub bootstrap_port: Option<u16>,
    /// From `dp_size`: data-parallel ranks.
    pub dp_size: Option<u32>,
    /// The `LoadStat` feed, from `kv_events.load_endpoint_port_base`.
    pub load_feed: Option<FeedEndpoint>,
    /// The KV-event feed, from `kv_events.endpoint_port_base`.
    pub kv_feed: Option<KvFeedEndpoint>,
    /// What the engine's KV hand-over between prefill and decode engines needs.
    pub hand_over: HandOver,
    /// The LoRA adapters the engine serves: the cards of its `/v1/models` with a
    /// `parent` (vLLM and SGLang list an adapter so), at most 1,024 names of 1 to 256
    /// bytes of visible ASCII each (others are skipped).
    pub adapters: Vec<String>,
}

/// What `/server_info` says about the KV hand-over between a prefill and a decode
/// engine (SGLang's server arguments); what it does not say, or says out of bounds, is
/// `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandOver {
    /// `disaggregation_transfer_backend` (`mooncake`, `nixl`, ...).
    pub transfer_backend: Option<String>,
    /// `page_size`: tokens per KV page.
    pub page_size: Option<u32>,
    /// `kv_cache_dtype` (`auto`, `fp8_e4m3`, ...).
    pub kv_cache_dtype: Option<String>,
    /// The ranks one attention layer spans: `tp_size` over the attention
    /// data-parallel ranks (`dp_size` with `enable_dp_attention`, else 1) and
    /// `attn_cp_size` (1 when unsaid); `None` without `tp_size` or when they do not
    /// divide it.
    pub attention_tp_size: Option<u32>,
    /// `pp_size`: pipeline stages.
    pub pp_size: Option<u32>,
}

/// The longest transfer backend or KV data type name kept.
const MAX_SETTING_BYTES: usize = 64;

/// Reads the hand-over settings of a `/server_info` answer.
fn parse_hand_over(info: &Value) -> HandOver {
    let setting = |key: &str| {
        info[key]
            .as_str()
            .filter(|s| (1..=MAX_SETTING_BYTES).contains(&s.len()))
            .filter(|s| s.bytes().all(|b| b.is_ascii_graphic()))
            .map(str::to_owned)
    };
    HandOver {
        transfer_backend: setting("disaggregation_transfer_backend"),
        page_size: positive(info, "page_size"),
        kv_cache_dtype: setting("kv_cache_dtype"),
        attention_tp_size: attention_tp_size(info),
        pp_size: positive(info, "pp_size"),
    }
}

/// `info[key]` when it is a count from 1 to `u32::MAX`.
fn positive(info: &Value, key: &str) -> Option<u32> {
    info[key]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
}

/// The ranks one attention layer spans, as SGLang derives them from its arguments.
fn attention_tp_size(info: &Value) -> Option<u32> {
    let tp = positive(info, "tp_size")?;
    let dp = match info["enable_dp_attention"].as_bool() {
        Some(true) => positive(info, "dp_size")?,
        _ => 1,
    };
    let cp = match info.get("attn_cp_size") {
        None | Some(Value::Null) => 1,
        Some(_) => positive(info, "attn_cp_size")?,
    };
    let split = dp.checked_mul(cp)?;
    (tp % split == 0).then_some(tp / split)
}

/// An engine's part in prefill-decode disaggregation, as its `disaggregation_mode`
/// says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DisaggregationMode {
    /// `null` (the word, JSON `null` or any other value that is not a string): not
    /// disaggregated, the engine serves whole requests.
    Null,
    /// `prefill`: the engine computes prompts and hands their KV to a decode engine.
    Prefill,
    /// `decode`: the engine generates from KV a prefill engine hands it.
    Decode,
}

/// The most adapters read from an engine's `/v1/models`.
const MAX_ADAPTERS: usize = 1024;
/// The longest adapter name kept.
const MAX_ADAPTER_BYTES: usize = 256;

/// The LoRA adapters a `/v1/models` answer lists: cards with a non-null `parent`
/// whose id is a name a request can give (1 to 256 bytes of visible ASCII), the
/// first 1,024. An engine's answers are trusted, but not with the router's memory.
pub(crate) fn parse_adapters(models: &Value) -> Vec<String> {
    let Some(cards) = models["data"].as_array() else {
        return Vec::new();
    };
    cards
        .iter()
        .filter(|card| !card["parent"].is_null())
        .filter_map(|card| card["id"].as_str())
        .filter(|id| adapter_name(id))
        .take(MAX_ADAPTERS)
        .map(str::to_owned)
        .collect()
}

/// Whether `id` is kept as an adapter's name: 1 to 256 bytes of visible ASCII.
fn adapter_name(id: &str) -> bool {
    (1..=MAX_ADAPTER_BYTES).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Where an engine publishes KV-cache events, and replays them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvFeedEndpoint {
    /// The publisher of rank 0 and the topic.
    pub feed: FeedEndpoint,
    /// Replay ROUTER of rank r at `host:replay_port_base + r`.
    pub replay_port_base: Option<u16>,
    /// The engine's KV page size, when it says.
    pub block_size: Option<u32>,
}

/// Where an engine publishes a ZeroMQ feed: rank r at `host:port_base + r`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedEndpoint {
    /// The publisher's host.
    pub host: String,
    /// The port of rank 0.
    pub port_base: u16,
    /// The ZeroMQ topic.
    pub topic: String,
}

impl FeedEndpoint {
    /// The `tcp://host:port` of rank `rank`; `None` past the last port.
    pub fn rank_endpoint(&self, rank: u32) -> Option<String> {
        let port = self.port_base.checked_add(u16::try_from(rank).ok()?)?;
        Some(format!("tcp://{}:{port}", self.host))
    }
}

/// Reads `/server_info` fields the router uses; a wildcard publisher host means the
/// engine URL's host.
pub fn parse_server_info(info: &Value, engine_url: &str) -> ServerInfo {
    let disaggregation_mode = match info["disaggregation_mode"].as_str() {
        Some("prefill") => Some(DisaggregationMode::Prefill),
        Some("decode") => Some(DisaggregationMode::Decode),
        Some("null") | None if info.get("disaggregation_mode").is_some() => {
            Some(DisaggregationMode::Null)
        }
        _ => None,
    };
    let kv = &info["kv_events"];
    let engine_host = url_host(engine_url);
    let host = match kv["endpoint_host"].as_str() {
        None | Some("*" | "0.0.0.0" | "::" | "[::]" | "") => engine_host,
        Some(host) => host.to_owned(),
    };
    let port = |key: &str| kv[key].as_u64().and_then(|p| u16::try_from(p).ok());
    let load_feed = port("load_endpoint_port_base").map(|port_base| FeedEndpoint {
        host: host.clone(),
        port_base,
        topic: kv["load_topic"].as_str().unwrap_or("load").to_owned(),
    });
    let kv_feed = port("endpoint_port_base").map(|port_base| KvFeedEndpoint {
        feed: FeedEndpoint {
            host: host.clone(),
            port_base,
            topic: kv["topic"].as_str().unwrap_or_default().to_owned(),
        },
        replay_port_base: port("replay_endpoint_port_base"),
        block_size: kv["block_size"]
            .as_u64()
            .and_then(|b| u32::try_from(b).ok()),
    });
    ServerInfo {
        served: true,
        disaggregation_mode,
        bootstrap_port: info["disaggregation_bootstrap_port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok()),
        // A count past u32 is kept as u32::MAX, so the fleet refuses it as too many
        // rather than reading it as unsaid.
        dp_size: info["dp_size"]
            .as_u64()
            .map(|d| u32::try_from(d).unwrap_or(u32::MAX))
            .filter(|d| *d > 0),
        load_feed,
        kv_feed,
        hand_over: parse_hand_over(info),
        adapters: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_the_mode_ports_and_the_load_feed_from_server_info() {
        let info = json!({
            "disaggregation_mode": "prefill", "disaggregation_bootstrap_port": 8998, "dp_size": 2,
            "kv_events": {"endpoint_host": "*", "endpoint_port_base": 5557, "replay_endpoint_port_base": 5570,
                          "topic": "kv", "block_size": 32, "load_endpoint_port_base": 5560, "load_topic": "load"}
        });
        let parsed = parse_server_info(&info, "http://10.1.2.3:30000");
        assert_eq!(
            (
                parsed.disaggregation_mode,
                parsed.bootstrap_port,
                parsed.dp_size
            ),
            (Some(DisaggregationMode::Prefill), Some(8998), Some(2))
        );
        let feed = parsed.load_feed.unwrap();
        assert_eq!(
            feed.rank_endpoint(1).unwrap(),
            "tcp://10.1.2.3:5561",
            "a wildcard host means the engine's host"
        );
        let kv = parsed.kv_feed.unwrap();
        assert_eq!(
            (
                kv.feed.rank_endpoint(1).unwrap(),
                kv.replay_port_base,
                kv.feed.topic.as_str(),
                kv.block_size
            ),
            ("tcp://10.1.2.3:5558".to_owned(), Some(5570), "kv", Some(32))
        );
        let plain = parse_server_info(
            &json!({"disaggregation_mode": "null", "kv_events": null}),
            "http://h:1",
        );
        assert_eq!(
            (plain.disaggregation_mode, plain.load_feed),
            (Some(DisaggregationMode::Null), None)
        );
        assert_eq!(
            parse_server_info(&json!({}), "http://h:1"),
            ServerInfo {
                served: true,
                ..ServerInfo::default()
            },
            "an answer without the fields says nothing but that it was served"
        );
    }

    #[test]
    fn keeps_at_most_1024_adapters_of_visible_ascii_names_up_to_256_bytes() {
        let card = |id: &str| json!({"id": id, "parent": "m"});
        let mut cards = vec![
            json!({"id": "m", "parent": null}),
            card(""),
            card(&"a".repeat(257)),
            card("line\nbreak"),
            card("with space"),
            card("caf\u{e9}"),
            card(&"b".repeat(256)),
        ];
        cards.extend((0..2000).map(|n| card(&format!("lora-{n}"))));
        let adapters = parse_adapters(&json!({"data": cards}));
        assert_eq!(adapters.len(), 1024);
        assert_eq!(adapters[0], "b".repeat(256));
        assert_eq!(adapters[1], "lora-0");
        assert_eq!(adapters[1023], "lora-1022");
        assert!(parse_adapters(&json!({"data": "nothing"})).is_empty());
    }

    #[test]
    fn reads_what_the_kv_hand_over_needs() {
        let info = json!({
            "disaggregation_transfer_backend": "nixl", "page_size": 64, "kv_cache_dtype": "fp8_e4m3",
            "tp_size": 8, "dp_size": 2, "enable_dp_attention": true, "attn_cp_size": 2, "pp_size": 2
        });
        assert_eq!(
            parse_server_info(&info, "http://h:1").hand_over,
            HandOver {
                transfer_backend: Some("nixl".into()),
                page_size: Some(64),
                kv_cache_dtype: Some("fp8_e4m3".into()),
                attention_tp_size: Some(2),
                pp_size: Some(2),
            }
        );
        let tp = |info: Value| {
            parse_server_info(&info, "http://h:1")
                .hand_over
                .attention_tp_size
        };
        assert_eq!(
            tp(json!({"tp_size": 8, "dp_size": 2})),
            Some(8),
            "DP without DP attention splits no layer"
        );
        assert_eq!(
            tp(json!({"tp_size": 8, "dp_size": 3, "enable_dp_attention": true})),
            None
        );
        assert_eq!(tp(json!({"tp_size": 8, "enable_dp_attention": true})), None);
        assert_eq!(tp(json!({"tp_size": 4, "attn_cp_size": null})), Some(4));
        assert_eq!(tp(json!({"dp_size": 2})), None);
        let unsaid = parse_server_info(
            &json!({"disaggregation_transfer_backend": "", "kv_cache_dtype": "x".repeat(65),
                    "page_size": 0, "pp_size": -1, "tp_size": "8"}),
            "http://h:1",
        );
        assert_eq!(
            unsaid.hand_over,
            HandOver::default(),
            "values out of bounds are unsaid"
        );
        let spaced = parse_server_info(&json!({"kv_cache_dtype": "fp 8"}), "http://h:1");
        assert_eq!(spaced.hand_over.kv_cache_dtype, None);
    }

    #[test]
    fn reads_each_disaggregation_mode_as_said() {
        for (said, mode) in [
            (json!("prefill"), Some(DisaggregationMode::Prefill)),
            (json!("decode"), Some(DisaggregationMode::Decode)),
            (json!("null"), Some(DisaggregationMode::Null)),
            (json!(null), Some(DisaggregationMode::Null)),
            (json!(0), Some(DisaggregationMode::Null)),
            (json!("encode"), None),
        ] {
            let info = parse_server_info(&json!({"disaggregation_mode": said}), "http://h:1");
            assert_eq!(info.disaggregation_mode, mode, "{said}");
        }
    }
}
