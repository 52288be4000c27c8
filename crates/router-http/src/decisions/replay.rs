//! What a replayable record adds (`decisions.replayable`): the request's arrival in
//! microseconds and its prompt as page hashes, so `switchyard replay --records` can
//! send the same prompts, sharing the same prefixes, at the same times. The prompt's
//! text and token ids are never written, nor the hashes the prefix index and the
//! engines give its pages (which anyone can compute, and so test guesses against, a
//! page at a time): each page is recorded as a keyed hash (SipHash under keys drawn
//! when the router starts, written nowhere) of the index's hash of that page, which
//! commits to every page before it in the request's cache namespace. Equal hashes,
//! within one router process, say two prompts share a prefix that far, and nothing
//! more.
//!
//! ```json
//! "replay": {"arrival_unix_us": 1764892800123456, "prompt_tokens": 40,
//!            "block_size": 16, "pages": "9f0c…(16 hex digits a page)"}
//! ```
//! `pages` is left out when the prompt was not tokenized (a model without a
//! tokenizer, a failed tokenization, or a request no bucket took): the replay then
//! sends a prompt of `prompt_tokens` that shares nothing.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::time::SystemTime;

use router_state::kv_events::{chain_hashes, namespace_seed};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// Hex digits of a page hash, most significant first.
const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The most pages a record names (128 KiB of hex, in a record of at most 256 KiB):
/// a longer prompt's pages past them replay as tokens shared with no other prompt.
pub(crate) const MAX_PAGES: usize = 8192;

/// A record's `replay` object: made, or being made (its prompt tokenized) while the
/// request goes on.
#[derive(Debug)]
pub(crate) enum Replay {
    /// Made.
    Ready(Value),
    /// Being made by a task of its own; the record waits for it once the request
    /// has ended.
    Pending(oneshot::Receiver<Value>),
}

impl Replay {
    /// The object `made` makes, on a task of its own.
    pub(crate) fn spawn(made: impl Future<Output = Value> + Send + 'static) -> Self {
        let (sender, receiver) = oneshot::channel();
        tokio::spawn(async move {
            // A record dropped meanwhile no longer waits for it.
            let _ = sender.send(made.await);
        });
        Self::Pending(receiver)
    }
}

/// A request's prompt, as the record describes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prompt<'a> {
    /// Its token ids, when it was tokenized (of its first part, when only that was).
    pub(crate) token_ids: Option<&'a [u32]>,
    /// Its length in tokens (the router's estimate when not tokenized).
    pub(crate) tokens: u64,
    /// The model's page size, in tokens.
    pub(crate) block_size: u32,
    /// The cache namespace its pages are hashed in (an adapter, a salt).
    pub(crate) namespace: Option<&'a str>,
}

/// The `replay` object of a request that arrived at `arrived`, its pages hashed under
/// `key`.
pub(crate) fn fields(prompt: Prompt<'_>, arrived: SystemTime, key: &RandomState) -> Value {
    let arrival_unix_us = arrived
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let mut fields = json!({
        "arrival_unix_us": arrival_unix_us,
        "prompt_tokens": prompt.tokens,
        "block_size": prompt.block_size,
    });
    if let Some(ids) = prompt.token_ids {
        let paged = ids
            .len()
            .min(MAX_PAGES.saturating_mul(prompt.block_size as usize));
        let pages = chain_hashes(
            &ids[..paged],
            prompt.block_size as usize,
            namespace_seed(prompt.namespace),
        );
        fields["pages"] = Value::String(hex(pages.into_iter().map(|page| key.hash_one(page))));
    }
    fields
}

/// `pages` as 16 lowercase hex digits each, most significant first.
fn hex(pages: impl ExactSizeIterator<Item = u64>) -> String {
    let mut out = String::with_capacity(pages.len() * 16);
    for page in pages {
        for nibble in (0..16).rev() {
            out.push(char::from(DIGITS[((page >> (nibble * 4)) & 0xf) as usize]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn pages_are_the_index_hashes_keyed_in_hex_and_the_arrival_is_in_microseconds() {
        let ids: Vec<u32> = (0..40).collect();
        let prompt = Prompt {
            token_ids: Some(&ids),
            tokens: 40,
            block_size: 16,
            namespace: Some("adapter"),
        };
        let key = RandomState::new();
        let arrived = SystemTime::UNIX_EPOCH + Duration::from_micros(4_998_500);
        let fields = fields(prompt, arrived, &key);
        let hashes = chain_hashes(&ids, 16, namespace_seed(Some("adapter")));
        assert_eq!(hashes.len(), 2, "two full pages of 16 in 40 tokens");
        let expected = format!(
            "{:016x}{:016x}",
            key.hash_one(hashes[0]),
            key.hash_one(hashes[1])
        );
        assert_eq!(fields["pages"], expected.as_str());
        assert!(
            !expected.contains(&format!("{:016x}", hashes[0])),
            "the index's own hash is not written"
        );
        assert_eq!(fields["prompt_tokens"], 40);
        assert_eq!(fields["block_size"], 16);
        assert_eq!(fields["arrival_unix_us"], 4_998_500);
    }

    #[test]
    fn a_prompt_not_tokenized_has_its_length_and_no_pages() {
        let prompt = Prompt {
            token_ids: None,
            tokens: 300,
            block_size: 16,
            namespace: None,
        };
        let fields = fields(prompt, SystemTime::now(), &RandomState::new());
        assert_eq!(fields["prompt_tokens"], 300);
        assert!(fields.get("pages").is_none());
    }

    #[test]
    fn a_prompt_of_more_pages_than_a_record_names_is_cut_at_them() {
        let ids: Vec<u32> = (0..20_000).collect();
        let prompt = Prompt {
            token_ids: Some(&ids),
            tokens: 20_000,
            block_size: 1,
            namespace: None,
        };
        let fields = fields(prompt, SystemTime::now(), &RandomState::new());
        assert_eq!(fields["pages"].as_str().unwrap().len(), MAX_PAGES * 16);
        assert_eq!(fields["prompt_tokens"], 20_000);
    }

    #[test]
    fn hex_is_sixteen_digits_a_page() {
        assert_eq!(
            hex([0, u64::MAX, 0x0123_4567_89ab_cdef].into_iter()),
            "0000000000000000ffffffffffffffff0123456789abcdef"
        );
    }
}
