//! The router's own content hash of KV pages.
//!
//! Engine hashes are not portable (seeds, algorithms and pickling differ per engine
//! and per restart), so the index is keyed by a chain hash the router computes from
//! token ids: page `i` hashes its tokens (little-endian `u32`) with xxh3, seeded by the
//! chain hash of page `i - 1`; the first page is seeded by the namespace (LoRA adapter
//! or cache salt; 0 for none). Requests and engine events are hashed the same way, so
//! equal prefixes meet at equal hashes whichever engine published them.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The seed of a chain in `namespace`.
pub fn namespace_seed(namespace: Option<&str>) -> u64 {
    namespace.map_or(0, |n| xxh3_64(n.as_bytes()))
}

/// The cache namespace of pages stored for a LoRA adapter and a cache salt: the
/// adapter's name, or with a salt the two together (what a request with both is
/// looked up in; `None`: the base model's, unsalted).
pub fn cache_namespace(lora: Option<&str>, salt: Option<&str>) -> Option<String> {
    match (lora, salt) {
        (None, None) => None,
        (Some(lora), None) => Some(lora.to_owned()),
        (lora, Some(salt)) => Some(format!("{}\u{1}salt:{salt}", lora.unwrap_or_default())),
    }
}

/// Chain hashes of every full page of `tokens`, continuing from `seed`.
pub fn chain_hashes(tokens: &[u32], block_size: usize, seed: u64) -> Vec<u64> {
    let mut hashes = Vec::with_capacity(tokens.len() / block_size.max(1));
    extend_chain(&mut hashes, tokens, block_size, seed);
    hashes
}

/// Appends the chain hashes of `tokens`' full pages to `out`.
pub(crate) fn extend_chain(out: &mut Vec<u64>, tokens: &[u32], block_size: usize, seed: u64) {
    if block_size == 0 {
        return;
    }
    let full = tokens.len() - tokens.len() % block_size;
    let bytes: Vec<u8> = tokens[..full]
        .iter()
        .flat_map(|token| token.to_le_bytes())
        .collect();
    let mut previous = seed;
    for page in bytes.chunks_exact(block_size * 4) {
        previous = xxh3_64_with_seed(page, previous);
        out.push(previous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_depends_on_every_earlier_page_and_the_namespace() {
        let tokens: Vec<u32> = (0..48).collect();
        let chain = chain_hashes(&tokens, 16, 0);
        assert_eq!(chain.len(), 3);
        assert_eq!(
            chain_hashes(&tokens[..40], 16, 0),
            chain[..2],
            "partial pages are not hashed"
        );
        assert_eq!(
            chain_hashes(&tokens[16..32], 16, chain[0]),
            chain[1..2],
            "a chain continues from a parent"
        );
        let mut other = tokens.clone();
        other[0] = 999;
        assert_ne!(
            chain_hashes(&other, 16, 0)[2],
            chain[2],
            "a different first page changes every later hash"
        );
        assert_ne!(
            chain_hashes(&tokens, 16, namespace_seed(Some("lora-a")))[0],
            chain[0]
        );
        assert_eq!(namespace_seed(None), 0);
    }
}
