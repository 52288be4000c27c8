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
mod vocab;

use std::path::Path;

use aho_corasick::{AhoCorasick, MatchKind};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::{NormalizedString, Normalizer};
use unicode_normalization_alignments::IsNormalized;

use merges::Merges;
use pieces::Pieces;
use spec::{TokenizerFile, bytes_of};
use vocab::Vocab;

/// A stretch of text that is not ASCII and not already normalized is normalized in
/// parts of about this size, each ending before an ASCII character (where
/// normalization may be split).
const NORMALIZED_PART: usize = 64 << 10;

/// The longest part normalized at once: text beyond a longer stretch without an
/// ASCII character is left untokenized.
const MAX_NORMALIZED_PART: usize = 2 << 20;

/// The longest piece merged: merging holds about 45 bytes a byte of the piece, so the
/// text from a longer piece on (a quarter of a mebibyte of letters, say) is left
/// untokenized.
const MAX_PIECE: usize = 256 << 10;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct ByteLevelBpe {
    /// The added tokens' texts and ids, matched leftmost-longest.
    added: Option<(AhoCorasick, Vec<u32>)>,
    /// The normalizer (`tokenizers`' own) and its form, for text that needs it.
    normalizer: Option<(NormalizerWrapper, Form)>,
    /// How normalized text is cut into pieces.
    pieces: Pieces,
    /// The vocabulary, by the bytes of each token.
    vocab: Vocab,
    /// By id: whether merging the token's bytes gives the token itself, so a piece
    /// that is such a token needs no merging.
    whole: Vec<bool>,
    /// Each byte's own token.
    byte_ids: [u32; 256],
    merges: Merges,
    /// A piece that is a token is that token, without merging.
    ignore_merges: bool,
    /// The special tokens' ids put before and after one sequence when they are added
    /// (a completion's prompt); `None` for a post-processor not understood.
    around: Option<(Vec<u32>, Vec<u32>)>,
}

/// A normal form, for its quick check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    Nfc,
    Nfkc,
    Nfd,
    Nfkd,
}

impl Form {
    /// Whether `text` is certainly in this form (so normalizing leaves it as it is).
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

/// How encoding a text went: every byte, or all but so many at its end.
type Untokenized = usize;

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
        let added = added_matcher(&file)?;
        let normalizer = match file.normalization()? {
            None => None,
            Some(form) => Some((serde_json::from_value(file.normalizer.clone()?).ok()?, form)),
        };
        let pieces = Pieces::new(file.split()?.as_deref())?;
        let around = file.around();
        let ignore_merges = file.model.ignore_merges;
        let (names, listed) = (file.model.vocab, file.model.merges);
        let vocab = names.by_bytes;
        let mut byte_ids = [0; 256];
        for (byte, id) in byte_ids.iter_mut().enumerate() {
            *id = vocab.get(&[byte as u8])?;
        }
        let mut merges = Merges::with_capacity(vocab.len());
        spec::each_merge(&listed, |rank, left, right| {
            if let (Some(mut joined), Some(right_bytes)) = (bytes_of(left), bytes_of(right)) {
                let left_id = vocab.get(&joined)?;
                let right_id = vocab.get(&right_bytes)?;
                joined.extend_from_slice(&right_bytes);
                merges.insert(left_id, right_id, rank, vocab.get(&joined)?);
                return Some(());
            }
            // A rule with a token no bytes stand for never applies, but `tokenizers`
            // refuses one whose tokens are not all in the vocabulary.
            let known = |token: &str| match bytes_of(token) {
                Some(bytes) => vocab.get(&bytes).is_some(),
                None => names.unmapped.contains_key(token),
            };
            (known(left) && known(right) && known(&format!("{left}{right}"))).then_some(())
        })?;
        drop(listed);
        let mut whole = vec![
            false;
            vocab
                .iter()
                .map(|(_, id)| id)
                .max()
                .map_or(0, |m| m as usize + 1)
        ];
        let (mut symbols, mut merged) = (Vec::new(), Vec::new());
        for (bytes, id) in vocab.iter() {
            symbols.clear();
            symbols.extend(bytes.iter().map(|&b| byte_ids[usize::from(b)]));
            merged.clear();
            merges.apply(&mut symbols, &mut merged);
            whole[id as usize] = merged == [id];
        }
        Some(Self {
            added,
            normalizer,
            pieces,
            vocab,
            whole,
            byte_ids,
            merges,
            ignore_merges,
            around,
        })
    }

    /// The ids of `text`, exactly as `tokenizers` encodes it without special tokens
    /// added, and the bytes left untokenized at its end: the rest of a stretch
    /// without a point where normalizing may be split ([`MAX_NORMALIZED_PART`]), or
    /// from a piece too long to merge ([`MAX_PIECE`]) on. (Cut in a stretch that
    /// normalizing changes, the last ids may differ from the whole text's.)
    pub(super) fn encode(&self, text: &str) -> (Vec<u32>, Untokenized) {
        let mut ids = Vec::with_capacity(text.len() / 3);
        let left = self.encode_into(text, &mut ids);
        (ids, left)
    }

    /// The special tokens' ids to put before and after a sequence whose special
    /// tokens are added; `None` for a post-processor not understood.
    pub(super) fn around(&self) -> Option<&(Vec<u32>, Vec<u32>)> {
        self.around.as_ref()
    }

    /// [`encode`](Self::encode), appending the ids to `ids`.
    pub(super) fn encode_into(&self, text: &str, ids: &mut Vec<u32>) -> Untokenized {
        let mut symbols = Vec::new();
        let mut start = 0;
        let matches = self.added.iter().flat_map(|(matcher, ids)| {
            matcher
                .find_iter(text)
                .map(|m| (m.start(), m.end(), ids[m.pattern().as_usize()]))
        });
        for (from, to, id) in matches {
            let left = self.encode_stretch(&text[start..from], ids, &mut symbols);
            if left > 0 {
                return left + (text.len() - from);
            }
            ids.push(id);
            start = to;
        }
        self.encode_stretch(&text[start..], ids, &mut symbols)
    }

    /// Where each added token in `text` ends, in order: the points where the text may
    /// be split, the ids of the part before one followed by those of the part after
    /// it being the ids of the whole.
    pub(super) fn added_ends<'t>(&'t self, text: &'t str) -> impl Iterator<Item = usize> + 't {
        self.added
            .iter()
            .flat_map(move |(matcher, _)| matcher.find_iter(text).map(|m| m.end()))
    }

    /// Encodes a stretch between added tokens; returns the bytes of it left
    /// untokenized.
    fn encode_stretch(
        &self,
        stretch: &str,
        ids: &mut Vec<u32>,
        symbols: &mut Vec<u32>,
    ) -> Untokenized {
        let Some((normalizer, form)) = &self.normalizer else {
            return self.encode_normalized(stretch, ids, symbols);
        };
        if stretch.is_ascii() || form.holds(stretch) {
            return self.encode_normalized(stretch, ids, symbols);
        }
        // Normalizing needs about 17 bytes a byte: part by part, each ending before
        // an ASCII character (one that nothing before it composes with).
        let mut normalized = String::with_capacity(stretch.len());
        let mut done = 0;
        while done < stretch.len() {
            let Some(length) = normalization_part(&stretch[done..]) else {
                break;
            };
            let mut part = NormalizedString::from(&stretch[done..done + length]);
            if normalizer.normalize(&mut part).is_err() {
                break;
            }
            normalized.push_str(part.get());
            done += length;
        }
        self.encode_normalized(&normalized, ids, symbols) + (stretch.len() - done)
    }

    /// Encodes normalized text piece by piece; returns the bytes left untokenized.
    fn encode_normalized(
        &self,
        text: &str,
        ids: &mut Vec<u32>,
        symbols: &mut Vec<u32>,
    ) -> Untokenized {
        let mut merged = 0;
        let stopped = self.pieces.each(text, |piece| {
            if piece.len() > MAX_PIECE {
                return false;
            }
            self.encode_piece(piece.as_bytes(), ids, symbols);
            merged += piece.len();
            true
        });
        if stopped { text.len() - merged } else { 0 }
    }

    /// Appends the ids of one piece.
    fn encode_piece(&self, piece: &[u8], ids: &mut Vec<u32>, symbols: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        if let Some(id) = self.vocab.get(piece)
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
/// share a text or an id (`tokenizers` would keep one of them).
fn added_matcher(file: &TokenizerFile) -> Option<Option<(AhoCorasick, Vec<u32>)>> {
    let tokens: Vec<_> = file
        .added_tokens
        .iter()
        .filter(|t| !t.content.is_empty())
        .collect();
    if tokens.is_empty() {
        return Some(None);
    }
    // The ids `tokenizers` gives them (not the ones the file states): a token of the
    // model's vocabulary keeps its id, the others are numbered on from the
    // vocabulary's size, in order.
    let mut next = u32::try_from(file.model.vocab.len()).ok()?;
    let ids: Vec<u32> = tokens
        .iter()
        .map(|t| match file.model.vocab.get(&t.content) {
            Some(id) => id,
            None => {
                next += 1;
                next - 1
            }
        })
        .collect();
    let mut texts: Vec<&str> = tokens.iter().map(|t| t.content.as_str()).collect();
    texts.sort_unstable();
    texts.dedup();
    let mut sorted_ids = ids.clone();
    sorted_ids.sort_unstable();
    sorted_ids.dedup();
    if texts.len() != tokens.len() || sorted_ids.len() != tokens.len() {
        return None;
    }
    let matcher = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(tokens.iter().map(|t| &t.content))
        .ok()?;
    Some(Some((matcher, ids)))
}

/// The byte each character of a byte-level vocabulary stands for, by the character's
/// code (all below U+0200): printable characters of Latin-1 stand for their own code,
/// and the other bytes, in order, for the characters from U+0100 on.
const BYTE_OF_CHAR: [Option<u8>; 0x200] = {
    const fn own(b: u8) -> bool {
        matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
    }
    let mut table = [None; 0x200];
    let mut shifted = 0;
    let mut b = 0;
    while b <= 255 {
        let code = if own(b as u8) {
            b
        } else {
            shifted += 1;
            255 + shifted
        };
        table[code] = Some(b as u8);
        b += 1;
    }
    table
};
