//! KV-cache events: the wire format engines publish, the router's content hash, the
//! prefix index fed from the events, the pages the router routed (pending or
//! estimated), and (feature `zmq`) the subscriber that feeds the index.

mod hash;
mod index;
mod routed;
#[cfg(feature = "zmq")]
mod subscriber;
mod wire;

pub use hash::{cache_namespace, chain_hashes, namespace_seed};
pub use index::{
    ApplyOutcome, EngineMatch, IndexConfig, IndexSize, PrefixIndex, PrefixMatch, Publisher,
    SkipReason,
};
pub use routed::{RoutedPages, RoutedPagesConfig};
#[cfg(feature = "zmq")]
pub use subscriber::{KvFeedStats, KvSource, spawn_kv_subscriber};
pub use wire::{
    BatchError, BlockRemoved, BlockStored, EventError, KvBatch, KvEvent, MAX_FEED_AGE, Tier,
    decode_batch,
};
