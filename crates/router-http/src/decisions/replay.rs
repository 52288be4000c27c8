//! What a replayable record adds (`decisions.replayable`): the request's arrival in
//! microseconds and its prompt as page hashes, so `switchyard replay --records` can
//! send the same prompts, sharing the same prefixes, at the same times. The prompt's
//! text and token ids are never written: a page is named by the hash the prefix index
//! gives it (the model's `block_size` tokens, chained to the pages before it, in the
//! request's cache namespace), which says which requests share a prefix and how long,
//! and nothing more.
//!
//! ```json
//! "replay": {"arrival_unix_us": 1764892800123456, "prompt_tokens": 40,
//!            "block_size": 16, "pages": "9f0c…(16 hex digits a page)"}
//! ```
//! `pages` is left out when the prompt was not tokenized (a model without a
//! tokenizer): the replay then sends a prompt of `prompt_tokens` that shares nothing.

use std::time::{Duration, SystemTime};

use router_state::kv_events::{chain_hashes, namespace_seed};
use serde_json::{Value, json};

/// Hex digits of a page hash, most significant first.
const DIGITS: &[u8; 16] = b"0123456789abcdef";

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

/// The `replay` object of a request that arrived `waited` before `now`.
pub(crate) fn fields(prompt: Prompt<'_>, now: SystemTime, waited: Duration) -> Value {
    let arrival_unix_us = now
        .checked_sub(waited)
        .and_then(|at| at.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let mut fields = json!({
        "arrival_unix_us": arrival_unix_us,
        "prompt_tokens": prompt.tokens,
        "block_size": prompt.block_size,
    });
    if let Some(ids) = prompt.token_ids {
        let pages = chain_hashes(
            ids,
            prompt.block_size as usize,
            namespace_seed(prompt.namespace),
        );
        fields["pages"] = Value::String(hex(&pages));
    }
    fields
}

/// `pages` as 16 lowercase hex digits each, most significant first.
fn hex(pages: &[u64]) -> String {
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
    use super::*;

    #[test]
    fn pages_are_the_index_hashes_in_hex_and_the_arrival_is_when_the_request_came() {
        let ids: Vec<u32> = (0..40).collect();
        let prompt = Prompt {
            token_ids: Some(&ids),
            tokens: 40,
            block_size: 16,
            namespace: Some("adapter"),
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_micros(5_000_000);
        let fields = fields(prompt, now, Duration::from_micros(1_500));
        let hashes = chain_hashes(&ids, 16, namespace_seed(Some("adapter")));
        assert_eq!(hashes.len(), 2, "two full pages of 16 in 40 tokens");
        let expected = format!("{:016x}{:016x}", hashes[0], hashes[1]);
        assert_eq!(fields["pages"], expected.as_str());
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
        let fields = fields(prompt, SystemTime::now(), Duration::ZERO);
        assert_eq!(fields["prompt_tokens"], 300);
        assert!(fields.get("pages").is_none());
    }

    #[test]
    fn hex_is_sixteen_digits_a_page() {
        assert_eq!(
            hex(&[0, u64::MAX, 0x0123_4567_89ab_cdef]),
            "0000000000000000ffffffffffffffff0123456789abcdef"
        );
    }
}
