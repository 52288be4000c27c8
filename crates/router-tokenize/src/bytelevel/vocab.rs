//! The vocabulary by the bytes of each token, held compactly: every token's bytes one
//! after another in one buffer, and a table of 4-byte entries pointing into it:
//! about 3.5 MiB for Qwen3's 151,643 tokens, where a map of boxed byte strings held
//! about 8 MiB (docs/BENCHMARKS.md, "Tokenizer memory").

use std::hash::BuildHasher;

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct Vocab {
    /// Every token's bytes, one after another.
    bytes: Vec<u8>,
    /// By entry: where its bytes end in `bytes` (they start where the previous
    /// entry's end).
    ends: Vec<u32>,
    /// By entry: its token's id.
    ids: Vec<u32>,
    /// The entries, by a hash of their bytes.
    table: HashTable<u32>,
}

impl Vocab {
    /// An empty vocabulary with room for `tokens` tokens.
    pub(super) fn with_capacity(tokens: usize) -> Self {
        Self {
            bytes: Vec::new(),
            ends: Vec::with_capacity(tokens),
            ids: Vec::with_capacity(tokens),
            table: HashTable::with_capacity(tokens),
        }
    }

    /// The number of tokens.
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Adds `bytes` as the token `id`; `None` when a token has these bytes already or
    /// the vocabulary is past 4 GiB.
    pub(super) fn insert(&mut self, bytes: &[u8], id: u32) -> Option<()> {
        if self.get(bytes).is_some() {
            return None;
        }
        let entry = u32::try_from(self.ids.len()).ok()?;
        self.bytes.extend_from_slice(bytes);
        self.ends.push(u32::try_from(self.bytes.len()).ok()?);
        self.ids.push(id);
        let hash = FxBuildHasher.hash_one(bytes);
        let (ends, all) = (&self.ends, &self.bytes);
        self.table.insert_unique(hash, entry, |&e| {
            FxBuildHasher.hash_one(entry_bytes(ends, all, e))
        });
        Some(())
    }

    /// The id of the token whose bytes are `bytes`.
    pub(super) fn get(&self, bytes: &[u8]) -> Option<u32> {
        let hash = FxBuildHasher.hash_one(bytes);
        self.table
            .find(hash, |&e| entry_bytes(&self.ends, &self.bytes, e) == bytes)
            .map(|&e| self.ids[e as usize])
    }

    /// Every token's bytes and id.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&[u8], u32)> {
        (0..self.ids.len()).map(|e| {
            let entry = e as u32;
            (entry_bytes(&self.ends, &self.bytes, entry), self.ids[e])
        })
    }

    /// Gives back what was reserved and not used.
    pub(super) fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.ends.shrink_to_fit();
        self.ids.shrink_to_fit();
        let (ends, all) = (&self.ends, &self.bytes);
        self.table
            .shrink_to_fit(|&e| FxBuildHasher.hash_one(entry_bytes(ends, all, e)));
    }
}

/// The bytes of entry `e`.
fn entry_bytes<'a>(ends: &[u32], bytes: &'a [u8], e: u32) -> &'a [u8] {
    let e = e as usize;
    let start = if e == 0 { 0 } else { ends[e - 1] as usize };
    &bytes[start..ends[e] as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_found_by_their_bytes_and_a_second_with_the_same_bytes_is_refused() {
        let mut vocab = Vocab::with_capacity(2);
        vocab.insert(b"ab", 7).unwrap();
        vocab.insert(b"", 3).unwrap();
        vocab.insert(b"abc", 9).unwrap();
        assert_eq!(vocab.insert(b"ab", 8), None);
        vocab.shrink_to_fit();
        assert_eq!(
            (vocab.get(b"ab"), vocab.get(b""), vocab.get(b"abc")),
            (Some(7), Some(3), Some(9))
        );
        assert_eq!(vocab.get(b"a"), None);
        assert_eq!(vocab.len(), 3);
        let all: Vec<_> = vocab.iter().collect();
        assert_eq!(all, [(&b"ab"[..], 7), (&b""[..], 3), (&b"abc"[..], 9)]);
    }
}
