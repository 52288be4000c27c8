//! The ZeroMQ feeds of one engine: its `LoadStat` reports and, when its model keeps a
//! prefix index, its KV events; one subscriber per data-parallel rank. Configured
//! ports win over advertised ones.

use std::num::NonZeroU32;
use std::sync::Arc;

use router_state::kv_events::{KvFeedStats, KvSource, PrefixIndex, spawn_kv_subscriber};
use router_state::{
    EngineId, EngineReportedLoadTable, FeedHandle, FeedMemory, FeedStats, LoadFeedSource,
    spawn_load_subscriber,
};
use router_upstream::{FeedEndpoint, KvFeedEndpoint, ServerInfo, url_host};

use crate::spec::EngineSpec;

/// What every feed of a fleet may receive: messages up to a size, all of them within
/// one memory budget.
#[derive(Debug, Clone)]
pub(crate) struct FeedBounds {
    pub(crate) max_message_bytes: usize,
    pub(crate) memory: FeedMemory,
}

/// Starts the load subscribers of `spec` (with `dp_size` ranks).
pub(crate) fn load_feeds(
    spec: &EngineSpec,
    dp_size: NonZeroU32,
    advertised: Option<FeedEndpoint>,
    load: &Arc<EngineReportedLoadTable>,
    stats: &Arc<FeedStats>,
    bounds: &FeedBounds,
) -> Vec<FeedHandle> {
    let endpoint = match (spec.load_port, advertised) {
        (Some(port_base), advertised) => Some(FeedEndpoint {
            host: url_host(&spec.url),
            port_base,
            topic: advertised.map_or_else(|| "load".to_owned(), |a| a.topic),
        }),
        (None, advertised) => advertised,
    };
    let Some(endpoint) = endpoint else {
        return Vec::new();
    };
    (0..dp_size.get())
        .filter_map(|rank| {
            let source = LoadFeedSource {
                engine: spec.id.clone(),
                rank,
                endpoint: endpoint.rank_endpoint(rank)?,
                topic: endpoint.topic.clone(),
                max_message_bytes: bounds.max_message_bytes,
                memory: bounds.memory.clone(),
            };
            Some(spawn_load_subscriber(
                Arc::clone(load),
                source,
                Arc::clone(stats),
            ))
        })
        .collect()
}

/// Starts the KV-event subscribers of `spec` into `index`.
pub(crate) fn kv_feeds(
    spec: &EngineSpec,
    dp_size: NonZeroU32,
    advertised: Option<KvFeedEndpoint>,
    index: &Arc<PrefixIndex>,
    stats: &Arc<KvFeedStats>,
    bounds: &FeedBounds,
) -> Vec<FeedHandle> {
    let id: &EngineId = &spec.id;
    let model = spec.model.as_str();
    let endpoint = match (spec.kv_port, advertised) {
        (Some(port_base), advertised) => KvFeedEndpoint {
            feed: FeedEndpoint {
                host: url_host(&spec.url),
                port_base,
                topic: advertised
                    .as_ref()
                    .map_or_else(String::new, |a| a.feed.topic.clone()),
            },
            replay_port_base: spec
                .kv_replay_port
                .or(advertised.as_ref().and_then(|a| a.replay_port_base)),
            block_size: advertised.and_then(|a| a.block_size),
        },
        (None, Some(advertised)) => KvFeedEndpoint {
            replay_port_base: spec.kv_replay_port.or(advertised.replay_port_base),
            ..advertised
        },
        (None, None) => {
            tracing::warn!(engine = %id, model, "the engine advertises no KV events and has no kv_port: cache-aware routing cannot see its cache");
            return Vec::new();
        }
    };
    let expected = index.config().block_size;
    if let Some(block_size) = endpoint.block_size.filter(|b| *b != expected) {
        tracing::warn!(engine = %id, model, block_size, expected, "the engine's KV page size differs from the model's block_size: its events will be skipped");
    }
    (0..dp_size.get())
        .filter_map(|rank| {
            let replay = |base: u16| {
                FeedEndpoint {
                    port_base: base,
                    ..endpoint.feed.clone()
                }
                .rank_endpoint(rank)
            };
            let source = KvSource {
                engine: id.clone(),
                rank,
                endpoint: endpoint.feed.rank_endpoint(rank)?,
                replay_endpoint: endpoint.replay_port_base.and_then(replay),
                topic: endpoint.feed.topic.clone(),
                max_message_bytes: bounds.max_message_bytes,
                memory: bounds.memory.clone(),
            };
            Some(spawn_kv_subscriber(
                Arc::clone(index),
                source,
                Arc::clone(stats),
            ))
        })
        .collect()
}

/// What `/server_info` advertised, as the feeds read it.
pub(crate) fn advertised(
    info: Option<&ServerInfo>,
) -> (Option<FeedEndpoint>, Option<KvFeedEndpoint>) {
    info.map_or((None, None), |i| (i.load_feed.clone(), i.kv_feed.clone()))
}
