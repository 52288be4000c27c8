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

    /// A uniform index in `0..n`; `n` must be positive.
    pub(crate) fn index(&self, n: usize) -> usize {
        uniform(&mut *self.0.lock(), n as u64) as usize
    }

    /// Two distinct uniform indices in `0..n`, in sampling order; `n` must be at least 2.
    pub(crate) fn two_distinct(&self, n: usize) -> (usize, usize) {
        let mut rng = self.0.lock();
        let first = uniform(&mut *rng, n as u64) as usize;
        let second = uniform(&mut *rng, n as u64 - 1) as usize;
        (first, if second >= first { second + 1 } else { second })
    }

    /// `k` distinct uniform indices in `0..n`, in sampling order; `k` must be at most
    /// `n`.
    pub(crate) fn distinct(&self, n: usize, k: usize) -> Vec<usize> {
        let mut rng = self.0.lock();
        let mut pool: Vec<usize> = (0..n).collect();
        for i in 0..k {
            let j = i + uniform(&mut *rng, (n - i) as u64) as usize;
            pool.swap(i, j);
        }
        pool.truncate(k);
        pool
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
            let mut sample = rng.distinct(n, k);
            prop_assert_eq!(sample.len(), k);
            prop_assert!(sample.iter().all(|&i| i < n), "samples lie in 0..{}", n);
            sample.sort_unstable();
            sample.dedup();
            prop_assert_eq!(sample.len(), k, "power-of-k never samples one engine twice");
        }
    }

    #[test]
    fn indices_are_uniform() {
        let rng = SharedRng::from_seed(7);
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
