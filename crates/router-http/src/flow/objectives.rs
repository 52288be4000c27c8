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

/// What the cluster says of an objective a request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// The model's objectives are not read from the cluster.
    NotFollowed,
    /// Followed, and no objective of the model has that name.
    Unknown,
    /// The objective's priority.
    Priority(i64),
}

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

    /// Whether `model`'s objectives are the cluster's.
    pub(crate) fn follows(&self, model: &str) -> bool {
        let table = self.0.load();
        !table.is_empty() && table.contains_key(model)
    }

    /// What objective `name` of `model` gives.
    pub(crate) fn find(&self, model: &str, name: &str) -> Found {
        match self.0.load().get(model) {
            None => Found::NotFollowed,
            Some(objectives) => objectives
                .get(name)
                .map_or(Found::Unknown, |priority| Found::Priority(*priority)),
        }
    }
}
