//! The prefix cache against the encoder itself: a conversation's prompts, each the
//! one before it and more, give through the cache the ids they give whole, whatever
//! was cached before; and the cache keeps to its budget.

use std::path::Path;
use std::sync::OnceLock;

use proptest::prelude::*;

use super::*;
use crate::python_env;

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
        1,
        "its start is kept, the prefix not wholly tokenized is not"
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
    assert_eq!(
        (stats.hits, stats.misses, stats.entries),
        (1, 1, 2),
        "its start and its prefix kept"
    );
}

#[test]
fn a_new_conversation_opening_as_another_did_reuses_its_start() {
    let (_, qwen3) = &encoders()[0];
    let cache = PrefixCache::new(4 << 20);
    let system = format!("<|im_start|>system\n{}<|im_end|>\n", "tools ".repeat(400));
    let first = format!("{system}<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n");
    let second =
        format!("{system}<|im_start|>user\nsomething else<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(cache.encode(qwen3, &first), qwen3.encode(&first));
    assert_eq!(cache.encode(qwen3, &second), qwen3.encode(&second));
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses), (1, 1));
    // Up to the system turn's `<|im_end|>`: its first split point past the cache's
    // least prompt length.
    let system_tokens = qwen3.encode(system.trim_end()).0.len() as u64;
    assert_eq!(
        stats.reused_tokens, system_tokens,
        "the system turn was reused"
    );
}

#[test]
fn the_prefix_a_new_one_extends_is_forgotten_first() {
    let cache = PrefixCache::new(4 * cost(100));
    let key = |n: usize| (n, n as u64);
    let ids = [7; 100];
    let held = |n| cache.entries.lock().by_key.contains_key(&key(n));
    for n in 1..=3 {
        cache.insert(key(n), &ids, None);
    }
    cache.longest(&[], key(2)).expect("held");
    cache.insert(key(4), &ids, Some(key(2)));
    cache.insert(key(5), &ids, None);
    assert!(!held(2), "the extended prefix, reused once, went first");
    assert!(
        [1, 3, 4, 5].into_iter().all(held),
        "the oldest other stayed"
    );
    cache.insert(key(6), &ids, None);
    assert!(!held(1), "then the least recently used");
}

#[test]
fn a_prefix_reused_again_after_an_extension_is_kept_by_its_use() {
    let cache = PrefixCache::new(4 * cost(100));
    let key = |n: usize| (n, n as u64);
    let ids = [7; 100];
    let held = |n| cache.entries.lock().by_key.contains_key(&key(n));
    for n in 1..=4 {
        cache.insert(key(n), &ids, None);
    }
    // A full cache: the branch from 2 makes room before 2 is put first in line.
    cache.longest(&[], key(2)).expect("held");
    cache.insert(key(5), &ids, Some(key(2)));
    assert!(
        held(2) && !held(1),
        "the oldest made room, not the prefix just reused"
    );
    cache
        .longest(&[], key(2))
        .expect("reused again: a branch point");
    cache.insert(key(6), &ids, Some(key(2)));
    cache.insert(key(7), &ids, None);
    assert!(held(2), "a branch point stays while it is used");
    assert!(!held(3) && !held(4), "the least recently used went");
}

#[test]
fn a_prefix_hashes_alike_whatever_other_points_are_hashed_with_it() {
    let cache = PrefixCache::new(1 << 20);
    let text = "x".repeat(20_000);
    let longer = format!("{text}more");
    let alone = cache.keys(&text, &[12_345]);
    assert_eq!(cache.keys(&text, &[100, 4_096, 12_345])[2], alone[0]);
    assert_eq!(cache.keys(&longer, &[12_345, 19_999])[0], alone[0]);
    assert_ne!(cache.keys(&text, &[12_344])[0], alone[0]);
    assert_ne!(
        PrefixCache::new(1 << 20).keys(&text, &[12_345])[0],
        alone[0],
        "another process's keys"
    );
}
