//! Data-parallel ranks: which rank of an engine a leg goes to, and how it is named.
//! A cache-aware pick names the rank holding the prompt's prefix; otherwise the
//! engine's least-loaded rank is taken (fresh reports and this router's requests in
//! flight per rank). The rank is named the ways the engines read it: SGLang's
//! `data_parallel_rank` body field (every release that routes on a rank reads it) and
//! the `x-data-parallel-rank` header (vLLM's, and newer SGLang's, which prefers it).
//! A PD prefill on several ranks finds its rank from the bootstrap room (SGLang's
//! `follow_bootstrap_room`), so the room is chosen congruent to the named rank.

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use router_policy::Pick;
use router_state::InflightGuard;

use super::leg::with_fields;
use crate::app::AppContext;

// A room stays below 2^63 only while ranks fit in 11 bits (see `room`).
const _: () = assert!(router_state::MAX_DP_SIZE <= 1 << 11);

/// The header naming the rank.
pub(super) const RANK: HeaderName = HeaderName::from_static("x-data-parallel-rank");

/// The rank a leg to `pick`'s engine goes to; `None` for an engine of one rank.
pub(super) fn rank(ctx: &AppContext, pick: &Pick) -> Option<u32> {
    let ranks = pick.engine.dp_size().get();
    if ranks <= 1 {
        return None;
    }
    pick.rank
        .filter(|rank| *rank < ranks)
        .or_else(|| ctx.fleet.load().least_loaded_rank(pick.engine.id()))
}

/// Counts a leg in flight to `pick`'s engine (and its rank) until the guard drops:
/// the slot admission reserved, or a new count.
pub(super) fn guard(ctx: &AppContext, pick: &mut Pick, rank: Option<u32>) -> InflightGuard {
    pick.guard(ctx.fleet.load(), rank)
}

/// The body naming `rank` (unchanged without one).
pub(super) fn with_rank(body: &Bytes, rank: Option<u32>) -> Bytes {
    match rank {
        Some(rank) => with_fields(body, &format!(r#""data_parallel_rank":{rank}"#)),
        None => body.clone(),
    }
}

/// The header naming `rank`, when there is one.
pub(super) fn rank_header(rank: Option<u32>) -> Option<(HeaderName, HeaderValue)> {
    rank.map(|rank| (RANK, HeaderValue::from(rank)))
}

/// A bootstrap room from `random` (in `[0, 2^63)`) that a prefill engine of
/// `ranks` ranks sends to `rank`: congruent to it, still in `[0, 2^63)`.
pub(super) fn room(random: u64, rank: Option<u32>, ranks: u32) -> u64 {
    match rank {
        Some(rank) if ranks > 1 => (random >> 11) * u64::from(ranks) + u64::from(rank % ranks),
        _ => random,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_room_follows_the_prefill_rank_and_stays_in_range() {
        for random in [0, 1, 12_345, (1 << 63) - 1] {
            for (rank, ranks) in [(0, 2), (1, 2), (5, 8), (1023, 1024)] {
                let room = room(random, Some(rank), ranks);
                assert_eq!(room % u64::from(ranks), u64::from(rank));
                assert!(room < 1 << 63);
            }
            assert_eq!(room(random, None, 4), random);
            assert_eq!(room(random, Some(0), 1), random);
        }
    }

    #[test]
    fn the_body_names_the_rank() {
        let body = Bytes::from_static(br#"{"model":"m"}"#);
        assert_eq!(
            with_rank(&body, Some(3)),
            Bytes::from_static(br#"{"model":"m","data_parallel_rank":3}"#)
        );
        assert_eq!(with_rank(&body, None), body);
    }
}
