use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::Value;

use super::*;

use crate::python_env;

fn load(path: &Path) -> General {
    assert!(path.exists(), "{} is missing", path.display());
    General::load(path).unwrap()
}

fn testdata(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(relative)
}

/// A byte-level BPE tokenizer without merges (one token a byte) in GPT-2's shape:
/// the GPT-2 split pattern, offsets trimmed of their leading space, and, when
/// `prefix_space`, a space added before every text. Loaded from a directory of its
/// own, with a chat template beside it, removed once loaded.
fn gpt2_shaped(prefix_space: bool) -> General {
    let vocab: serde_json::Map<String, Value> =
        tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .enumerate()
            .map(|(id, c)| (c.to_string(), Value::from(id)))
            .collect();
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": prefix_space, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": prefix_space, "trim_offsets": true, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": prefix_space, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    });
    let dir = std::env::temp_dir().join(format!(
        "switchyard-gpt2-shaped-{prefix_space}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}"#,
    )
    .unwrap();
    let loaded = General::load(&dir.join("tokenizer.json")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    loaded
}

/// Every tokenizer the tests have: both of testdata, the Qwen3 one and two GPT-2
/// shaped ones, loaded once.
fn tokenizers() -> &'static [General] {
    static LOADED: OnceLock<Vec<General>> = OnceLock::new();
    LOADED.get_or_init(|| {
        vec![
            load(&testdata("tokenizer-tiny/tokenizer.json")),
            load(&testdata("tokenizer-bytes/tokenizer.json")),
            load(&python_env::ensure().join("qwen3/tokenizer.json")),
            gpt2_shaped(false),
            gpt2_shaped(true),
        ]
    })
}

fn qwen3() -> &'static General {
    &tokenizers()[2]
}

fn whole(tokenizer: &General, text: &str) -> Vec<u32> {
    tokenizer
        .tokenizer
        .encode(text, false)
        .unwrap()
        .get_ids()
        .to_vec()
}

/// Pieces of prompts: words, whitespace runs, digits, punctuation, contractions,
/// scripts without spaces, emoji, combining marks and special tokens.
const PIECES: &[&str] = &[
    "hello",
    " world",
    "Hello",
    " a",
    "x",
    "\n",
    "\n\n",
    "\r\n",
    "  ",
    "   \n",
    "\t",
    " ",
    "1",
    "123",
    "45678",
    ".",
    "!?",
    "...\n",
    "'s",
    "'ll",
    " 'd",
    "猫が好きです",
    "、",
    "🐕",
    "👩‍💻",
    "e\u{301}",
    "\u{301}",
    "Ünïcödé",
    "<|im_start|>",
    "<|im_end|>",
    "<|user|>",
    "<s>",
    "user",
    "fn main() {",
    "}",
    "=>",
    "\u{a0}",
    "ẞ",
];

fn prompt() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(PIECES), 0..300).prop_map(|p| p.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn windows_give_the_ids_of_the_whole(text in prompt(), window in 16_usize..96) {
        for tokenizer in tokenizers() {
            let expected = whole(tokenizer, &text);
            let got = encode(tokenizer, &text, window, window * 4).unwrap();
            prop_assert_eq!(&got.ids[..], &expected[..got.ids.len()], "a prefix of the whole's ids");
            if got.untokenized_bytes == 0 {
                prop_assert_eq!(got.ids, expected);
            }
        }
    }
}

#[test]
fn a_long_prompt_is_split_into_many_windows_with_the_same_ids() {
    let tokenizer = qwen3();
    let text = "The quick brown fox, 42 times.\n\nJumps  over\tthe lazy dog's 猫 🐕!\n".repeat(200);
    let got = encode(tokenizer, &text, 1024, 4096).unwrap();
    assert_eq!(got.untokenized_bytes, 0);
    assert_eq!(got.ids, whole(tokenizer, &text));
}

#[test]
fn a_stretch_without_a_split_point_is_counted_by_its_size() {
    let tokenizer = qwen3();
    let text = format!("Hello there, friend. {}", "a".repeat(10_000));
    let got = encode(tokenizer, &text, 64, 256).unwrap();
    assert!(got.untokenized_bytes > 9_000, "{got:?}");
    let expected = whole(tokenizer, &text);
    assert_eq!(got.ids[..], expected[..got.ids.len()]);
}

#[test]
fn a_window_never_ends_inside_an_added_token() {
    let added = ["<|im_end|>".to_owned()];
    let text = "ab <|im_end|> cd";
    assert_eq!(
        added_around(text, 5, &added),
        Some((3, 10)),
        "between `<|` and `im`"
    );
    assert_eq!(added_around(text, 3, &added), None, "right before it");
    assert_eq!(added_around(text, 13, &added), None, "right after it");
}

#[test]
fn tokenizers_that_add_to_a_texts_start_are_tokenized_in_one_window() {
    assert!(tokenizers()[..4].iter().all(|t| t.windows));
    assert!(
        !tokenizers()[4].windows,
        "a byte-level pre-tokenizer adding a prefix space"
    );
    let metaspace = |scheme: &str| {
        prepending(&serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": true}
        ]}))
    };
    assert!(metaspace("first") && metaspace("always") && !metaspace("never"));
    assert!(prepending(
        &serde_json::json!({"type": "Prepend", "prepend": "▁"})
    ));
    let text = "word,\nnext".repeat(50);
    let got = encode(&tokenizers()[4], &text, 16, 64).unwrap();
    assert!(
        got.untokenized_bytes > 0 && got.untokenized_bytes < text.len() - 16,
        "{got:?}"
    );
    assert_eq!(got.ids[..], whole(&tokenizers()[4], &text)[..got.ids.len()]);
}
