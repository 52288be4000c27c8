//! The parts of a `tokenizer.json` the byte-level encoder reads, and whether it covers
//! them: a BPE model with merges and nothing that changes how they apply, every added
//! token matched as written, no normalizer or one that leaves ASCII unchanged, and a
//! byte-level pre-tokenizer that adds no prefix space (alone, or after one regex split
//! that isolates its matches). The special tokens a post-processor adds around a
//! sequence (for a completion's prompt) are read from ByteLevel, TemplateProcessing,
//! Roberta and Bert processors and sequences of them; another leaves them unknown. A file `tokenizers` would refuse to load is not covered
//! either: its fields are read as strictly, and the parts the encoder does not use are
//! read with `tokenizers`' own types.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use super::vocab::Vocab;
use super::{BYTE_OF_CHAR, Form};

/// The regex the byte-level pre-tokenizer splits with when `use_regex` is on (GPT-2's).
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// A `tokenizer.json`, as far as the encoder reads it.
#[derive(Debug, Deserialize)]
pub(super) struct TokenizerFile {
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    pub(super) added_tokens: Vec<AddedToken>,
    #[serde(default)]
    pub(super) normalizer: Option<Value>,
    #[serde(default)]
    pub(super) pre_tokenizer: Option<Value>,
    #[serde(default)]
    post_processor: Option<Value>,
    #[serde(default)]
    decoder: Option<Value>,
    #[serde(default)]
    truncation: Option<Value>,
    #[serde(default)]
    padding: Option<Value>,
    pub(super) model: Model,
}

/// An added token; every field is required, as `tokenizers` requires it.
#[derive(Debug, Deserialize)]
pub(super) struct AddedToken {
    #[serde(rename = "id")]
    _id: u32,
    pub(super) content: String,
    single_word: bool,
    lstrip: bool,
    rstrip: bool,
    normalized: bool,
    #[serde(rename = "special")]
    _special: bool,
}

/// The model section of a BPE tokenizer.
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
    pub(super) vocab: Names,
    /// Read by [`each_merge`], a merge at a time.
    pub(super) merges: Box<RawValue>,
}

/// The vocabulary as `tokenizer.json` names it, read into the encoder's form as it is
/// read: each token by the bytes its characters stand for, and the few names no bytes
/// stand for apart (they can never be a piece's symbol, but merges and added tokens
/// may name them).
#[derive(Debug, Default)]
pub(super) struct Names {
    pub(super) by_bytes: Vocab,
    pub(super) unmapped: HashMap<String, u32>,
    /// Whether no two tokens share an id or a name (the encoder skips merges of
    /// tokens no bytes stand for, exact only when no such token shares its id with
    /// one it encodes; a name given twice is left to `tokenizers`).
    pub(super) unique: bool,
}

impl Names {
    /// The number of tokens.
    pub(super) fn len(&self) -> usize {
        self.by_bytes.len() + self.unmapped.len()
    }

    /// The id of the token named `name`.
    pub(super) fn get(&self, name: &str) -> Option<u32> {
        match bytes_of(name) {
            Some(bytes) => self.by_bytes.get(&bytes),
            None => self.unmapped.get(name).copied(),
        }
    }
}

/// The bytes a byte-level token's name stands for; `None` when a character stands
/// for no byte.
pub(super) fn bytes_of(name: &str) -> Option<Vec<u8>> {
    name.chars()
        .map(|c| *BYTE_OF_CHAR.get(c as usize)?)
        .collect()
}

impl<'de> Deserialize<'de> for Names {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Reader;

        impl<'de> Visitor<'de> for Reader {
            type Value = Names;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of token names to ids")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Names, A::Error> {
                let mut names = Names {
                    by_bytes: Vocab::with_capacity(map.size_hint().unwrap_or(0)),
                    unique: true,
                    ..Names::default()
                };
                let mut ids = HashSet::new();
                let mut bytes = Vec::new();
                while let Some((name, id)) = map.next_entry::<Cow<'_, str>, u32>()? {
                    names.unique &= ids.insert(id);
                    bytes.clear();
                    let mapped = name.chars().try_for_each(|c| {
                        bytes.push((*BYTE_OF_CHAR.get(c as usize)?)?);
                        Some(())
                    });
                    let added = match mapped {
                        Some(()) => names.by_bytes.insert(&bytes, id).is_some(),
                        None => names.unmapped.insert(name.into_owned(), id).is_none(),
                    };
                    names.unique &= added;
                }
                names.by_bytes.shrink_to_fit();
                Ok(names)
            }
        }

        deserializer.deserialize_map(Reader)
    }
}

/// One merge, in either of the forms `tokenizer.json` has had: `["a", "b"]` or
/// `"a b"`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Merge<'a> {
    Pair(#[serde(borrow)] Cow<'a, str>, #[serde(borrow)] Cow<'a, str>),
    Line(#[serde(borrow)] Cow<'a, str>),
}

/// Reads `merges` (the list as written) a merge at a time, in rank order, calling
/// `each(rank, left, right)`, so the list is never held whole; `#version` lines are
/// skipped, as `tokenizers` skips them. `None` when the list is not one `tokenizers`
/// loads (not a list, a line not of two parts, the two forms mixed) or when `each`
/// says `None`.
pub(super) fn each_merge(
    merges: &RawValue,
    each: impl FnMut(u32, &str, &str) -> Option<()>,
) -> Option<()> {
    struct Reader<F>(F);

    impl<'de, F: FnMut(u32, &str, &str) -> Option<()>> Visitor<'de> for Reader<F> {
        type Value = Option<()>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of merges")
        }

        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Option<()>, A::Error> {
            let mut pairs = None;
            let mut rank = 0;
            while let Some(merge) = seq.next_element::<Merge<'_>>()? {
                let pair = matches!(merge, Merge::Pair(..));
                if *pairs.get_or_insert(pair) != pair {
                    return Ok(None);
                }
                let (left, right) = match &merge {
                    Merge::Pair(left, right) => (&**left, &**right),
                    Merge::Line(line) if line.starts_with("#version") => continue,
                    Merge::Line(line) => match line.split_once(' ') {
                        Some((left, right)) if !right.contains(' ') => (left, right),
                        _ => return Ok(None),
                    },
                };
                if (self.0)(rank, left, right).is_none() {
                    return Ok(None);
                }
                rank += 1;
            }
            Ok(Some(()))
        }
    }

    let mut reader = serde_json::Deserializer::from_str(merges.get());
    reader.deserialize_seq(Reader(each)).ok().flatten()
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
            && self.version.as_deref().is_none_or(|v| v == "1.0")
            && self.unique_ids()
            && self.loads_in_tokenizers()
            && self.normalization().is_some()
            && self.split().is_some()
    }

    /// Whether no two tokens of the vocabulary share an id or a name ([`Names`]).
    fn unique_ids(&self) -> bool {
        self.model.vocab.unique
    }

    /// Whether the parts the encoder does not use would load in `tokenizers`.
    fn loads_in_tokenizers(&self) -> bool {
        fn loads<T: serde::de::DeserializeOwned>(part: &Option<Value>) -> bool {
            part.as_ref()
                .is_none_or(|v| v.is_null() || serde_json::from_value::<T>(v.clone()).is_ok())
        }
        loads::<tokenizers::NormalizerWrapper>(&self.normalizer)
            && loads::<tokenizers::PreTokenizerWrapper>(&self.pre_tokenizer)
            && loads::<tokenizers::PostProcessorWrapper>(&self.post_processor)
            && loads::<tokenizers::DecoderWrapper>(&self.decoder)
            && loads::<tokenizers::TruncationParams>(&self.truncation)
            && loads::<tokenizers::PaddingParams>(&self.padding)
    }

    /// The normal form, `Some(None)` for none, `None` for a normalizer that may
    /// change ASCII text (not covered).
    pub(super) fn normalization(&self) -> Option<Option<Form>> {
        match &self.normalizer {
            None | Some(Value::Null) => Some(None),
            Some(n) => match n["type"].as_str()? {
                "NFC" => Some(Some(Form::Nfc)),
                "NFKC" => Some(Some(Form::Nfkc)),
                "NFD" => Some(Some(Form::Nfd)),
                "NFKD" => Some(Some(Form::Nfkd)),
                _ => None,
            },
        }
    }

    /// The special tokens' ids the post-processor puts before and after one
    /// sequence (for `add_special_tokens`); `None` for a post-processor not covered.
    pub(super) fn around(&self) -> Option<(Vec<u32>, Vec<u32>)> {
        fn of(processor: &Value) -> Option<(Vec<u32>, Vec<u32>)> {
            match processor["type"].as_str() {
                _ if processor.is_null() => Some((Vec::new(), Vec::new())),
                Some("ByteLevel") => Some((Vec::new(), Vec::new())),
                Some("Sequence") => {
                    // Each processor wraps what the ones before it made.
                    let mut around = (Vec::new(), Vec::new());
                    for inner in processor["processors"].as_array()? {
                        let (mut before, after) = of(inner)?;
                        before.append(&mut around.0);
                        around.0 = before;
                        around.1.extend(after);
                    }
                    Some(around)
                }
                Some("RobertaProcessing" | "BertProcessing") => {
                    let id = |field: &str| u32::try_from(processor[field][1].as_u64()?).ok();
                    Some((vec![id("cls")?], vec![id("sep")?]))
                }
                Some("TemplateProcessing") => {
                    let (mut before, mut after) = (Vec::new(), Vec::new());
                    let mut seen = false;
                    for piece in processor["single"].as_array()? {
                        if piece.get("Sequence").is_some() {
                            if seen {
                                return None;
                            }
                            seen = true;
                            continue;
                        }
                        let name = piece["SpecialToken"]["id"].as_str()?;
                        let ids = processor["special_tokens"][name]["ids"].as_array()?;
                        let ids = ids
                            .iter()
                            .map(|id| u32::try_from(id.as_u64()?).ok())
                            .collect::<Option<Vec<u32>>>()?;
                        if seen { &mut after } else { &mut before }.extend(ids);
                    }
                    seen.then_some((before, after))
                }
                _ => None,
            }
        }
        of(self.post_processor.as_ref().unwrap_or(&Value::Null))
    }

    /// The pre-tokenizer's split pattern, `Some(None)` when the whole text is one
    /// piece, `None` for a pre-tokenizer not covered.
    pub(super) fn split(&self) -> Option<Option<String>> {
        let byte_level = |p: &Value| p["type"] == "ByteLevel" && p["add_prefix_space"] == false;
        let pre = self.pre_tokenizer.as_ref()?;
        if byte_level(pre) {
            return Some((pre["use_regex"] != false).then(|| GPT2_PATTERN.to_owned()));
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
            .map(|p| Some(p.to_owned()))
    }
}
