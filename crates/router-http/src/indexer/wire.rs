//! The indexer's lookup exchange: a router sends a prompt's block hashes (its chain,
//! as `PrefixIndex::request_hashes` computes it: the namespace is in the hashes),
//! the indexer answers which engines hold how much of it.

use router_policy::PrefixHits;
use router_state::EngineId;
use serde::{Deserialize, Serialize};

/// The path of a lookup.
pub(crate) const LOOKUP_PATH: &str = "/v1/prefix/lookup";
/// The most block hashes a lookup may carry (a prompt of a million tokens at 16 a
/// block).
pub(crate) const MAX_HASHES: usize = 1 << 16;
/// The largest lookup body the indexer reads: every hash at its longest in JSON.
pub(crate) const MAX_LOOKUP_BYTES: usize = MAX_HASHES * 21 + 4096;
/// The largest answer a router reads.
pub(crate) const MAX_ANSWER_BYTES: usize = 1 << 20;

/// A lookup: the model and its prompt's block hashes.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Lookup<'a> {
    #[serde(borrow)]
    pub(crate) model: std::borrow::Cow<'a, str>,
    pub(crate) hashes: Vec<u64>,
    /// An explanation's lookup: the indexer leaves its recency as it was.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) dry_run: bool,
}

/// What the indexer holds of a lookup's prompt. Fields a router does not know are
/// ignored, so an indexer may be upgraded before its routers.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Answer {
    pub(crate) query_blocks: usize,
    pub(crate) block_size: u32,
    /// Each engine holding a leading block, with how many; sorted by engine id.
    pub(crate) engines: Vec<(String, usize)>,
    /// The rank of each engine's deepest match; sorted by engine id.
    pub(crate) ranks: Vec<(String, u32)>,
    /// Of each engine's blocks, those held only on a slower tier; sorted by engine
    /// id, engines with none left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) slower_blocks: Vec<(String, usize)>,
    /// How far behind each engine's KV feed was, in milliseconds; sorted by engine
    /// id, engines with none left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) feed_age_ms: Vec<(String, u64)>,
}

impl From<PrefixHits> for Answer {
    fn from(hits: PrefixHits) -> Self {
        Self {
            query_blocks: hits.query_blocks,
            block_size: hits.block_size,
            engines: named(hits.engines),
            ranks: named(hits.ranks),
            slower_blocks: named(hits.slower_blocks),
            feed_age_ms: named(hits.feed_age_ms),
        }
    }
}

fn named<T>(list: Vec<(EngineId, T)>) -> Vec<(String, T)> {
    list.into_iter().map(|(e, v)| (e.to_string(), v)).collect()
}

fn ids<T>(list: Vec<(String, T)>) -> Vec<(EngineId, T)> {
    list.into_iter()
        .map(|(e, v)| (EngineId::from(e), v))
        .collect()
}

impl Answer {
    /// The hits it names, when they are consistent: sorted unique engine ids that
    /// are names, no engine holding more blocks than the prompt has, a rank only for
    /// an engine holding blocks.
    pub(crate) fn into_hits(self) -> Result<PrefixHits, &'static str> {
        let sorted = |ids: &mut dyn Iterator<Item = &String>| {
            let ids: Vec<&String> = ids.collect();
            ids.windows(2).all(|w| w[0] < w[1])
                && ids.iter().all(|id| router_state::check_name(id).is_ok())
        };
        if !sorted(&mut self.engines.iter().map(|(e, _)| e))
            || !sorted(&mut self.ranks.iter().map(|(e, _)| e))
            || !sorted(&mut self.slower_blocks.iter().map(|(e, _)| e))
            || !sorted(&mut self.feed_age_ms.iter().map(|(e, _)| e))
        {
            return Err("engine ids that are not sorted, unique names");
        }
        let held = |engine: &String| {
            self.engines
                .binary_search_by(|(e, _)| e.cmp(engine))
                .map_or(0, |i| self.engines[i].1)
        };
        if self
            .slower_blocks
            .iter()
            .any(|(engine, slower)| *slower > held(engine))
        {
            return Err("an engine holding more blocks on slower tiers than in all");
        }
        if self
            .engines
            .iter()
            .any(|(_, blocks)| *blocks > self.query_blocks)
        {
            return Err("an engine holding more blocks than the prompt has");
        }
        Ok(PrefixHits {
            query_blocks: self.query_blocks,
            block_size: self.block_size,
            engines: ids(self.engines),
            ranks: ids(self.ranks),
            slower_blocks: ids(self.slower_blocks),
            feed_age_ms: ids(self.feed_age_ms),
        })
    }
}

#[cfg(test)]
mod tests;
