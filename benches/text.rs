//! Deterministic English-like prompt text of a chosen length in tokens.

use serde_json::{Value, json};

const WORDS: &[&str] = &[
    "the",
    "router",
    "sends",
    "each",
    "request",
    "to",
    "an",
    "engine",
    "that",
    "holds",
    "its",
    "prefix",
    "cache",
    "and",
    "has",
    "room",
    "for",
    "the",
    "answer",
    "while",
    "tokens",
    "arrive",
    "in",
    "batches",
    "of",
    "several",
    "hundred",
    "per",
    "second",
    "operators",
    "watch",
    "latency",
    "throughput",
    "memory",
    "under",
    "load",
    "with",
    "Kubernetes",
    "pods",
    "restarting",
    "every",
    "few",
    "minutes",
    "so",
    "routing",
    "must",
    "adapt",
    "quickly",
    "without",
    "losing",
    "state",
    "or",
    "requests",
];

const PUNCTUATION: &[&str] = &[", ", ". ", "; ", " (2026) ", ": ", "? ", "\n\n", " - "];

/// About `tokens` tokens of text (a word is about one token here), varied by `seed`.
pub(crate) fn english(tokens: usize, seed: u64) -> String {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let mut text = String::new();
    for i in 0..tokens {
        if i > 0 {
            let p = next() % 12;
            text.push_str(if p < PUNCTUATION.len() {
                PUNCTUATION[p]
            } else {
                " "
            });
        }
        text.push_str(WORDS[next() % WORDS.len()]);
    }
    text
}

/// A conversation of `turns` turns (a system prompt, then user and assistant in
/// turn) whose history is about `history_tokens` tokens, ending with a new user
/// message of about `new_tokens`, varied by `variant`.
pub(crate) fn conversation(
    turns: usize,
    history_tokens: usize,
    new_tokens: usize,
    variant: u64,
) -> Value {
    let per_message = history_tokens / (2 * turns);
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": english(per_message, 2 * turn as u64)}));
        messages.push(
            json!({"role": "assistant", "content": english(per_message, 2 * turn as u64 + 1)}),
        );
    }
    messages.push(json!({"role": "user", "content": english(new_tokens, 9_999 + variant)}));
    Value::Array(messages)
}
