//! The indexer's lookup exchange: a router sends a prompt's block hashes (its chain,
//! as `PrefixIndex::request_hashes` computes it: the namespace is in the hashes),
//! the indexer answers which engines hold how much of it.
//!
//! A lookup comes in one of two encodings, told apart by its `Content-Type`:
//! [`BINARY_LOOKUP`] (what routers send: the hashes as they are, 8 bytes each) or
//! anything else, read as JSON (`{"model", "hashes", "dry_run"}`, what routers of
//! earlier versions send and what a person types). The answer is JSON either way: it
//! is small (a few figures an engine holding blocks), and fields a router does not
//! know are ignored.

use std::borrow::Cow;

use router_policy::PrefixHits;
use router_state::{EngineId, MAX_NAME_BYTES};
use serde::{Deserialize, Serialize};

/// The path of a lookup.
pub(crate) const LOOKUP_PATH: &str = "/v1/prefix/lookup";
/// The media type of a lookup in binary (see [`Lookup::to_binary`]).
pub(crate) const BINARY_LOOKUP: &str = "application/vnd.switchyard.prefix-lookup";
/// The most block hashes a lookup may carry (a prompt of a million tokens at 16 a
/// block).
pub(crate) const MAX_HASHES: usize = 1 << 16;
/// The largest JSON lookup body the indexer reads: every hash at its longest.
pub(crate) const MAX_JSON_LOOKUP_BYTES: usize = MAX_HASHES * 21 + 4096;
/// The largest binary lookup body the indexer reads: its header, the longest model
/// name and every hash.
pub(crate) const MAX_BINARY_LOOKUP_BYTES: usize = HEADER_BYTES + MAX_NAME_BYTES + 8 * MAX_HASHES;
/// The largest answer a router reads.
pub(crate) const MAX_ANSWER_BYTES: usize = 1 << 20;

/// A binary lookup's flags byte and its model name's length byte.
const HEADER_BYTES: usize = 2;
/// The flag of a dry run, in a binary lookup's flags byte; the other bits are 0.
const DRY_RUN: u8 = 1;

/// A lookup: the model and its prompt's block hashes.
#[derive(Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Lookup<'a> {
    #[serde(borrow)]
    pub(crate) model: Cow<'a, str>,
    pub(crate) hashes: Vec<u64>,
    /// An explanation's lookup: the indexer leaves its recency as it was.
    #[serde(default)]
    pub(crate) dry_run: bool,
}

impl<'a> Lookup<'a> {
    /// The lookup as a [`BINARY_LOOKUP`] body: one byte of flags (bit 0: a dry run,
    /// the others 0), one byte with the length of the model's name (1 to 128), the
    /// name, then every hash as 8 bytes, little-endian.
    ///
    /// # Errors
    /// The model's name is not 1 to [`MAX_NAME_BYTES`] bytes long.
    pub(crate) fn to_binary(&self) -> Result<Vec<u8>, &'static str> {
        let name = self.model.as_bytes();
        let length = u8::try_from(name.len())
            .ok()
            .filter(|n| (1..=MAX_NAME_BYTES).contains(&usize::from(*n)))
            .ok_or("a model name of 1 to 128 bytes is required")?;
        let mut body = Vec::with_capacity(HEADER_BYTES + name.len() + 8 * self.hashes.len());
        body.push(if self.dry_run { DRY_RUN } else { 0 });
        body.push(length);
        body.extend_from_slice(name);
        for hash in &self.hashes {
            body.extend_from_slice(&hash.to_le_bytes());
        }
        Ok(body)
    }

    /// The lookup a [`BINARY_LOOKUP`] body holds (see [`to_binary`](Self::to_binary)),
    /// borrowing its model name; at most [`MAX_HASHES`] hashes.
    ///
    /// # Errors
    /// What does not fit the encoding.
    pub(crate) fn from_binary(body: &'a [u8]) -> Result<Self, &'static str> {
        let [flags, length, rest @ ..] = body else {
            return Err("shorter than its 2-byte header");
        };
        if flags & !DRY_RUN != 0 {
            return Err("flags other than bit 0 (a dry run) are set");
        }
        let length = usize::from(*length);
        if !(1..=MAX_NAME_BYTES).contains(&length) {
            return Err("a model name of 1 to 128 bytes is required");
        }
        let (name, hashes) = rest
            .split_at_checked(length)
            .ok_or("the model name runs past the body")?;
        let model = std::str::from_utf8(name).map_err(|_| "a model name that is not UTF-8")?;
        let (words, partial) = hashes.as_chunks::<8>();
        if !partial.is_empty() {
            return Err("the hashes are not whole 8-byte words");
        }
        if words.len() > MAX_HASHES {
            return Err("more block hashes than a lookup may carry (65,536)");
        }
        let hashes = words.iter().map(|word| u64::from_le_bytes(*word)).collect();
        Ok(Self {
            model: Cow::Borrowed(model),
            hashes,
            dry_run: flags & DRY_RUN != 0,
        })
    }
}

/// The JSON answer to a lookup, written from `hits` as it is (its engine ids
/// borrowed, no intermediate lists): what [`Answer`] reads.
///
/// # Errors
/// None in practice (integers and strings written into memory), but serde's
/// signature allows one.
pub(crate) fn answer_json(hits: &PrefixHits) -> serde_json::Result<Vec<u8>> {
    let answer = AnswerOf {
        query_blocks: hits.query_blocks(),
        block_size: hits.block_size(),
        engines: Named(hits.engines()),
        ranks: Named(hits.ranks()),
        slower_blocks: Named(hits.slower_blocks()),
        feed_age_ms: Named(hits.feed_age_ms()),
    };
    // A few dozen bytes a listed engine, beyond the figures of the prompt.
    let mut json = Vec::with_capacity(64 + 96 * hits.engines().len());
    serde_json::to_writer(&mut json, &answer)?;
    Ok(json)
}

/// The fields of an [`Answer`], borrowed from the hits.
#[derive(Serialize)]
struct AnswerOf<'a> {
    query_blocks: usize,
    block_size: u32,
    engines: Named<'a, usize>,
    ranks: Named<'a, u32>,
    #[serde(skip_serializing_if = "Named::is_empty")]
    slower_blocks: Named<'a, usize>,
    #[serde(skip_serializing_if = "Named::is_empty")]
    feed_age_ms: Named<'a, u64>,
}

/// A list of engines' figures, written as `[[id, figure], ...]`.
struct Named<'a, T>(&'a [(EngineId, T)]);

impl<T> Named<'_, T> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T: Serialize> Serialize for Named<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|(engine, n)| (engine.as_str(), n)))
    }
}

/// What the indexer holds of a lookup's prompt, as a router reads it. Fields a
/// router does not know are ignored, so an indexer may be upgraded before its
/// routers.
#[derive(Debug, Deserialize)]
pub(crate) struct Answer {
    pub(crate) query_blocks: usize,
    pub(crate) block_size: u32,
    /// Each engine holding a leading block, with how many; sorted by engine id.
    pub(crate) engines: Vec<(String, usize)>,
    /// The rank of each engine's deepest match; sorted by engine id.
    pub(crate) ranks: Vec<(String, u32)>,
    /// Of each engine's blocks, those held only on a slower tier; sorted by engine
    /// id, engines with none left out.
    #[serde(default)]
    pub(crate) slower_blocks: Vec<(String, usize)>,
    /// How far behind each engine's KV feed was, in milliseconds; sorted by engine
    /// id, engines with none left out.
    #[serde(default)]
    pub(crate) feed_age_ms: Vec<(String, u64)>,
}

fn ids<T>(list: Vec<(String, T)>) -> Vec<(EngineId, T)> {
    list.into_iter()
        .map(|(e, v)| (EngineId::from(e), v))
        .collect()
}
impl Answer {
    /// The hits it names, when they are consistent: a prompt of no more blocks than a
    /// lookup sends, sorted unique engine ids that are names, no engine holding more
    /// blocks than the prompt has, a rank only for an engine holding blocks.
    pub(crate) fn into_hits(self) -> Result<PrefixHits, &'static str> {
        if self.query_blocks > MAX_HASHES {
            return Err("a prompt of more blocks than a lookup sends");
        }
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
        Ok(
            PrefixHits::new(self.query_blocks, self.block_size, ids(self.engines))
                .with_ranks(ids(self.ranks))
                .with_slower_blocks(ids(self.slower_blocks))
                .with_feed_age_ms(ids(self.feed_age_ms)),
        )
    }
}

#[cfg(test)]
mod tests;
