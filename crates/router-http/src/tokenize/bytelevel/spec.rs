//! The parts of a `tokenizer.json` the byte-level encoder reads, and whether it covers
//! them: a BPE model with merges and nothing that changes how they apply, every added
//! token matched as written, no normalizer or one that leaves ASCII unchanged, and a
//! byte-level pre-tokenizer that adds no prefix space (alone, or after one regex split
//! that isolates its matches).

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

/// The regex the byte-level pre-tokenizer splits with when `use_regex` is on (GPT-2's).
pub(super) const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

#[derive(Debug, Deserialize)]
pub(super) struct TokenizerFile {
    #[serde(default)]
    pub(super) added_tokens: Vec<AddedToken>,
    #[serde(default)]
    pub(super) normalizer: Option<Value>,
    #[serde(default)]
    pub(super) pre_tokenizer: Option<Value>,
    pub(super) model: Model,
}

#[derive(Debug, Deserialize)]
pub(super) struct AddedToken {
    pub(super) content: String,
    #[serde(default)]
    single_word: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default)]
    normalized: bool,
}

#[derive(Debug, Deserialize)]
pub(super) struct Model {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    dropout: Option<f64>,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
    #[serde(default)]
    end_of_word_suffix: Option<String>,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    pub(super) ignore_merges: bool,
    pub(super) vocab: HashMap<String, u32>,
    pub(super) merges: Vec<Merge>,
}

/// A merge, in either of the forms `tokenizer.json` has had: `"a b"` or `["a", "b"]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Merge {
    Joined(String),
    Pair(String, String),
}

impl Merge {
    pub(super) fn parts(&self) -> Option<(&str, &str)> {
        match self {
            Merge::Joined(joined) => joined.split_once(' '),
            Merge::Pair(left, right) => Some((left, right)),
        }
    }
}

/// How the normalized text is cut into the pieces BPE runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Split {
    /// The whole text is one piece.
    Whole,
    /// Every match of the regex is a piece, and so is every stretch between matches.
    Pattern(String),
}

/// The normalizers that leave ASCII text as it is (so ASCII needs no normalizing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Normalization {
    None,
    Unicode,
}

impl TokenizerFile {
    /// Whether the byte-level encoder covers this tokenizer exactly.
    pub(super) fn covered(&self) -> bool {
        let model = &self.model;
        let empty = |affix: &Option<String>| affix.as_deref().is_none_or(str::is_empty);
        model.kind == "BPE"
            && model.dropout.is_none_or(|d| d == 0.0)
            && empty(&model.continuing_subword_prefix)
            && empty(&model.end_of_word_suffix)
            && !model.byte_fallback
            && self
                .added_tokens
                .iter()
                .all(|t| !(t.single_word || t.lstrip || t.rstrip || t.normalized))
            && self.normalization().is_some()
            && self.split().is_some()
    }

    pub(super) fn normalization(&self) -> Option<Normalization> {
        match &self.normalizer {
            None | Some(Value::Null) => Some(Normalization::None),
            Some(n) => matches!(n["type"].as_str(), Some("NFC" | "NFKC" | "NFD" | "NFKD"))
                .then_some(Normalization::Unicode),
        }
    }

    pub(super) fn split(&self) -> Option<Split> {
        let byte_level = |p: &Value| p["type"] == "ByteLevel" && p["add_prefix_space"] == false;
        let pre = self.pre_tokenizer.as_ref()?;
        if byte_level(pre) {
            return Some(if pre["use_regex"] == false {
                Split::Whole
            } else {
                Split::Pattern(GPT2_PATTERN.to_owned())
            });
        }
        if pre["type"] != "Sequence" {
            return None;
        }
        let [split, last] = pre["pretokenizers"].as_array()?.as_slice() else {
            return None;
        };
        let isolating =
            split["type"] == "Split" && split["behavior"] == "Isolated" && split["invert"] == false;
        if !(isolating && byte_level(last) && last["use_regex"] == false) {
            return None;
        }
        split["pattern"]["Regex"]
            .as_str()
            .map(|p| Split::Pattern(p.to_owned()))
    }
}
