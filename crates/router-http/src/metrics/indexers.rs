//! A router's lookups of its shared prefix indexers, per indexer: lookups sent,
//! lookups that failed, and whether its breaker keeps lookups from it. Each series
//! is labelled with the indexer's position in `prefix_indexer.urls` (`0` for `url`);
//! the families outlive reloads, which build new breakers (closed).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IndexerLabels {
    indexer: String,
}

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub(crate) struct IndexerMetrics {
    lookups: Family<IndexerLabels, Counter>,
    failures: Family<IndexerLabels, Counter>,
    breaker_open: Family<IndexerLabels, Gauge>,
}

/// The series of one indexer.
#[derive(Debug, Clone)]
pub(crate) struct IndexerCounts {
    /// Lookups sent to it (trials included).
    pub(crate) lookups: Counter,
    /// Lookups it did not answer usably (no answer in time, refused, 401, 5xx, an
    /// answer that does not check).
    pub(crate) failures: Counter,
    /// 1 while its breaker is open or its trial lookup is out, else 0.
    pub(crate) breaker_open: Gauge,
}

impl IndexerMetrics {
    /// The series of the indexer at `position`, present from now on.
    pub(crate) fn of(&self, position: usize) -> IndexerCounts {
        let labels = IndexerLabels {
            indexer: position.to_string(),
        };
        IndexerCounts {
            lookups: self.lookups.get_or_create(&labels).clone(),
            failures: self.failures.get_or_create(&labels).clone(),
            breaker_open: self.breaker_open.get_or_create(&labels).clone(),
        }
    }

    /// Registers the three families in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "indexer_lookups",
            "Prefix lookups sent to each shared indexer, by its position in prefix_indexer.urls",
            self.lookups.clone(),
        );
        registry.register(
            "indexer_lookup_failures",
            "Prefix lookups a shared indexer did not answer usably (each then tried at the next indexer), by position",
            self.failures.clone(),
        );
        registry.register(
            "indexer_breaker_open",
            "1 while a shared indexer's breaker keeps lookups from it (open, or its one trial lookup out), by position",
            self.breaker_open.clone(),
        );
    }
}
