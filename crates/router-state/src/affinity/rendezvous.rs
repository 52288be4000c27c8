//! Rendezvous (highest-random-weight) hashing: a key's engines in an order every
//! router replica computes alike from the key and the engine ids alone, with no
//! store. Removing an engine moves only the keys whose first engine it was; adding
//! one takes from each other engine only the keys it now outweighs.
//!
//! A weight is one mix of two hashes: the key's, taken once a pick, and the engine
//! id's ([`seed`]), which an [`Engine`](crate::Engine) keeps from its construction.
//! So finding a key's first engine ([`first`]) costs about a nanosecond a candidate
//! and no sort; the whole order ([`order`]) is needed only when that engine is
//! refused.
//!
//! ```
//! use router_state::EngineId;
//! use router_state::affinity::rendezvous;
//!
//! let engines = [EngineId::from("A"), EngineId::from("B"), EngineId::from("C")];
//! let order = rendezvous::order("session-42", &engines, |e| e);
//! let without_last = rendezvous::order("session-42", &engines[..2], |e| e);
//! if order[0] != &engines[2] {
//!     assert_eq!(order[0], without_last[0], "only the removed engine's keys move");
//! }
//! ```

use xxhash_rust::xxh3::xxh3_64;

use crate::engine::EngineId;

/// The hash of an engine id every weight of that engine mixes in.
pub fn seed(engine: &EngineId) -> u64 {
    xxh3_64(engine.as_str().as_bytes())
}

/// The hash of a key every weight for that key mixes in.
pub fn key_hash(key: &str) -> u64 {
    xxh3_64(key.as_bytes())
}

/// The weight of the engine whose [`seed`] is `seed` for the key whose
/// [`key_hash`] is `key_hash`: the two mixed by the 64-bit finaliser of MurmurHash3
/// (a bijection in which every input bit moves every output bit), so every process
/// gives the same weight.
pub fn mix(key_hash: u64, seed: u64) -> u64 {
    let mut x = key_hash ^ seed;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The weight of `engine` for `key`.
pub fn weight(key: &str, engine: &EngineId) -> u64 {
    mix(key_hash(key), seed(engine))
}

/// `items` in the order `key` prefers them: highest weight first, equal weights by
/// engine id, so the order does not depend on the order items are given in.
pub fn order<'a, T>(key: &str, items: &'a [T], id: impl Fn(&T) -> &EngineId) -> Vec<&'a T> {
    let hash = key_hash(key);
    let mut weighted: Vec<(u64, &T)> = items.iter().map(|t| (mix(hash, seed(id(t))), t)).collect();
    weighted.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| id(a.1).cmp(id(b.1))));
    weighted.into_iter().map(|(_, t)| t).collect()
}

/// The first of [`order`], in one pass without sorting, given each item's [`seed`]
/// (which must be the seed of its id); `None` for no items.
pub fn first<'a, T>(
    key: &str,
    items: &'a [T],
    seed_of: impl Fn(&T) -> u64,
    id: impl Fn(&T) -> &EngineId,
) -> Option<&'a T> {
    let hash = key_hash(key);
    let (mut best, rest) = items.split_first()?;
    let mut most = mix(hash, seed_of(best));
    for item in rest {
        let weight = mix(hash, seed_of(item));
        // Equal weights go to the lower id, as in `order`.
        if weight > most || (weight == most && id(item) < id(best)) {
            (best, most) = (item, weight);
        }
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ids(n: usize) -> Vec<EngineId> {
        (0..n)
            .map(|i| EngineId::from(format!("engine-{i}")))
            .collect()
    }

    /// `weight("session-1", "engine-0")`, computed once.
    const PINNED: u64 = 10_261_849_376_049_072_702;

    #[test]
    fn the_weight_is_a_fixed_function_of_key_and_engine() {
        // Pinned so a change of hash (which would move every session of a fleet
        // whose replicas run different versions) fails here first.
        assert_eq!(
            weight("k", &EngineId::from("A")),
            weight("k", &EngineId::from("A"))
        );
        assert_ne!(
            weight("k", &EngineId::from("A")),
            weight("k", &EngineId::from("B"))
        );
        assert_eq!(weight("session-1", &EngineId::from("engine-0")), PINNED);
    }

    #[test]
    fn keys_spread_over_every_engine() {
        let engines = ids(8);
        let mut counts = [0usize; 8];
        for k in 0..8_000 {
            let first = order(&format!("key-{k}"), &engines, |e| e)[0];
            counts[engines.iter().position(|e| e == first).unwrap()] += 1;
        }
        // 1,000 expected each; a binomial spread stays far inside 700..1300.
        assert!(
            counts.iter().all(|&c| (700..1300).contains(&c)),
            "{counts:?}"
        );
    }

    proptest! {
        #[test]
        fn removing_an_engine_moves_only_its_own_keys(
            n in 2usize..12,
            removed in 0usize..12,
            keys in proptest::collection::vec("[a-z0-9]{1,24}", 1..64),
        ) {
            let engines = ids(n);
            let removed = removed % n;
            let rest: Vec<EngineId> = engines
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != removed)
                .map(|(_, e)| e.clone())
                .collect();
            for key in &keys {
                let before = order(key, &engines, |e| e);
                let after = order(key, &rest, |e| e);
                // The order of the others is unchanged: the removed engine is
                // simply left out.
                let kept: Vec<&EngineId> =
                    before.iter().copied().filter(|e| **e != engines[removed]).collect();
                prop_assert_eq!(&kept, &after);
                if *before[0] != engines[removed] {
                    prop_assert_eq!(before[0], after[0]);
                }
            }
        }

        #[test]
        fn first_is_the_head_of_the_order(
            n in 1usize..40,
            key in "[a-z0-9-]{0,40}",
        ) {
            let engines = ids(n);
            let head = first(&key, &engines, seed, |e| e);
            prop_assert_eq!(head, Some(order(&key, &engines, |e| e)[0]));
        }

        #[test]
        fn first_breaks_equal_weights_by_the_lower_id_in_any_lane(
            seeds in proptest::collection::vec(0u64..3, 1..40),
            rotate in 0usize..40,
            key in "[a-z]{0,8}",
        ) {
            // Three seeds among up to 40 engines: many equal weights, in every lane.
            let mut engines: Vec<(EngineId, u64)> = ids(seeds.len()).into_iter().zip(seeds).collect();
            let len = engines.len();
            engines.rotate_left(rotate % len);
            let hash = key_hash(&key);
            let expected = engines
                .iter()
                .max_by(|a, b| mix(hash, a.1).cmp(&mix(hash, b.1)).then_with(|| b.0.cmp(&a.0)));
            prop_assert_eq!(first(&key, &engines, |e| e.1, |e| &e.0), expected);
        }

        #[test]
        fn the_order_does_not_depend_on_the_order_engines_are_given(
            n in 1usize..12,
            key in "[a-z0-9]{1,24}",
        ) {
            let engines = ids(n);
            let mut reversed = engines.clone();
            reversed.reverse();
            prop_assert_eq!(order(&key, &engines, |e| e), order(&key, &reversed, |e| e));
        }
    }
}
