//! The priorities the cluster's `InferenceObjective`s give each model's requests
//! (`discovery.kubernetes.objectives`), replaced whole each time discovery reads
//! them. A model is followed from the start, before the first read, so a name it
//! does not know yet is no priority rather than a client error.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;

/// Each followed model's objectives, by name, with their priorities.
type Table = HashMap<String, BTreeMap<String, i64>>;

/// Each followed model's objectives, as discovery last read them.
#[derive(Debug, Default)]
pub(crate) struct ClusterObjectives(Arc<ArcSwap<Table>>);

impl ClusterObjectives {
    /// Replaces every model's objectives with `table`'s; a model of `table` is
    /// followed (an empty entry: followed, no objective yet).
    #[cfg(test)]
    pub(crate) fn replace(&self, table: impl IntoIterator<Item = (String, BTreeMap<String, i64>)>) {
        self.0.store(Arc::new(table.into_iter().collect()));
    }

    /// Follows `models` from now on, with no objective until discovery hands over
    /// what it read, through the sink returned.
    #[cfg(feature = "kubernetes")]
    pub(crate) fn follow(
        &self,
        models: impl IntoIterator<Item = String>,
    ) -> router_fleet::kubernetes::ObjectiveSink {
        let none = models.into_iter().map(|model| (model, BTreeMap::new()));
        self.0.store(Arc::new(none.collect()));
        let table = Arc::clone(&self.0);
        Arc::new(move |read| table.store(Arc::new(read.into_iter().collect())))
    }

    /// Runs `read` on `model`'s objectives: `None` when they are not the cluster's.
    pub(crate) fn read<R>(
        &self,
        model: &str,
        read: impl FnOnce(Option<&BTreeMap<String, i64>>) -> R,
    ) -> R {
        read(self.0.load().get(model))
    }
}
