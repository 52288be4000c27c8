//! Flow control's families: each model's queue (depth by band, read at scrape time;
//! waits; refusals) and each tenant's admitted and refused requests.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::routing::Routing;

/// Band labels: a band is at most 7 (`router_flow::MAX_BANDS` bands).
const BANDS: [&str; 8] = ["0", "1", "2", "3", "4", "5", "6", "7"];

/// The label of band `band`.
pub(crate) fn band(band: u8) -> &'static str {
    BANDS.get(usize::from(band)).copied().unwrap_or("7")
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BandLabels {
    pub(crate) model: Arc<str>,
    pub(crate) band: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RefusalLabels {
    pub(crate) model: Arc<str>,
    pub(crate) band: &'static str,
    /// `full` or `timeout`.
    pub(crate) reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TenantLabels {
    pub(crate) model: Arc<str>,
    /// A tenant the configuration names, `anonymous`, or `other`.
    pub(crate) tenant: Arc<str>,
    /// `admitted` or `refused` (over the tenant's cap).
    pub(crate) outcome: &'static str,
}

fn wait_histogram() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The flow-control families recorded on the request path.
#[derive(Debug, Clone)]
pub(crate) struct FlowMetrics {
    /// Time requests waited in the queue before they got capacity.
    pub(crate) waits: Family<BandLabels, Histogram, fn() -> Histogram>,
    /// Requests the queue refused: full, or waited past their deadline.
    pub(crate) refusals: Family<RefusalLabels, Counter>,
    /// Requests by tenant: admitted, or refused over the tenant's cap.
    pub(crate) tenants: Family<TenantLabels, Counter>,
}

impl Default for FlowMetrics {
    fn default() -> Self {
        Self {
            waits: Family::new_with_constructor(wait_histogram),
            refusals: Family::default(),
            tenants: Family::default(),
        }
    }
}

impl FlowMetrics {
    /// Registers the families, and the queue depths read at scrape time from
    /// `routing`.
    pub(super) fn register(&self, registry: &mut Registry, routing: &Arc<Routing>) {
        registry.register(
            "queue_wait_seconds",
            "Time requests waited in their model's queue before an engine had room, by model and priority band",
            self.waits.clone(),
        );
        registry.register(
            "queue_refusals",
            "Requests the model's queue refused, by model, band and reason: full (503 at once) or timeout (503 after max_wait_ms)",
            self.refusals.clone(),
        );
        registry.register(
            "tenant_requests",
            "Requests by model, tenant (named in the configuration, anonymous, or other) and outcome: admitted, or refused (429) over the tenant's in-flight cap",
            self.tenants.clone(),
        );
        registry.register_collector(Box::new(DepthCollector(Arc::clone(routing))));
    }
}

/// Each model's queue depth by band, read at scrape time.
#[derive(Debug)]
struct DepthCollector(Arc<Routing>);

impl Collector for DepthCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let depths = self.0.queue_depths();
        if depths.is_empty() {
            return Ok(());
        }
        let mut metric = encoder.encode_descriptor(
            "queue_depth",
            "Requests waiting in the model's queue, by model and priority band",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (model, bands) in depths {
            for (b, depth) in bands.into_iter().enumerate() {
                let labels = [
                    ("model", &*model),
                    ("band", BANDS.get(b).copied().unwrap_or("7")),
                ];
                ConstGauge::new(i64::try_from(depth).unwrap_or(i64::MAX))
                    .encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
