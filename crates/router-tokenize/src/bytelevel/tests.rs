//! The byte-level encoder against `tokenizers` itself: the same ids for every text,
//! generated (words, contractions, numbers, every kind of whitespace, scripts, text
//! that normalizing changes, emoji, added tokens whole and cut) and from a corpus, on
//! every byte-level tokenizer the tests have.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

use crate::python_env;

/// A byte-level tokenizer the encoder covers, and `tokenizers`' own for it.
struct Pair {
    name: &'static str,
    fast: ByteLevelBpe,
    reference: tokenizers::Tokenizer,
}

fn testdata(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(relative)
}

fn qwen3_path() -> PathBuf {
    python_env::ensure().join("qwen3/tokenizer.json")
}

/// Writes `json` as a tokenizer file of its own and returns its path.
fn written(name: &str, json: &Value) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("switchyard-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

/// A byte-level BPE without merges in GPT-2's shape (the GPT-2 split pattern), with
/// one token no merge leads to (a piece that is that token is still merged).
fn gpt2_shaped(add_prefix_space: bool) -> Value {
    let mut vocab: serde_json::Map<String, Value> =
        tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .enumerate()
            .map(|(id, c)| (c.to_string(), Value::from(id)))
            .collect();
    vocab.insert("zzqx".to_owned(), Value::from(256));
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": true, "use_regex": true});
    json!({
        "version": "1.0",
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    })
}

/// Qwen3's vocabulary and merges with Llama 3's split pattern (numbers of up to
/// three digits), `ignore_merges` on (with two tokens no merge leads to, which only
/// it gives), and NFKC: the other shapes the encoder covers.
fn llama3_shaped() -> Value {
    let mut json: Value = serde_json::from_slice(&std::fs::read(qwen3_path()).unwrap()).unwrap();
    json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    );
    json["model"]["ignore_merges"] = json!(true);
    json["model"]["vocab"]["zzqx"] = json!(151_700);
    json["model"]["vocab"]["Ġzzqx"] = json!(151_701);
    json["normalizer"] = json!({"type": "NFKC"});
    json
}

fn pair(name: &'static str, path: &Path) -> Pair {
    Pair {
        name,
        fast: ByteLevelBpe::load(path)
            .unwrap_or_else(|| panic!("{name}: the byte-level encoder covers it")),
        reference: tokenizers::Tokenizer::from_file(path).unwrap(),
    }
}

/// The pair for a tokenizer written for the test, whose file is removed once loaded.
fn written_pair(name: &'static str, json: &Value) -> Pair {
    let path = written(name, json);
    let loaded = pair(name, &path);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    loaded
}

fn pairs() -> &'static [Pair] {
    static LOADED: OnceLock<Vec<Pair>> = OnceLock::new();
    LOADED.get_or_init(|| {
        vec![
            pair("qwen3", &qwen3_path()),
            written_pair("llama3-shaped", &llama3_shaped()),
            written_pair("gpt2-shaped", &gpt2_shaped(false)),
            pair("bytes", &testdata("tokenizer-bytes/tokenizer.json")),
        ]
    })
}

fn assert_same(text: &str) -> Result<(), TestCaseError> {
    for pair in pairs() {
        let expected = pair.reference.encode(text, false).unwrap();
        let (got, untokenized) = pair.fast.encode(text);
        prop_assert_eq!(untokenized, 0);
        prop_assert_eq!(&got[..], expected.get_ids(), "{} on {:?}", pair.name, text);
    }
    Ok(())
}

const FRAGMENTS: &[&str] = &[
    "hello",
    "Hello",
    "WORLD",
    " the",
    "  ",
    "   ",
    "\t",
    "\n",
    "\r\n",
    "\n\n",
    " \n ",
    "\u{a0}",
    "\u{3000}",
    "\u{2003}",
    "'s",
    "'S",
    "'ll",
    "'RE",
    "'d",
    "don't",
    "12345",
    "3.14159",
    "2026-12-01",
    "!!",
    "...",
    "?!",
    " (",
    ")",
    "—",
    "«",
    "»",
    "你好世界",
    "猫が好き",
    "안녕하세요",
    "\u{1100}\u{1161}\u{11a8}",
    "e\u{301}",
    "A\u{30a}",
    "\u{301}",
    "a\u{308}\u{301}",
    "ﬁ",
    "①",
    "Ⅻ",
    "ｈｅｌｌｏ",
    "🐕",
    "👩\u{200d}💻",
    "🇫🇷",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|im_",
    "|>",
    "<|endoftext|>",
    "fn main() {",
    "zzqx",
    "    return x;",
    "}",
    "Привет",
    "مرحبا",
    "שלום",
    "नमस्ते",
];

fn text() -> impl Strategy<Value = String> {
    let fragment = prop_oneof![
        4 => prop::sample::select(FRAGMENTS).prop_map(str::to_owned),
        1 => any::<char>().prop_map(String::from),
        1 => "[ \t\r\n]{1,6}",
    ];
    prop::collection::vec(fragment, 0..40).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_ids_are_those_of_tokenizers(text in text()) {
        assert_same(&text)?;
    }
}

#[test]
fn a_corpus_gives_the_ids_of_tokenizers() {
    let long_run = format!("a{}b", " ".repeat(70));
    let corpus = [
        "",
        " ",
        "a  b",
        "a   \n  b",
        "x\r\n\r\n  y",
        "tail spaces   ",
        "  lead",
        "I'M HERE, you'Re there; it'S fine",
        "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|><|im_start|>",
        "<|im_start",
        "numbers 1 22 333 4444 55555 666666",
        "Ｆｕｌｌｗｉｄｔｈ and ﬁligatures ①②③",
        "Cafe\u{301} vs Café",
        "\u{1100}\u{1161} 한국어",
        "emoji 🐕‍🦺 👨‍👩‍👧 🏳️‍🌈",
        "\u{feff}bom\u{200b}zwsp",
        "tabs\tand\u{b}vertical\u{c}feeds",
        long_run.as_str(),
        "def f(x):\n    return x ** 2  # square\n",
    ];
    for text in corpus {
        assert_same(text).unwrap();
    }
}

#[test]
fn a_long_prompt_gives_the_ids_of_tokenizers() {
    let text = FRAGMENTS
        .iter()
        .cycle()
        .take(20_000)
        .copied()
        .collect::<String>();
    assert_same(&text).unwrap();
}

#[test]
fn a_long_stretch_that_normalizing_changes_is_normalized_in_parts_with_the_same_ids() {
    let text = "Cafe\u{301} na\u{308}ive 猫 ".repeat(12_000);
    assert!(text.len() > 3 * NORMALIZED_PART);
    assert_same(&text).unwrap();
}

#[test]
fn normalization_parts_end_before_an_ascii_character() {
    let short = "e\u{301}".repeat(10);
    assert_eq!(normalization_part(&short), Some(short.len()));
    let marks = "\u{301}".repeat(NORMALIZED_PART);
    let text = format!("{marks}x{marks}");
    assert_eq!(
        normalization_part(&text),
        Some(marks.len()),
        "the first ASCII character past the usual part size"
    );
    let endless = "\u{301}".repeat(MAX_NORMALIZED_PART);
    assert_eq!(normalization_part(&endless), None);
    let late = format!("{endless}x");
    assert_eq!(normalization_part(&late), None, "past the largest part");
    let early = format!("a{endless}");
    assert_eq!(
        normalization_part(&early),
        None,
        "a part is never empty: the ASCII at 0 is no end"
    );
    let (ids, untokenized) = pairs()[0].fast.encode(&format!("hi {endless}"));
    assert_eq!(
        untokenized,
        " ".len() + endless.len(),
        "the stretch without one is counted by its size, from the ASCII character before it"
    );
    assert!(!ids.is_empty());
}

#[test]
fn the_byte_level_patterns_are_matched_without_lookahead() {
    for pair in &pairs()[..3] {
        assert!(
            matches!(pair.fast.pieces, Pieces::Plain { .. }),
            "{}",
            pair.name
        );
    }
}

#[test]
fn a_piece_too_long_to_merge_is_counted_by_its_size_with_the_rest() {
    let letters = "a".repeat(MAX_PIECE + 1);
    let text = format!("hi {letters} there");
    let (ids, untokenized) = pairs()[0].fast.encode(&text);
    assert_eq!(untokenized, text.len() - "hi".len());
    assert_eq!(
        ids,
        pairs()[0].reference.encode("hi", false).unwrap().get_ids()
    );
}

#[test]
fn only_patterns_without_empty_matches_or_laziness_are_matched_without_lookahead() {
    let tail = r"|\s+(?!\S)|\s+";
    assert!(matches!(
        Pieces::new(Some(&format!(r" ?\p{{L}}+| ?\p{{N}}*{tail}"))),
        Some(Pieces::Fancy(_))
    ));
    assert!(matches!(
        Pieces::new(Some(&format!(r"(?U)'s| ?\p{{L}}+{tail}"))),
        Some(Pieces::Fancy(_))
    ));
    assert!(matches!(
        Pieces::new(Some(&format!(r"'s| ?\p{{L}}+{tail}"))),
        Some(Pieces::Plain { .. })
    ));
}

#[test]
fn tokenizers_it_does_not_cover_are_left_to_tokenizers() {
    assert!(ByteLevelBpe::load(&testdata("tokenizer-tiny/tokenizer.json")).is_none());
    let prefix_space = written("gpt2-prefix-space", &gpt2_shaped(true));
    assert!(ByteLevelBpe::load(&prefix_space).is_none());
    std::fs::remove_dir_all(prefix_space.parent().unwrap()).unwrap();
}

#[test]
fn merges_in_one_form_are_read_and_a_list_tokenizers_refuses_is_left_to_it() {
    let cases = [
        (json!([["a", "b"]]), true),
        (json!(["#version: 0.2", "a b"]), true),
        (json!([["a", "b"], "a b"]), false),
        (json!(["a b c"]), false),
        // Tokens no bytes stand for: a rule that never applies, or one `tokenizers`
        // refuses as its joined token is missing.
        (json!(["猫 a", "a b"]), true),
        (json!(["猫 b"]), false),
        // A later duplicate takes the later rank: "b c" first, so "abc" is a, bc.
        (json!(["a b", "b c", "a b"]), true),
        (json!(["a  b"]), false),
        (json!([""]), false),
    ];
    for (merges, covered) in cases {
        let mut file = gpt2_shaped(false);
        file["model"]["vocab"]["ab"] = json!(257);
        file["model"]["vocab"]["猫"] = json!(258);
        file["model"]["vocab"]["猫a"] = json!(259);
        file["model"]["vocab"]["bc"] = json!(260);
        file["model"]["merges"] = merges.clone();
        let path = written("merge-forms", &file);
        assert_eq!(
            tokenizers::Tokenizer::from_file(&path).is_ok(),
            covered,
            "tokenizers on {merges}"
        );
        let fast = ByteLevelBpe::load(&path);
        assert_eq!(fast.is_some(), covered, "{merges}");
        if let Some(fast) = fast {
            let reference = tokenizers::Tokenizer::from_file(&path).unwrap();
            let text = "ab 猫a abab abc";
            let expected = reference.encode(text, false).unwrap();
            assert_eq!(fast.encode(text).0, expected.get_ids(), "{merges}");
        }
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}

#[test]
fn a_vocabulary_with_shared_ids_is_left_to_tokenizers() {
    let mut file = gpt2_shaped(false);
    file["model"]["vocab"]["qxzz"] = json!(256);
    let path = written("shared-ids", &file);
    assert!(ByteLevelBpe::load(&path).is_none());
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn a_vocabulary_naming_a_token_twice_is_left_to_tokenizers_and_escaped_names_are_read() {
    let mut file = gpt2_shaped(false);
    file["model"]["vocab"]["qxzz"] = json!(257);
    // The same name again, written with an escape: the JSON map holds it twice.
    let text = file
        .to_string()
        .replacen(r#""qxzz":257"#, r#""qxzz":257,"q\u0078zz":258"#, 1);
    assert!(text.contains(r#""q\u0078zz":258"#));
    let dir = std::env::temp_dir().join(format!("switchyard-twice-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, &text).unwrap();
    assert!(ByteLevelBpe::load(&path).is_none(), "a name given twice");
    // An escaped name alone is the token it names.
    let text = file
        .to_string()
        .replacen(r#""qxzz":257"#, r#""q\u0078zz":257"#, 1);
    std::fs::write(&path, &text).unwrap();
    let fast = ByteLevelBpe::load(&path).expect("covered");
    let reference = tokenizers::Tokenizer::from_file(&path).unwrap();
    let expected = reference.encode("qxzz ab", false).unwrap();
    assert_eq!(fast.encode("qxzz ab").0, expected.get_ids());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_tokenizers_panics_on_is_a_load_error() {
    // A merge whose joined token is missing and longer than any in the vocabulary.
    let mut file = gpt2_shaped(false);
    file["model"]["merges"] = json!(["zzqx zzqx"]);
    let path = written("panicking", &file);
    let error = crate::ChatTokenizer::load(&path).unwrap_err();
    assert_eq!(error.file, path);
    assert!(error.problem.contains("panicked"), "{error}");
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn the_special_tokens_a_post_processor_adds_around_a_sequence_are_those_of_tokenizers() {
    let special = |name: &str, id: u32| json!({"id": name, "ids": [id], "tokens": [name]});
    let template = json!({
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|endoftext|>": special("<|endoftext|>", 151_643),
            "<|im_end|>": special("<|im_end|>", 151_645)
        }
    });
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    let processors = [
        json!({"type": "Sequence", "processors": [byte_level, template]}),
        json!({"type": "BertProcessing", "sep": ["<|im_end|>", 151_645], "cls": ["<|endoftext|>", 151_643]}),
        json!({"type": "RobertaProcessing", "sep": ["<|im_end|>", 151_645], "cls": ["<|endoftext|>", 151_643], "trim_offsets": false, "add_prefix_space": false}),
    ];
    for processor in processors {
        let mut file = llama3_shaped();
        file["post_processor"] = processor.clone();
        let pair = written_pair("post-processor", &file);
        let (before, after) = pair.fast.around().expect("understood");
        assert_eq!((&before[..], &after[..]), (&[151_643][..], &[151_645][..]));
        for text in ["hello world", "  12345 猫が好き\n"] {
            let mut ids = before.clone();
            ids.extend(pair.fast.encode(text).0);
            ids.extend_from_slice(after);
            let expected = pair.reference.encode(text, true).unwrap();
            assert_eq!(ids, expected.get_ids(), "{processor} on {text:?}");
        }
    }
}
