//! An exact encoder for byte-level BPE tokenizers (the GPT-2, Qwen and Llama 3
//! shapes), giving the ids `tokenizers` gives for the same `tokenizer.json` at a
//! fraction of its cost: no offsets, alignments or token strings are built, the
//! vocabulary is held by bytes, and ASCII text, which every normalizer covered here
//! leaves unchanged, is never normalized. What it does not cover ([`spec`]) is
//! encoded by `tokenizers` itself.
//!
//! The steps are those of `tokenizers`: split out the added tokens (leftmost, longest
//! first), normalize each stretch between them, cut it into pieces with the
//! pre-tokenizer's regex, and merge each piece's bytes.

mod merges;
mod pieces;
mod spec;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;

use aho_corasick::{AhoCorasick, MatchKind};
use rustc_hash::FxHashMap;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::{NormalizedString, Normalizer};
use unicode_normalization_alignments::IsNormalized;

use merges::Merges;
use pieces::Pieces;
use spec::{Normalization, Split, TokenizerFile};

/// A stretch of text that is not ASCII and not already normalized is normalized in
/// parts of about this size, each ending before an ASCII character (where
/// normalization may be split).
const NORMALIZED_PART: usize = 64 << 10;

/// The longest part normalized at once: text beyond a longer stretch without an
/// ASCII character is left untokenized.
pub(super) const MAX_NORMALIZED_PART: usize = 2 << 20;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct ByteLevelBpe {
    /// The added tokens' texts and ids, matched leftmost-longest.
    added: Option<(AhoCorasick, Vec<u32>)>,
    normalizer: Option<(NormalizerWrapper, Form)>,
    pieces: Pieces,
    /// The vocabulary, by the bytes of each token.
    vocab: FxHashMap<Box<[u8]>, u32>,
    /// By id: whether merging the token's bytes gives the token itself, so a piece
    /// that is such a token needs no merging.
    whole: Vec<bool>,
    /// Each byte's own token.
    byte_ids: [u32; 256],
    merges: Merges,
    /// A piece that is a token is that token, without merging.
    ignore_merges: bool,
}

/// The normal form, for its quick check.
#[derive(Debug, Clone, Copy)]
enum Form {
    Nfc,
    Nfkc,
    Nfd,
    Nfkd,
}

impl Form {
    fn holds(self, text: &str) -> bool {
        use unicode_normalization_alignments as un;
        let quick = match self {
            Form::Nfc => un::is_nfc_quick(text.chars()),
            Form::Nfkc => un::is_nfkc_quick(text.chars()),
            Form::Nfd => un::is_nfd_quick(text.chars()),
            Form::Nfkd => un::is_nfkd_quick(text.chars()),
        };
        quick == IsNormalized::Yes
    }
}

/// Ids, and the bytes at the end of the text left untokenized.
pub(super) type Encoded = (Vec<u32>, usize);

impl ByteLevelBpe {
    /// The encoder for the tokenizer at `path`, or `None` when it is not a byte-level
    /// BPE tokenizer this encoder covers exactly.
    pub(super) fn load(path: &Path) -> Option<Self> {
        let text = std::fs::read(path).ok()?;
        let file: TokenizerFile = serde_json::from_slice(&text).ok()?;
        drop(text);
        if !file.covered() {
            return None;
        }
        let byte_of = byte_of_char();
        let mut vocab = FxHashMap::default();
        vocab.reserve(file.model.vocab.len());
        for (token, &id) in &file.model.vocab {
            if let Some(bytes) = token
                .chars()
                .map(|c| byte_of.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
            {
                vocab.insert(bytes.into_boxed_slice(), id);
            }
        }
        let mut byte_ids = [0; 256];
        for (byte, id) in byte_ids.iter_mut().enumerate() {
            *id = *vocab.get(&[byte as u8][..])?;
        }
        let id_of = |token: &str| file.model.vocab.get(token).copied();
        let mut merges = Merges::default();
        for (rank, merge) in file.model.merges.iter().enumerate() {
            let (left, right) = merge.parts()?;
            let joined = id_of(&format!("{left}{right}"))?;
            merges.insert(
                id_of(left)?,
                id_of(right)?,
                u32::try_from(rank).ok()?,
                joined,
            );
        }
        let mut whole = vec![false; vocab.values().max().map_or(0, |&m| m as usize + 1)];
        let (mut symbols, mut merged) = (Vec::new(), Vec::new());
        for (bytes, &id) in &vocab {
            symbols.clear();
            symbols.extend(bytes.iter().map(|&b| byte_ids[usize::from(b)]));
            merged.clear();
            merges.apply(&mut symbols, &mut merged);
            whole[id as usize] = merged == [id];
        }
        let added = added_matcher(&file)?;
        let normalizer = match file.normalization()? {
            Normalization::None => None,
            Normalization::Unicode => {
                let json = file.normalizer.clone()?;
                let form = match json["type"].as_str()? {
                    "NFC" => Form::Nfc,
                    "NFKC" => Form::Nfkc,
                    "NFD" => Form::Nfd,
                    _ => Form::Nfkd,
                };
                Some((serde_json::from_value(json).ok()?, form))
            }
        };
        let pieces = match file.split()? {
            Split::Whole => Pieces::new(None)?,
            Split::Pattern(p) => Pieces::new(Some(&p))?,
        };
        Some(Self {
            added,
            normalizer,
            pieces,
            vocab,
            whole,
            byte_ids,
            merges,
            ignore_merges: file.model.ignore_merges,
        })
    }

    /// The ids of `text`, exactly as `tokenizers` encodes it without special tokens
    /// added, and the bytes left untokenized at its end (see
    /// [`MAX_NORMALIZED_PART`]).
    ///
    /// # Errors
    /// The pre-tokenizer's regex gave up on this text (its backtracking limit).
    pub(super) fn encode(&self, text: &str) -> Result<Encoded, String> {
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut symbols = Vec::new();
        let mut start = 0;
        let matches = self.added.iter().flat_map(|(matcher, ids)| {
            matcher
                .find_iter(text)
                .map(|m| (m.start(), m.end(), ids[m.pattern().as_usize()]))
        });
        for (from, to, id) in matches {
            if let Some(rest) = self.encode_stretch(&text[start..from], &mut ids, &mut symbols)? {
                return Ok((ids, text.len() - (start + rest)));
            }
            ids.push(id);
            start = to;
        }
        match self.encode_stretch(&text[start..], &mut ids, &mut symbols)? {
            Some(rest) => Ok((ids, text.len() - (start + rest))),
            None => Ok((ids, 0)),
        }
    }

    /// Encodes a stretch between added tokens; `Some(offset)` when the stretch was
    /// left untokenized from `offset` on.
    fn encode_stretch(
        &self,
        stretch: &str,
        ids: &mut Vec<u32>,
        symbols: &mut Vec<u32>,
    ) -> Result<Option<usize>, String> {
        let Some((normalizer, form)) = &self.normalizer else {
            self.encode_normalized(stretch, ids, symbols)?;
            return Ok(None);
        };
        if stretch.is_ascii() || form.holds(stretch) {
            self.encode_normalized(stretch, ids, symbols)?;
            return Ok(None);
        }
        // Normalizing needs about 17 bytes a byte: part by part, each ending before
        // an ASCII character (one that nothing before it composes with).
        let mut normalized = String::with_capacity(stretch.len());
        let mut done = 0;
        while done < stretch.len() {
            let Some(length) = normalization_part(&stretch[done..]) else {
                self.encode_normalized(&normalized, ids, symbols)?;
                return Ok(Some(done));
            };
            let mut part = NormalizedString::from(&stretch[done..done + length]);
            normalizer
                .normalize(&mut part)
                .map_err(|e| format!("normalizing failed: {e}"))?;
            normalized.push_str(part.get());
            done += length;
        }
        self.encode_normalized(&normalized, ids, symbols)?;
        Ok(None)
    }

    fn encode_normalized(
        &self,
        text: &str,
        ids: &mut Vec<u32>,
        symbols: &mut Vec<u32>,
    ) -> Result<(), String> {
        self.pieces.each(text, |piece| {
            self.encode_piece(piece.as_bytes(), ids, symbols)
        })
    }

    fn encode_piece(&self, piece: &[u8], ids: &mut Vec<u32>, symbols: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        if let Some(&id) = self.vocab.get(piece)
            && (self.ignore_merges || self.whole.get(id as usize).is_some_and(|w| *w))
        {
            ids.push(id);
            return;
        }
        symbols.clear();
        symbols.extend(piece.iter().map(|&b| self.byte_ids[usize::from(b)]));
        self.merges.apply(symbols, ids);
    }
}

/// The length of the next part of `rest` to normalize: all of it when short, else up
/// to an ASCII character at least [`NORMALIZED_PART`] bytes in (or the last one
/// within [`MAX_NORMALIZED_PART`]); `None` when there is none within that.
fn normalization_part(rest: &str) -> Option<usize> {
    if rest.len() <= NORMALIZED_PART {
        return Some(rest.len());
    }
    let from = rest.floor_char_boundary(NORMALIZED_PART);
    let limit = rest.floor_char_boundary(MAX_NORMALIZED_PART);
    match rest[from..].find(|c: char| c.is_ascii()) {
        Some(i) if from + i <= limit => Some(from + i),
        _ => rest[..limit]
            .rfind(|c: char| c.is_ascii())
            .filter(|&i| i > 0),
    }
}

/// The added tokens' matcher, `Some(None)` without added tokens, `None` when two
/// share a text.
fn added_matcher(file: &TokenizerFile) -> Option<Option<(AhoCorasick, Vec<u32>)>> {
    let tokens: Vec<_> = file
        .added_tokens
        .iter()
        .filter(|t| !t.content.is_empty())
        .collect();
    if tokens.is_empty() {
        return Some(None);
    }
    let mut texts: Vec<&str> = tokens.iter().map(|t| t.content.as_str()).collect();
    texts.sort_unstable();
    if texts.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    // The ids `tokenizers` gives them (not the ones the file states): a token of the
    // model's vocabulary keeps its id, the others are numbered on from the
    // vocabulary's size, in order.
    let mut next = u32::try_from(file.model.vocab.len()).ok()?;
    let ids = tokens
        .iter()
        .map(|t| match file.model.vocab.get(&t.content) {
            Some(&id) => id,
            None => {
                next += 1;
                next - 1
            }
        })
        .collect();
    let matcher = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(tokens.iter().map(|t| &t.content))
        .ok()?;
    Some(Some((matcher, ids)))
}

/// The byte each character of a byte-level vocabulary stands for: printable
/// characters of Latin-1 stand for their own code, and the other bytes, in order, for
/// the characters from U+0100 on.
fn byte_of_char() -> HashMap<char, u8> {
    let own = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut shifted = 0;
    (0..=255u8)
        .map(|b| {
            let c = if own(b) {
                char::from(b)
            } else {
                shifted += 1;
                char::from_u32(255 + shifted).expect("below U+0200")
            };
            (c, b)
        })
        .collect()
}
