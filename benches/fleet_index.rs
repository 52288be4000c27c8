//! A prefix index as a large fleet fills it: every source (one engine with one rank,
//! so sources, ranks and candidates are the same count) holds some of sixteen
//! popular system prompts and its own conversations continuing them.

use router_state::EngineId;
use router_state::kv_events::{BlockStored, KvBatch, KvEvent, PrefixIndex, Tier};

/// Tokens per page.
pub(crate) const BLOCK: u32 = 16;
/// Pages of a system prompt (2,048 tokens).
pub(crate) const SYSTEM_PAGES: usize = 128;
/// Pages of a conversation after its system prompt (2,048 tokens).
pub(crate) const TAIL_PAGES: usize = 128;
/// System prompts: prompt `p` is held by every `(p + 1)`-th source (all sources hold
/// prompt 0, 64 of 1,024 hold prompt 15).
pub(crate) const SYSTEMS: usize = 16;

/// The ids of a fleet of `n` engines (`E0000`..): the index and the candidates share
/// them, as the feeds and the registry of a router share each engine's.
pub(crate) fn engines(n: usize) -> Vec<EngineId> {
    (0..n)
        .map(|s| EngineId::from(format!("E{s:04}").as_str()))
        .collect()
}

/// Whether source `s` holds system prompt `p`.
pub(crate) fn holds_system(s: usize, p: usize) -> bool {
    s.is_multiple_of(p + 1)
}

/// The system prompt `s` continues in its conversation `c`: one it holds.
fn system_of(s: usize, c: usize) -> usize {
    (0..SYSTEMS)
        .rev()
        .filter(|&p| holds_system(s, p))
        .nth(
            c % (1
                + (0..SYSTEMS)
                    .filter(|&p| p > 0 && holds_system(s, p))
                    .count()),
        )
        .unwrap_or(0)
}

/// The tokens of system prompt `p`.
pub(crate) fn system_tokens(p: usize) -> Vec<u32> {
    (0..SYSTEM_PAGES * BLOCK as usize)
        .map(|i| (p * 1_000_000 + i) as u32)
        .collect()
}

/// The tokens of source `s`'s conversation `c` after its system prompt: its first
/// page names the source and the conversation, so no two tails share a page.
pub(crate) fn tail_tokens(s: usize, c: usize) -> Vec<u32> {
    (0..TAIL_PAGES * BLOCK as usize)
        .map(|i| match i {
            0 => s as u32,
            1 => c as u32,
            i => i as u32,
        })
        .collect()
}

/// The whole prompt of source `s`'s conversation `c`.
pub(crate) fn conversation(s: usize, c: usize) -> Vec<u32> {
    let mut tokens = system_tokens(system_of(s, c));
    tokens.extend(tail_tokens(s, c));
    tokens
}

fn stored(first: u64, pages: usize, parent: Option<u64>, tokens: Vec<u32>) -> KvBatch {
    KvBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: (first..first + pages as u64).collect(),
            parent,
            tokens,
            block_size: BLOCK,
            tier: Tier::Device,
            namespace: None,
            group_idx: None,
            group_kind: None,
        })],
        dp_rank: Some(0),
        dropped: Vec::new(),
    }
}

/// Fills `index` with the sources `ids` (one engine a source) of about `pages` pages each: the system
/// prompts each holds, then conversations of [`TAIL_PAGES`] continuing them, stored
/// round by round across the fleet (conversation `c` of every source, then `c + 1`),
/// as a fleet serving traffic would. Returns the conversations stored per source.
pub(crate) fn fill(index: &PrefixIndex, ids: &[EngineId], pages: usize) -> usize {
    let sources = ids.len();
    // Engine hashes: the source in the high bits, a counter below.
    let system_hash = |s: usize, p: usize| ((s as u64) << 40) | (p * SYSTEM_PAGES) as u64;
    let mut held = vec![0usize; sources];
    for (s, held) in held.iter_mut().enumerate() {
        for p in (0..SYSTEMS).filter(|&p| holds_system(s, p)) {
            index.apply(
                &ids[s],
                0,
                &stored(system_hash(s, p), SYSTEM_PAGES, None, system_tokens(p)),
            );
            *held += SYSTEM_PAGES;
        }
    }
    let conversations = pages.saturating_sub(held.iter().copied().min().unwrap_or(0)) / TAIL_PAGES;
    for c in 0..conversations {
        for (s, id) in ids.iter().enumerate() {
            let p = system_of(s, c);
            let parent = system_hash(s, p) + SYSTEM_PAGES as u64 - 1;
            let first = ((s as u64) << 40) | (1 << 20) | (c * TAIL_PAGES) as u64;
            index.apply(
                id,
                0,
                &stored(first, TAIL_PAGES, Some(parent), tail_tokens(s, c)),
            );
        }
    }
    conversations
}
