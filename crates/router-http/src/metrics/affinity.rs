//! The affinity store at scrape time: the bindings this process holds and, for a
//! store shared by replicas, whether its backend answers and what it cost.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use router_state::affinity::AffinityStore;

/// See the module documentation.
#[derive(Debug)]
pub(super) struct AffinityCollector(pub(super) Arc<dyn AffinityStore>);

impl Collector for AffinityCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let bindings = ConstGauge::new(i64::try_from(self.0.len()).unwrap_or(i64::MAX));
        bindings.encode(encoder.encode_descriptor(
            "affinity_bindings",
            "Session and routing-key bindings held in this process (live or awaiting the sweeper; for a shared store, its local cache and outage bindings)",
            None,
            bindings.metric_type(),
        )?)?;
        let Some(status) = self.0.backend() else {
            return Ok(());
        };
        let up = ConstGauge::new(i64::from(status.reachable));
        up.encode(encoder.encode_descriptor(
            "affinity_backend_up",
            "Whether the shared affinity store answered its last command or connection attempt",
            None,
            up.metric_type(),
        )?)?;
        let errors = ConstCounter::new(status.errors);
        errors.encode(encoder.encode_descriptor(
            "affinity_backend_errors",
            "Shared affinity store commands that failed or timed out, and connection attempts that failed",
            None,
            errors.metric_type(),
        )?)?;
        let fallbacks = ConstCounter::new(status.local_fallbacks);
        fallbacks.encode(encoder.encode_descriptor(
            "affinity_local_fallbacks",
            "Affinity lookups and bindings answered from local bindings because the shared store was unreachable",
            None,
            fallbacks.metric_type(),
        )?)?;
        let skipped = ConstCounter::new(status.skipped);
        skipped.encode(encoder.encode_descriptor(
            "affinity_backend_skips",
            "Shared affinity store commands not sent, their operations answered from local bindings: the backoff after a command timed out, or the pick's deadline passed",
            None,
            skipped.metric_type(),
        )?)
    }
}
