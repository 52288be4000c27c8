//! Engine load: reports published by engines, and the router's own request accounting.
//!
//! Engines publish a `LoadStat` gauge per data-parallel rank ([`LoadReport::decode`]).
//! The [`EngineReportedLoadTable`] keeps the latest report per rank, aggregates an
//! engine only when every rank is fresh, derives prefill speed and queue time from the
//! native counters, and counts the requests this router has in flight to each engine
//! through [`InflightGuard`]s.

mod load_stat;
mod observation;
mod table;

pub use load_stat::{LOAD_STAT_TAG, LoadDecodeError, LoadReport, NativeLoad};
pub use observation::{EngineMetrics, EngineObservation, NativeAggregate, ReportedLoad};
pub use table::{
    DEFAULT_FRESHNESS, EngineReportedLoadTable, InflightGuard, IngestError, LoadSnapshot,
    LoadTableConfig,
};

#[cfg(test)]
mod tests;
