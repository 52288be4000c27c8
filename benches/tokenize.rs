//! Chat tokenization with the Qwen3 tokenizer and chat template, as the router does it
//! for every request of a model with a tokenizer: the load benchmark's short chat, one
//! message of about 8k and 64k tokens, and turn 20 of a conversation whose history is
//! about 50k tokens followed by a 200-token message.
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

use criterion::{Criterion, criterion_group, criterion_main};
use router_http::ChatTokenizer;
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

fn tokenize(c: &mut Criterion) {
    let tokenizer = qwen3();
    let short = json!([{"role": "user", "content": "hello there, how are you today?"}]).to_string();
    let one =
        |tokens: usize| json!([{"role": "user", "content": text::english(tokens, 1)}]).to_string();
    let conversation = text::conversation(20, 50_000, 200).to_string();
    let cases = [
        ("chat_short", short),
        ("chat_8k_tokens", one(8_000)),
        ("chat_64k_tokens", one(64_000)),
        ("chat_turn_20_of_50k", conversation),
    ];
    let mut group = c.benchmark_group("tokenize_qwen3");
    for (name, messages) in &cases {
        let tokens = tokenizer
            .encode_chat(messages)
            .expect("tokenizes")
            .ids
            .len();
        eprintln!(
            "{name}: {} bytes of messages, {tokens} tokens",
            messages.len()
        );
        group.bench_function(*name, |b| {
            b.iter(|| {
                tokenizer
                    .encode_chat(black_box(messages))
                    .expect("tokenizes")
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = tokenize
}
criterion_main!(benches);
