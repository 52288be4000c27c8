//! The prefix cache against the encoder itself: a conversation's prompts, each the
//! one before it and more, give through the cache the ids they give whole, whatever
//! was cached before; and the cache keeps to its budget.

use std::path::Path;
use std::sync::OnceLock;

use proptest::prelude::*;

use super::*;
use crate::tokenize::python_env;

/// The byte-level tokenizers with added tokens the tests have.
fn encoders() -> &'static [(&'static str, ByteLevelBpe)] {
    static LOADED: OnceLock<Vec<(&'static str, ByteLevelBpe)>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let bytes = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/tokenizer-bytes/tokenizer.json");
        let qwen3 = python_env::ensure().join("qwen3/tokenizer.json");
        [("qwen3", qwen3), ("bytes", bytes)]
            .into_iter()
            .map(|(name, path)| (name, ByteLevelBpe::load(&path).expect("byte-level")))
            .collect()
    })
}

/// A cache that looks up every prompt, however short.
fn eager(budget: usize) -> PrefixCache {
    PrefixCache {
        min_prompt_bytes: 0,
        ..PrefixCache::new(budget)
    }
}

const FRAGMENTS: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|user|>",
    "<|assistant|>",
    "<s>",
    "<|im_",
    "user\n",
    "assistant\n",
    "\n",
    " ",
    "  ",
    "hello",
    " world",
    "'s",
    "12345",
    "猫が好き",
    "e\u{301}",
    "ﬁ",
    "🐕",
    "fn main() {",
];

/// A turn: a few fragments, often ending in an added token.
fn turn() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(FRAGMENTS), 1..12).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn reused_prefixes_give_the_ids_of_the_whole(
        turns in prop::collection::vec(turn(), 1..8),
        budget in prop_oneof![Just(0usize), Just(600), Just(1 << 20)],
    ) {
        for (name, encoder) in encoders() {
            let cache = eager(budget);
            let mut prompt = String::new();
            for turn in &turns {
                prompt.push_str(turn);
                let whole = encoder.encode(&prompt);
                prop_assert_eq!(cache.encode(encoder, &prompt), whole, "{} on {:?}", name, prompt);
                prop_assert!(cache.stats().bytes as usize <= budget);
            }
        }
    }
}

#[test]
fn the_next_turn_of_a_conversation_reuses_the_last_ones_prefix() {
    let (_, qwen3) = &encoders()[0];
    let cache = PrefixCache::new(1 << 20);
    let history = format!(
        "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>",
        "You are helpful. ".repeat(600)
    );
    let first = format!("{history}assistant\n");
    let (ids, left) = cache.encode(qwen3, &first);
    assert_eq!((ids.clone(), left), qwen3.encode(&first));
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.entries), (0, 1, 1));
    let kept = qwen3.encode(&history).0;
    assert_eq!(
        stats.bytes as usize,
        kept.len() * 4 + ENTRY_OVERHEAD,
        "the prefix up to the last added token is kept"
    );
    let next = format!(
        "{first}Hello!<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(cache.encode(qwen3, &next), qwen3.encode(&next));
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.entries), (1, 1, 2));
    assert_eq!(stats.reused_tokens, kept.len() as u64);
    let short = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(cache.encode(qwen3, short), qwen3.encode(short));
    assert_eq!(
        cache.stats().hits + cache.stats().misses,
        2,
        "a short prompt is encoded whole, without a lookup"
    );
}

#[test]
fn the_least_recently_used_prefix_goes_first_and_a_large_one_is_not_kept() {
    let (_, bytes) = &encoders()[1];
    // Each prompt's kept prefix is "<s>", 99 letters and "<s>": 101 ids.
    let prompt = |c: char| format!("<s>{}<s>tail", String::from(c).repeat(99));
    let entry = 101 * 4 + ENTRY_OVERHEAD;
    let cache = eager(4 * entry);
    for c in ['a', 'b', 'c', 'd'] {
        cache.encode(bytes, &prompt(c));
    }
    assert_eq!(cache.stats().entries, 4);
    cache.encode(bytes, &prompt('a'));
    assert_eq!(cache.stats().hits, 1, "a is used again");
    cache.encode(bytes, &prompt('e'));
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.bytes), (4, 4 * entry as u64));
    cache.encode(bytes, &prompt('a'));
    cache.encode(bytes, &prompt('b'));
    assert_eq!(
        cache.stats().hits,
        2,
        "a was kept, b (least recently used) was not"
    );
    let small = eager(4 * entry - 1);
    small.encode(bytes, &prompt('a'));
    assert_eq!(small.stats().entries, 0, "over a quarter of the budget");
}
