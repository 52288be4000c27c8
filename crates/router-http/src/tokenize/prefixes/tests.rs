//! The prefix cache against the encoder itself: a conversation's prompts, each the
//! one before it and more, give through the cache the ids they give whole, whatever
//! was cached before; and the cache keeps to its budget.

use std::path::Path;
use std::sync::OnceLock;

use proptest::prelude::*;

use super::*;
use crate::tokenize::python_env;

fn bytes_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizer-bytes/tokenizer.json")
}

/// The bytes tokenizer with added tokens that overlap each other (`<a>` starts
/// `<a>b`, whose end starts `b>`), so a shorter one may end where a longer one of a
/// longer text would not.
fn overlapping() -> ByteLevelBpe {
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bytes_path()).unwrap()).unwrap();
    let added = json["added_tokens"].as_array_mut().unwrap();
    let template = added[0].clone();
    for (n, content) in ["<a>", "<a>b", "b>"].into_iter().enumerate() {
        let mut token = template.clone();
        token["content"] = content.into();
        token["id"] = (300 + n).into();
        added.push(token);
    }
    let dir = std::env::temp_dir().join(format!("switchyard-overlapping-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    let encoder = ByteLevelBpe::load(&path).expect("byte-level");
    std::fs::remove_dir_all(&dir).unwrap();
    encoder
}

/// The byte-level tokenizers with added tokens the tests have.
fn encoders() -> &'static [(&'static str, ByteLevelBpe)] {
    static LOADED: OnceLock<Vec<(&'static str, ByteLevelBpe)>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let qwen3 = python_env::ensure().join("qwen3/tokenizer.json");
        vec![
            ("qwen3", ByteLevelBpe::load(&qwen3).expect("byte-level")),
            (
                "bytes",
                ByteLevelBpe::load(&bytes_path()).expect("byte-level"),
            ),
            ("overlapping", overlapping()),
        ]
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
    "<a>",
    "<a>b",
    "b>",
    "b",
    ">",
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

    /// Each conversation's prompts extend the one before; a second conversation
    /// branches from the first after `branch` turns, so it meets prefixes the first
    /// left, of prompts that are not its own.
    #[test]
    fn reused_prefixes_give_the_ids_of_the_whole(
        turns in prop::collection::vec(turn(), 1..8),
        other in prop::collection::vec(turn(), 1..4),
        branch in 0usize..8,
        budget in prop_oneof![Just(0usize), Just(2400), Just(1 << 20)],
    ) {
        let branch = branch.min(turns.len());
        let second = turns[..branch].iter().chain(&other);
        for (name, encoder) in encoders() {
            let cache = eager(budget);
            for conversation in [turns.iter().collect::<Vec<_>>(), second.clone().collect()] {
                let mut prompt = String::new();
                for turn in conversation {
                    prompt.push_str(turn);
                    let whole = encoder.encode(&prompt);
                    prop_assert_eq!(cache.encode(encoder, &prompt), whole, "{} on {:?}", name, prompt);
                    prop_assert!(cache.stats().bytes as usize <= budget);
                }
            }
        }
    }
}

#[test]
fn a_prompt_past_what_is_merged_keeps_its_untokenized_tail_through_the_cache() {
    let (_, qwen3) = &encoders()[0];
    let cache = eager(1 << 30);
    let prompt = format!(
        "<|im_start|>user\n{}<|im_end|>\n<|im_start|>",
        "a".repeat(300 << 10)
    );
    let whole = qwen3.encode(&prompt);
    assert!(whole.1 > 0, "a piece over 256 KiB is left untokenized");
    assert_eq!(cache.encode(qwen3, &prompt), whole);
    assert_eq!(
        cache.stats().entries,
        0,
        "a prefix not wholly tokenized is not kept"
    );
}

#[test]
fn a_prompt_of_added_tokens_probes_only_its_last_split_points() {
    let (_, bytes) = &encoders()[1];
    let cache = PrefixCache::new(4 << 20);
    let prompt = "<s>".repeat(100_000);
    let points = cache.split_points(bytes, &prompt);
    let last: Vec<usize> = (100_000 - MAX_PROBES + 1..=100_000)
        .map(|n| 3 * n)
        .collect();
    assert_eq!(points, last);
    assert_eq!(cache.encode(bytes, &prompt), bytes.encode(&prompt));
    assert_eq!(cache.encode(bytes, &prompt), bytes.encode(&prompt));
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.entries), (1, 1, 1));
}

#[test]
fn the_prefix_a_new_one_extends_is_forgotten_first() {
    let cache = PrefixCache::new(4 * cost(100));
    let key = |n: usize| (n, n as u64);
    let ids = [7; 100];
    cache.insert(key(1), &ids, None);
    cache.insert(key(2), &ids, None);
    cache.insert(key(3), &ids, Some(key(2)));
    cache.insert(key(4), &ids, None);
    cache.insert(key(5), &ids, None);
    let held = |n| cache.entries.lock().by_key.contains_key(&key(n));
    assert!(!held(2), "the extended prefix went first");
    assert!(
        [1, 3, 4, 5].into_iter().all(held),
        "the oldest other stayed"
    );
    cache.insert(key(6), &ids, None);
    assert!(!held(1), "then the least recently used");
    // A prefix reused twice is a branch point: kept by its use.
    for _ in 0..2 {
        cache.longest(&[key(3)]).expect("held");
    }
    cache.insert(key(7), &ids, Some(key(3)));
    cache.insert(key(8), &ids, None);
    assert!(held(3), "the branch point stayed");
    assert!(!held(4), "the least recently used went");
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
        cost(kept.len()),
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
    let entry = cost(101);
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
