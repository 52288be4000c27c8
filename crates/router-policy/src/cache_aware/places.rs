//! Where each candidate sits in the list a pick is given, found from its id in one
//! probe, so a pick reads the holders a lookup ranks deepest without merging the
//! lookup's answer with every candidate. A group offers the same list pick after
//! pick, so a policy keeps the places of the lists it was given last
//! ([`EngineListMemo`](router_state::EngineListMemo)).

use std::sync::Arc;

use router_state::{Engine, EngineId};
use rustc_hash::FxHashMap;

/// The places of one candidate list's engines, by id.
pub(super) struct Places {
    by_id: FxHashMap<EngineId, usize>,
}

impl Places {
    /// The places of `engines`.
    pub(super) fn of(engines: &[Arc<Engine>]) -> Self {
        let mut by_id = FxHashMap::with_capacity_and_hasher(engines.len(), Default::default());
        for (place, engine) in engines.iter().enumerate() {
            by_id.insert(engine.id().clone(), place);
        }
        Self { by_id }
    }

    /// The place of the candidate `id`, if it is one.
    pub(super) fn place(&self, id: &EngineId) -> Option<usize> {
        self.by_id.get(id).copied()
    }
}

#[cfg(test)]
mod tests {
    use router_state::Role;
    use router_state::test_util::fleet;

    use super::*;

    #[test]
    fn each_candidate_is_found_at_its_place() {
        let engines = fleet("m", Role::Plain, "e", 6);
        let places = Places::of(&engines[1..]);
        assert_eq!(places.place(engines[4].id()), Some(3));
        assert_eq!(places.place(engines[0].id()), None);
        assert_eq!(places.place(&EngineId::from("e9")), None);
    }
}
