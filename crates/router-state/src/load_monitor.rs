//! Engine load: reports published by engines, and the router's own request accounting.
//!
//! Engines publish a `LoadStat` gauge per data-parallel rank ([`LoadReport::decode`]).
//! The [`EngineReportedLoadTable`] keeps the latest report per rank, aggregates an
//! engine only when every rank is fresh, derives prefill speed and queue time from the
//! native counters, and counts the requests this router has in flight to each engine
//! through [`InflightGuard`]s. It also keeps the time per output token the router
//! measures on each engine's streamed answers, which no report carries.

mod load_stat;
mod observation;
mod table;
mod tpot;

pub use load_stat::{LOAD_STAT_TAG, LoadDecodeError, LoadReport, NativeLoad};
pub use observation::{EngineMetrics, EngineObservation, NativeAggregate, ReportedLoad};
pub use table::{
    CapacityListener, DEFAULT_FRESHNESS, EngineReportedLoadTable, InflightGuard, IngestError,
    LoadSnapshot, LoadTableConfig, Reservation,
};
pub use tpot::TPOT_FRESHNESS;

#[cfg(test)]
mod tests;
