//! Seedable randomness shared by the sampling policies.

use std::hash::{BuildHasher, Hasher, RandomState};

use parking_lot::Mutex;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};

/// A xoshiro256++ generator behind a mutex: picks are short and the lock is held for
/// one or two draws.
#[derive(Debug)]
pub(crate) struct SharedRng(Mutex<Xoshiro256PlusPlus>);

impl SharedRng {
    /// A generator with a fixed seed, for reproducible selections.
    pub(crate) fn from_seed(seed: u64) -> Self {
        Self(Mutex::new(Xoshiro256PlusPlus::seed_from_u64(seed)))
    }

    /// A generator seeded from the process's hash randomness.
    pub(crate) fn from_entropy() -> Self {
        Self::from_seed(RandomState::new().build_hasher().finish())
    }

    /// The draws of one pick: from the generator itself, or, for a dry run,
    /// from a copy of it, so that the explanation draws what the next real pick will
    /// and leaves the generator as it was.
    pub(crate) fn draws(&self, dry_run: bool) -> Draws<'_> {
        if dry_run {
            Draws::Copy(self.0.lock().clone())
        } else {
            Draws::Shared(self)
        }
    }
}

/// Where one pick's random draws come from (see [`SharedRng::draws`]).
#[derive(Debug)]
pub(crate) enum Draws<'a> {
    /// The shared generator, locked for each draw.
    Shared(&'a SharedRng),
    /// A copy of it, for a dry run.
    Copy(Xoshiro256PlusPlus),
}

impl Draws<'_> {
    fn with<R>(&mut self, draw: impl FnOnce(&mut Xoshiro256PlusPlus) -> R) -> R {
        match self {
            Draws::Shared(shared) => draw(&mut shared.0.lock()),
            Draws::Copy(rng) => draw(rng),
        }
    }

    /// A uniform index in `0..n`; `n` must be positive.
    pub(crate) fn index(&mut self, n: usize) -> usize {
        self.with(|rng| uniform(rng, n as u64) as usize)
    }

    /// Two distinct uniform indices in `0..n`, in sampling order; `n` must be at least 2.
    pub(crate) fn two_distinct(&mut self, n: usize) -> (usize, usize) {
        self.with(|rng| {
            let first = uniform(rng, n as u64) as usize;
            let second = uniform(rng, n as u64 - 1) as usize;
            (first, if second >= first { second + 1 } else { second })
        })
    }

    /// `k` distinct uniform indices in `0..n`, in sampling order; `k` must be at most
    /// `n`.
    pub(crate) fn distinct(&mut self, n: usize, k: usize) -> Vec<usize> {
        self.with(|rng| {
            let mut pool: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = i + uniform(rng, (n - i) as u64) as usize;
                pool.swap(i, j);
            }
            pool.truncate(k);
            pool
        })
    }
}

/// Lemire's nearly divisionless method: unbiased for every `n > 0`.
fn uniform(rng: &mut impl RngCore, n: u64) -> u64 {
    let mut product = u128::from(rng.next_u64()) * u128::from(n);
    if (product as u64) < n {
        let threshold = n.wrapping_neg() % n;
        while (product as u64) < threshold {
            product = u128::from(rng.next_u64()) * u128::from(n);
        }
    }
    (product >> 64) as u64
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn two_samples_are_distinct_and_in_range(seed: u64, n in 2usize..300) {
            let rng = SharedRng::from_seed(seed);
            let mut rng = rng.draws(false);
            for _ in 0..32 {
                let (a, b) = rng.two_distinct(n);
                prop_assert!(a != b, "power-of-two never samples one engine twice ({a} twice of {n})");
                prop_assert!(a < n && b < n, "samples {a}, {b} lie in 0..{n}");
            }
        }

        #[test]
        fn k_samples_are_distinct_and_in_range(seed: u64, n in 1usize..100, k in 1usize..100) {
            let k = k.min(n);
            let rng = SharedRng::from_seed(seed);
            let mut rng = rng.draws(false);
            let mut sample = rng.distinct(n, k);
            prop_assert_eq!(sample.len(), k);
            prop_assert!(sample.iter().all(|&i| i < n), "samples lie in 0..{}", n);
            sample.sort_unstable();
            sample.dedup();
            prop_assert_eq!(sample.len(), k, "power-of-k never samples one engine twice");
        }
    }

    #[test]
    fn explained_draws_are_the_next_real_draws_and_leave_the_generator_alone() {
        let rng = SharedRng::from_seed(3);
        let explained: Vec<usize> = {
            let mut draws = rng.draws(true);
            vec![
                draws.index(1000),
                draws.two_distinct(1000).0,
                draws.distinct(1000, 3)[2],
            ]
        };
        let again: Vec<usize> = {
            let mut draws = rng.draws(true);
            vec![
                draws.index(1000),
                draws.two_distinct(1000).0,
                draws.distinct(1000, 3)[2],
            ]
        };
        let mut draws = rng.draws(false);
        let real = vec![
            draws.index(1000),
            draws.two_distinct(1000).0,
            draws.distinct(1000, 3)[2],
        ];
        assert_eq!(
            explained, again,
            "an explanation leaves the generator as it was"
        );
        assert_eq!(
            explained, real,
            "the next real pick draws what the explanation drew"
        );
        let mut draws = rng.draws(false);
        assert_ne!(
            draws.index(1 << 40),
            SharedRng::from_seed(3).draws(false).index(1 << 40)
        );
    }

    #[test]
    fn indices_are_uniform() {
        let rng = SharedRng::from_seed(7);
        let mut rng = rng.draws(false);
        let mut counts = [0u32; 5];
        for _ in 0..100_000 {
            counts[rng.index(5)] += 1;
        }
        for c in counts {
            assert!(
                (19_000..21_000).contains(&c),
                "each of 5 indices near 20000: {counts:?}"
            );
        }
    }

    #[test]
    fn every_ordered_pair_is_sampled() {
        let rng = SharedRng::from_seed(11);
        let mut rng = rng.draws(false);
        let mut seen = [[0u32; 3]; 3];
        for _ in 0..60_000 {
            let (a, b) = rng.two_distinct(3);
            seen[a][b] += 1;
        }
        for (a, row) in seen.iter().enumerate() {
            for (b, &c) in row.iter().enumerate() {
                if a == b {
                    assert_eq!(c, 0);
                } else {
                    assert!(
                        (9_000..11_000).contains(&c),
                        "pair ({a},{b}) sampled {c} times: {seen:?}"
                    );
                }
            }
        }
    }
}
