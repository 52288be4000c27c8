use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;

use super::*;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load(relative: &str) -> ChatTokenizer {
    let path = root().join(relative);
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask python-env` (CI runs it first)",
        path.display()
    );
    ChatTokenizer::load(&path).unwrap()
}

/// Every tokenizer the tests have: both of testdata and the Qwen3 one, loaded once.
fn tokenizers() -> &'static [ChatTokenizer] {
    static LOADED: OnceLock<Vec<ChatTokenizer>> = OnceLock::new();
    LOADED.get_or_init(|| {
        vec![
            load("testdata/tokenizer-tiny/tokenizer.json"),
            load("testdata/tokenizer-bytes/tokenizer.json"),
            load(".cache/qwen3/tokenizer.json"),
        ]
    })
}

fn qwen3() -> &'static ChatTokenizer {
    &tokenizers()[2]
}

fn whole(tokenizer: &ChatTokenizer, text: &str) -> Vec<u32> {
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
