//! Shared router state: the engines a router can use, the load they report, and the
//! requests the router has in flight to them.
//!
//! Everything here is read on every routed request and written by background tasks
//! (discovery, health checks, load-feed subscribers), so each table is published as an
//! immutable snapshot behind an atomic pointer ([`arc_swap`]): a reader never blocks a
//! writer or another reader, and one request sees one consistent view. Request
//! accounting is the exception: in-flight counts are atomics behind an RAII
//! [`InflightGuard`], so no error path or cancelled future can leak load. This crate
//! knows nothing of policies, buckets or HTTP. Two stateful services sit beside the
//! tables: [`kv_events`] (what each engine holds in its prefix cache, from its KV
//! events) and [`affinity`] (session and routing-key bindings).
//!
//! ```
//! use std::sync::Arc;
//! use router_state::{EngineReportedLoadTable, LoadReport, Role, Engine, EngineRegistry};
//!
//! let registry = EngineRegistry::new();
//! registry.add(Engine::new("A1", "http://127.0.0.1:31011", "chat-model", Role::Plain))?;
//! let snapshot = registry.snapshot();
//! let engine = Arc::clone(&snapshot.model_engines("chat-model")[0]);
//!
//! let load = EngineReportedLoadTable::default();
//! load.register(engine.id(), engine.dp_size());
//! // ["LoadStat", running 3, waiting 1, used KV 900, capacity 4096, rank 0]
//! let report = LoadReport::decode(&[
//!     0x96, 0xa8, b'L', b'o', b'a', b'd', b'S', b't', b'a', b't', 3, 1, 0xcd, 0x03, 0x84,
//!     0xcd, 0x10, 0x00, 0,
//! ])?;
//! # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
//! load.ingest(engine.id(), 0, report, tokio::time::Instant::now())?;
//! let guard = load.acquire(engine.id());
//! let seen = load.snapshot().observe(engine.id());
//! // The report's 3 running, and the request dispatched since, which it cannot show.
//! assert_eq!(seen.metrics().running_requests, Some(4));
//! assert_eq!(seen.in_flight, 1);
//! drop(guard);
//! assert_eq!(load.in_flight(engine.id()), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod affinity;
mod engine;
mod feed;
pub mod kv_events;
mod list_memo;
mod load_monitor;
mod names;
mod pd;
mod registry;
#[cfg(any(test, feature = "test-util"))]
pub mod test_util;

pub use engine::{Engine, EngineId, Health, MAX_DP_SIZE, Role};
#[cfg(feature = "zmq")]
pub use feed::spawn_load_subscriber;
pub use feed::{
    DEFAULT_FEED_MEMORY_BYTES, DEFAULT_MAX_FEED_MESSAGE_BYTES, Envelope, EnvelopeError, FeedHandle,
    FeedMemory, FeedStats, LoadFeedSource, Sequence, decode_envelope,
};
pub use list_memo::{EngineListMemo, KEPT_LISTS};
pub use load_monitor::{
    CapacityListener, DEFAULT_FRESHNESS, EngineMetrics, EngineObservation, EngineReportedLoadTable,
    InflightGuard, IngestError, LOAD_STAT_TAG, LoadDecodeError, LoadReport, LoadSnapshot,
    LoadTableConfig, NativeAggregate, NativeLoad, ReportedLoad, Reservation, TPOT_FRESHNESS,
};
pub use names::{MAX_NAME_BYTES, NameError, check_name, is_label_part};
pub use pd::{PdMismatch, PdProfile};
pub use registry::{EngineRegistry, ModelMode, RegistryError, RegistrySnapshot};
