//! What bounds a `cache_aware` pick in a large group: of more than
//! [`CACHE_AWARE_WINDOW`] candidates, a pick reads the load of a window of them
//! rather than of every one, so it costs about the same at 1,024 candidates as at 32.
//!
//! - **Holders**: the [`CACHE_AWARE_WINDOW`] holders with the least uncached work
//!   (the configured holder count when that is larger); holders tied at the cut are
//!   taken in id order from a random start, so the holders of a popular prefix share
//!   its requests across picks. They are read from the lookup's answer deepest first
//!   ([`deepest`]), so a pick reads the holders it keeps and not every one; only
//!   when some engine holds part of the prompt on a slower tier only, weighed below
//!   a device's, is every holder ranked ([`least_work`]). Of those kept, only the
//!   holders the pick reaches in order have their load read (the `order` module).
//! - **The load bound's mean** (`load_bound`): estimated from
//!   [`CACHE_AWARE_WINDOW`] candidates spread evenly over the group from a random
//!   start, instead of summed over all of them.
//! - **A miss, a spill, a saturation check**: the engines compared are those of such a
//!   spread sample.
//!
//! Up to [`CACHE_AWARE_WINDOW`] candidates, every one is read, as before the window.

use crate::cache::PrefixHits;
use crate::rng::Draws;

/// Most candidates whose load one `cache_aware` pick reads for each of its steps
/// (holders, the load bound, a miss); see the module documentation.
pub const CACHE_AWARE_WINDOW: usize = 32;

/// The candidate positions a step reads among `n`: every one up to `window`, else
/// `window` of them spread evenly from a random start (one draw).
pub(super) fn spread(draws: &mut Draws<'_>, n: usize, window: usize) -> Vec<usize> {
    if n <= window {
        return (0..n).collect();
    }
    let start = draws.index(n);
    // `i * n / window` strictly increases below `n`, so the positions are distinct.
    (0..window).map(|i| (start + i * n / window) % n).collect()
}

/// Of `ranked` (a holder's uncached work and its place among the holders), the
/// `window` with the least work, ties at the cut taken in place order from a random
/// start; all of them when there are no more than `window`.
pub(super) fn least_work(
    draws: &mut Draws<'_>,
    mut ranked: Vec<(u64, usize)>,
    window: usize,
) -> Vec<(u64, usize)> {
    let n = ranked.len();
    if n <= window {
        return ranked;
    }
    let start = draws.index(n);
    ranked.select_nth_unstable_by_key(window - 1, |&(work, place)| (work, (place + n - start) % n));
    ranked.truncate(window);
    ranked
}

/// Of a lookup's answer, the first `window` engines deepest first that are
/// candidates (`place` gives a hit's candidate index, from its place in
/// [`PrefixHits::engines`]) holding enough blocks to count (`holds`, true for a
/// prefix of depths, deepest first): `(candidate index, blocks)` each. Hits holding
/// as many blocks are taken whole while they fit; of those at the cut, in id order
/// from a candidate drawn evenly among the run's ([`candidate_start`]), wrapping, so
/// each of them is as likely to be kept. Only the hits taken, those at the cut passed
/// over as not candidates, and the places a draw tried are read.
pub(super) fn deepest(
    draws: &mut Draws<'_>,
    hits: &PrefixHits,
    window: usize,
    place: impl Fn(usize) -> Option<usize>,
    holds: impl Fn(usize) -> bool,
) -> Vec<(usize, usize)> {
    let mut kept = Vec::with_capacity(window.min(hits.engines().len()));
    for (blocks, run) in hits.by_depth() {
        if kept.len() == window || !holds(blocks) {
            break;
        }
        let start = if run.len() > window - kept.len() {
            match candidate_start(draws, run, &place) {
                Some(start) => start,
                None => continue,
            }
        } else {
            0
        };
        let (wrapped, from_start) = run.split_at(start);
        for &hit in from_start.iter().chain(wrapped) {
            if kept.len() == window {
                break;
            }
            if let Some(index) = place(hit) {
                kept.push((index, blocks));
            }
        }
    }
    kept
}

/// Random places of a run tried before its candidates are counted.
const START_TRIES: usize = 4;

/// The place in `run` of one of its candidates, each as likely as another: the first
/// candidate of up to [`START_TRIES`] random places, else one drawn among the
/// candidates counted; `None` when the run has none.
fn candidate_start(
    draws: &mut Draws<'_>,
    run: &[usize],
    place: &impl Fn(usize) -> Option<usize>,
) -> Option<usize> {
    for _ in 0..START_TRIES {
        let at = draws.index(run.len());
        if place(run[at]).is_some() {
            return Some(at);
        }
    }
    let candidates: Vec<usize> = (0..run.len())
        .filter(|&at| place(run[at]).is_some())
        .collect();
    (!candidates.is_empty()).then(|| candidates[draws.index(candidates.len())])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::rng::SharedRng;

    proptest! {
        #[test]
        fn a_spread_is_distinct_in_range_and_whole_when_small(
            seed: u64, n in 1usize..3000, window in 1usize..64,
        ) {
            let rng = SharedRng::from_seed(seed);
            let mut positions = spread(&mut rng.draws(false), n, window);
            prop_assert_eq!(positions.len(), n.min(window));
            prop_assert!(positions.iter().all(|&p| p < n));
            positions.sort_unstable();
            positions.dedup();
            prop_assert_eq!(positions.len(), n.min(window));
        }

        #[test]
        fn the_least_work_is_kept_whatever_the_start(
            seed: u64,
            work in proptest::collection::vec(0u64..4, 1..200),
            window in 1usize..40,
        ) {
            let rng = SharedRng::from_seed(seed);
            let ranked: Vec<(u64, usize)> = work.iter().copied().zip(0..).collect();
            let kept = least_work(&mut rng.draws(false), ranked, window);
            prop_assert_eq!(kept.len(), work.len().min(window));
            // Nothing left out has less work than something kept.
            let most_kept = kept.iter().map(|k| k.0).max().unwrap_or(0);
            let places: Vec<usize> = kept.iter().map(|k| k.1).collect();
            for (place, w) in work.iter().enumerate() {
                if !places.contains(&place) {
                    prop_assert!(*w >= most_kept);
                }
            }
        }

        #[test]
        fn the_deepest_candidates_are_kept_whatever_the_start(
            seed: u64,
            held in proptest::collection::vec((1usize..6, any::<bool>()), 0..200),
            window in 1usize..40,
            least in 0usize..4,
        ) {
            // Hit p holds held[p].0 blocks and is candidate p when held[p].1; a
            // holder needs at least `least` blocks.
            let hits = PrefixHits::new(
                8,
                16,
                held.iter()
                    .enumerate()
                    .map(|(p, (blocks, _))| (format!("e{p:03}").as_str().into(), *blocks))
                    .collect(),
            );
            let eligible = |p: usize| held[p].1 && held[p].0 >= least;
            let rng = SharedRng::from_seed(seed);
            let kept = deepest(
                &mut rng.draws(false),
                &hits,
                window,
                |p| held[p].1.then_some(p),
                |blocks| blocks >= least,
            );
            let count = (0..held.len()).filter(|&p| eligible(p)).count();
            prop_assert_eq!(kept.len(), count.min(window));
            let mut places: Vec<usize> = kept.iter().map(|k| k.0).collect();
            prop_assert!(kept.iter().all(|&(p, blocks)| eligible(p) && held[p].0 == blocks));
            places.sort_unstable();
            places.dedup();
            prop_assert_eq!(places.len(), kept.len(), "each candidate once");
            // Nothing eligible left out holds more than something kept.
            let least_kept = kept.iter().map(|k| k.1).min().unwrap_or(usize::MAX);
            for p in (0..held.len()).filter(|&p| eligible(p) && !places.contains(&p)) {
                prop_assert!(held[p].0 <= least_kept);
            }
        }
    }

    /// `n` hits holding 5 blocks each.
    fn tied(n: usize) -> PrefixHits {
        PrefixHits::new(
            8,
            16,
            (0..n)
                .map(|p| (format!("e{p:04}").as_str().into(), 5))
                .collect(),
        )
    }

    #[test]
    fn tied_holders_take_turns_by_depth() {
        // 1,024 hits holding as much, every one a candidate: each pick's window starts
        // at a random place, so every one is in some window.
        let hits = tied(1024);
        let rng = SharedRng::from_seed(7);
        let mut seen = [false; 1024];
        for _ in 0..2000 {
            let kept = deepest(
                &mut rng.draws(false),
                &hits,
                CACHE_AWARE_WINDOW,
                Some,
                |_| true,
            );
            for (place, _) in kept {
                seen[place] = true;
            }
        }
        assert!(seen.iter().all(|s| *s), "some holder never considered");
    }

    #[test]
    fn tied_candidates_at_the_cut_are_kept_evenly_among_other_hits() {
        // 40 candidates tied with 1,000 hits that are not candidates (other groups'
        // engines), all before them in id order, or spread among them (one hit in 26
        // a candidate): a window of 32 keeps each candidate in about 32 of 40 picks.
        let hits = tied(1040);
        let before = |p: usize| (p >= 1000).then(|| p - 1000);
        let spread = |p: usize| p.is_multiple_of(26).then_some(p / 26);
        let rng = SharedRng::from_seed(7);
        let picks = 4000;
        for place in [&before as &dyn Fn(usize) -> Option<usize>, &spread] {
            let mut kept = [0u32; 40];
            for _ in 0..picks {
                let window = deepest(
                    &mut rng.draws(false),
                    &hits,
                    CACHE_AWARE_WINDOW,
                    place,
                    |_| true,
                );
                assert_eq!(window.len(), CACHE_AWARE_WINDOW);
                for (index, _) in window {
                    kept[index] += 1;
                }
            }
            let least = kept.iter().min().copied().unwrap_or(0);
            assert!(
                least > picks * 7 / 10,
                "a candidate kept {least} times of {picks}"
            );
        }
    }

    #[test]
    fn a_lone_candidate_among_tied_hits_is_found() {
        // One candidate in 1,000 tied hits: the random places miss it, the count
        // finds it.
        let hits = tied(1000);
        let rng = SharedRng::from_seed(3);
        for _ in 0..50 {
            let kept = deepest(
                &mut rng.draws(false),
                &hits,
                4,
                |p| (p == 617).then_some(0),
                |_| true,
            );
            assert_eq!(kept, [(0, 5)]);
        }
    }

    #[test]
    fn tied_holders_take_turns() {
        // 1,024 holders with the same work: successive picks' windows start at
        // random places, so every holder is in some window.
        let rng = SharedRng::from_seed(7);
        let mut seen = [false; 1024];
        for _ in 0..2000 {
            let ranked: Vec<(u64, usize)> = (0..1024).map(|p| (5, p)).collect();
            for (_, place) in least_work(&mut rng.draws(false), ranked, CACHE_AWARE_WINDOW) {
                seen[place] = true;
            }
        }
        assert!(seen.iter().all(|s| *s), "some holder never considered");
    }
}
