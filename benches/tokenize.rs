//! Chat tokenization with the Qwen3 tokenizer and chat template, as the router does it
//! for every request of a model whose route reads prompts: the load benchmark's short chat, one
//! message of 8k and 64k tokens, and turn 20 of a conversation whose history is about
//! 50k tokens followed by a 200-token message, with no prefix cache and after turn 19
//! (whose prefix the cache keeps).
//!
//! Needs the Qwen3 tokenizer that `cargo xtask python-env` puts into `.cache/qwen3`
//! (or `$SWITCHYARD_CACHE/qwen3`); `cargo xtask bench` prepares it.

#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented public function"
)]
#![allow(
    clippy::print_stderr,
    reason = "a bench reports the size of its inputs beside criterion's output"
)]

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use router_tokenize::{ChatRequest, ChatTokenizer};
use serde_json::json;

mod text;

// The allocator the switchyard binary uses: tokenization allocates a great deal.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn qwen3() -> ChatTokenizer {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let cache =
        std::env::var_os("SWITCHYARD_CACHE").map_or_else(|| root.join(".cache"), PathBuf::from);
    let path = cache.join("qwen3/tokenizer.json");
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask python-env`",
        path.display()
    );
    ChatTokenizer::load(&path).expect("the Qwen3 tokenizer loads")
}

/// A chat request of `messages` alone.
fn chat(messages: &str) -> ChatRequest<'_> {
    ChatRequest {
        messages,
        ..ChatRequest::default()
    }
}

/// Five function tools of an agent, as the load benchmark's tool-calling chat sends
/// them.
fn five_tools() -> String {
    let tools: Vec<serde_json::Value> = ["search_docs", "read_file", "write_file", "run_tests", "open_issue"]
        .iter()
        .map(|name| {
            json!({"type": "function", "function": {
                "name": name,
                "description": format!("{name}: does what its name says, on the repository the agent works in."),
                "parameters": {"type": "object", "properties": {
                    "path": {"type": "string", "description": "A path in the repository."},
                    "query": {"type": "string", "description": "What to look for."},
                    "limit": {"type": "integer", "description": "At most this many results.", "default": 10}
                }, "required": ["path"]}
            }})
        })
        .collect();
    serde_json::Value::Array(tools).to_string()
}

fn tokenize(c: &mut Criterion) {
    let tokenizer = qwen3().with_prefix_cache(router_config::DEFAULT_TOKENIZE_CACHE_BYTES);
    let count = |messages: &str| {
        tokenizer
            .encode_chat(&chat(messages))
            .expect("tokenizes")
            .ids
            .len()
    };
    // The generated text's tokens a word, so the cases have the tokens they name.
    let sample = json!([{"role": "user", "content": text::english(10_000, 1)}]).to_string();
    let words = |tokens: usize| tokens * 10_000 / count(&sample);
    let short = json!([{"role": "user", "content": "hello there, how are you today?"}]).to_string();
    let one = |tokens: usize| {
        json!([{"role": "user", "content": text::english(words(tokens), 1)}]).to_string()
    };
    let turn = |n: u64| text::conversation(20, words(50_000), words(200), n);
    let cases = [
        ("chat_short", short),
        ("chat_8k_tokens", one(8_000)),
        ("chat_64k_tokens", one(64_000)),
    ];
    // Without a prefix cache: a repeated prompt would be taken from it.
    let fresh = qwen3();
    let mut group = c.benchmark_group("tokenize_qwen3");
    for (name, messages) in &cases {
        eprintln!(
            "{name}: {} bytes of messages, {} tokens",
            messages.len(),
            count(messages)
        );
        group.bench_function(*name, |b| {
            b.iter(|| {
                fresh
                    .encode_chat(black_box(&chat(messages)))
                    .expect("tokenizes")
            })
        });
    }
    // The short chat with five tools, as an agent's every turn carries them.
    let tools = five_tools();
    let short = &cases[0].1;
    let with_tools = ChatRequest {
        tools: Some(&tools),
        ..chat(short)
    };
    eprintln!(
        "chat_short_5_tools: {} bytes of tools, {} tokens",
        tools.len(),
        fresh.encode_chat(&with_tools).expect("tokenizes").ids.len()
    );
    group.bench_function("chat_short_5_tools", |b| {
        b.iter(|| {
            fresh
                .encode_chat(black_box(&with_tools))
                .expect("tokenizes")
        })
    });
    group.bench_function("chat_short_5_tools_prefix_cached", |b| {
        b.iter(|| {
            tokenizer
                .encode_chat(black_box(&with_tools))
                .expect("tokenizes")
        })
    });
    // Turn 20 of a conversation: its history (about 50k tokens) was the prompt of
    // turn 19 but for the last answer; a new 200-token message follows. Each
    // iteration's message differs, so only turn 19's prefix is ever reused.
    let follow_up = turn(0);
    let mut before = follow_up.as_array().expect("messages").clone();
    before.truncate(before.len() - 2);
    let before = serde_json::Value::Array(before).to_string();
    let follow_up = follow_up.to_string();
    eprintln!(
        "chat_turn_20_of_50k: {} bytes of messages, {} tokens",
        follow_up.len(),
        count(&follow_up)
    );
    group.bench_function("chat_turn_20_of_50k_uncached", |b| {
        b.iter(|| {
            fresh
                .encode_chat(black_box(&chat(&follow_up)))
                .expect("tokenizes")
        })
    });
    tokenizer.encode_chat(&chat(&before)).expect("tokenizes");
    let mut n = 0;
    group.bench_function("chat_turn_20_of_50k_after_turn_19", |b| {
        b.iter_batched(
            || {
                n += 1;
                turn(n).to_string()
            },
            |messages| tokenizer.encode_chat(&chat(&messages)).expect("tokenizes"),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = tokenize
}
criterion_main!(benches);
