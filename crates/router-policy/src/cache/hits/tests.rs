use proptest::prelude::*;
use router_state::{EngineId, Role};

use super::*;

fn engine(i: usize) -> Arc<Engine> {
    let id = format!("e{i:03}");
    Arc::new(Engine::new(id.as_str(), "http://e", "m", Role::Plain))
}

proptest! {
    #[test]
    fn the_merge_finds_what_a_search_per_candidate_finds(
        held in proptest::collection::vec((0usize..4, 0usize..3), 1..200),
        candidates in proptest::collection::vec(any::<bool>(), 1..200),
        rotate in 0usize..200,
    ) {
        // Engine i holds held[i].0 blocks, held[i].1 of them only on a slower
        // tier; candidate j is engine j when candidates[j]. The hits of even
        // engines share the candidates' id strings (as a router's do), the odd
        // ones' are copies.
        let all: Vec<Arc<Engine>> = (0..200).map(engine).collect();
        let id_of = |i: usize| if i.is_multiple_of(2) { all[i].id().clone() } else { engine(i).id().clone() };
        let ids = |f: &dyn Fn(usize, (usize, usize)) -> Option<usize>| -> Vec<(EngineId, usize)> {
            held.iter()
                .enumerate()
                .filter_map(|(i, h)| f(i, *h).map(|v| (id_of(i), v)))
                .collect()
        };
        let hits = PrefixHits::new(4, 16, ids(&|_, (b, _)| (b > 0).then_some(b)))
            .with_slower_blocks(ids(&|_, (b, s)| (b > 0 && s.min(b) > 0).then_some(s.min(b))));
        let mut engines: Vec<Arc<Engine>> = candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| **c)
            .map(|(j, _)| Arc::clone(&all[j]))
            .collect();
        prop_assert_eq!(hits.merged(&engines), Some(hits.searched(&engines)));
        prop_assert_eq!(hits.held_among(&engines), hits.searched(&engines));
        // Candidates out of id order: the merge answers exactly or not at all.
        let len = engines.len();
        engines.rotate_left(rotate % len.max(1));
        let merged = hits.merged(&engines);
        prop_assert!(merged.is_none() || merged == Some(hits.searched(&engines)));
        prop_assert_eq!(hits.held_among(&engines), hits.searched(&engines));
        engines.reverse();
        let merged = hits.merged(&engines);
        prop_assert!(merged.is_none() || merged == Some(hits.searched(&engines)));
        prop_assert_eq!(hits.held_among(&engines), hits.searched(&engines));
    }
}

proptest! {
    #[test]
    fn deepest_first_is_a_stable_sort_by_depth(
        blocks in proptest::collection::vec(0usize..40, 0..300),
        query_blocks in 0usize..48,
    ) {
        // Both ways: a counting sort when there are engines enough for the deepest
        // depth, a comparison sort when there are not.
        let engines: Vec<(EngineId, usize)> = blocks
            .iter()
            .enumerate()
            .map(|(i, b)| (EngineId::from(format!("e{i:03}").as_str()), *b))
            .collect();
        let mut expected: Vec<usize> = (0..engines.len()).collect();
        expected.sort_by_key(|&place| std::cmp::Reverse(engines[place].1));
        let hits = PrefixHits::new(query_blocks, 16, engines.clone());
        // The runs cover the order, each holding its blocks, deepest first.
        let mut covered = Vec::new();
        let mut last = usize::MAX;
        for (blocks, places) in hits.by_depth() {
            prop_assert!(!places.is_empty() && blocks < last);
            prop_assert!(places.iter().all(|&p| engines[p].1 == blocks));
            covered.extend_from_slice(places);
            last = blocks;
        }
        prop_assert_eq!(covered, expected);
    }

    #[test]
    fn deepening_keeps_the_depth_order(
        blocks in proptest::collection::vec(1usize..8, 0..60),
        deeper in proptest::collection::vec((0usize..80, 1usize..12), 0..20),
    ) {
        let id = |i: usize| EngineId::from(format!("e{i:03}").as_str());
        let mut hits = PrefixHits::new(
            16,
            16,
            blocks.iter().enumerate().map(|(i, b)| (id(i), *b)).collect(),
        );
        let mut deeper: Vec<(EngineId, usize)> =
            deeper.into_iter().map(|(i, b)| (id(i), b)).collect();
        deeper.sort();
        deeper.dedup_by(|a, b| a.0 == b.0);
        let depths = |hits: &PrefixHits| -> Vec<(usize, Vec<usize>)> {
            hits.by_depth().map(|(b, p)| (b, p.to_vec())).collect()
        };
        // Read deepest first before deepening, as a pick of an earlier bucket would.
        depths(&hits);
        hits.deepen(deeper);
        let rebuilt = PrefixHits::new(16, 16, hits.engines().to_vec());
        prop_assert_eq!(depths(&hits), depths(&rebuilt));
    }
}

proptest! {
    #[test]
    fn a_rank_read_by_place_is_the_rank_searched_for(
        ranked in proptest::collection::vec(proptest::option::of(0u32..8), 1..60),
    ) {
        // Engine i holds a block; it has rank ranked[i] when that is known (all
        // known: the ranks line up with the engines).
        let id = |i: usize| EngineId::from(format!("e{i:03}").as_str());
        let hits = PrefixHits::new(4, 16, (0..ranked.len()).map(|i| (id(i), 1)).collect())
            .with_ranks(
                ranked
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| r.map(|r| (id(i), r)))
                    .collect(),
            );
        for (place, rank) in ranked.iter().enumerate() {
            prop_assert_eq!(hits.place_of(&id(place)), Some(place));
            prop_assert_eq!(hits.rank_at(place), *rank);
        }
        prop_assert_eq!(hits.rank_at(ranked.len()), None);
        prop_assert_eq!(hits.place_of(&id(ranked.len())), None);
    }
}

#[test]
fn a_claimed_depth_does_not_size_an_allocation() {
    // Claims a source should never make (more blocks than any prompt): ordered by a
    // comparison sort, not counted.
    for depth in [1 << 40, 1 << 60, usize::MAX] {
        let hits = PrefixHits::new(depth, 16, vec![("a".into(), depth), ("b".into(), 3)]);
        let runs: Vec<(usize, Vec<usize>)> =
            hits.by_depth().map(|(b, p)| (b, p.to_vec())).collect();
        assert_eq!(runs, [(depth, vec![0]), (3, vec![1])]);
    }
}

#[test]
fn an_answer_read_deepest_first_equals_one_not_read() {
    let hits = PrefixHits::new(4, 16, vec![("a".into(), 1), ("b".into(), 3)]);
    let read = hits.clone();
    assert_eq!(
        read.by_depth().next().map(|(b, p)| (b, p.to_vec())),
        Some((3, vec![1]))
    );
    assert_eq!(read, hits);
}
