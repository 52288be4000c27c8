//! Windowed tokenization of a long prompt.
//!
//! A window of the prompt is tokenized whole, and only its tokens before a *split
//! point* are kept; the next window starts there. A split point is where a pre-token
//! (a "word" of the tokenizer's pre-tokenizer) begins, with at least [`TAIL_WORDS`]
//! more whole words after it in the window, at a visible ASCII character (so no
//! normalizer composes across it), and not inside an added token. Pre-tokenizers split
//! by a regular expression whose matches depend on at most a few words of what
//! follows; three words of margin keep the words before the split point exactly as
//! the whole prompt would have them, and BPE never merges across words. A stretch
//! with no split point doubles the window, up to [`MAX_WINDOW`]; past that the rest
//! is left untokenized (and counted by its size).
//!
//! A tokenizer that adds something at the start of a text (a Metaspace pre-tokenizer
//! that prepends `▁`, a byte-level one with `add_prefix_space`, a `Prepend`
//! normalizer) would add it at every window's start: its prompts are tokenized in one
//! window of at most [`MAX_WINDOW`], and what is past its split point is counted by
//! its size.

use serde_json::Value;

use super::{EncodeError, General, PromptTokens};

/// The usual window, in bytes.
pub(super) const WINDOW: usize = 256 << 10;
/// The largest window: the bound on the text tokenized at once.
pub(super) const MAX_WINDOW: usize = 2 << 20;
/// Whole words a window keeps after its split point.
const TAIL_WORDS: usize = 3;

/// The token ids of `prompt`, tokenized in windows of `window` bytes growing up to
/// `max_window`.
pub(super) fn encode(
    tokenizer: &General,
    prompt: &str,
    mut window: usize,
    max_window: usize,
) -> Result<PromptTokens, EncodeError> {
    let encode = |text: &str| {
        tokenizer
            .tokenizer
            .encode(text, false)
            .map_err(EncodeError::Tokenizer)
    };
    if !tokenizer.windows {
        window = max_window;
    }
    let mut ids = Vec::new();
    let mut rest = prompt;
    let first_window = window;
    loop {
        if rest.len() <= window {
            ids.extend_from_slice(encode(rest)?.get_ids());
            return Ok(PromptTokens {
                ids,
                untokenized_bytes: 0,
                counted_tokens: 0,
            });
        }
        // A window never ends inside an added token: the whole prompt has the token
        // split out, the window would have its pieces as text.
        let mut end = rest.floor_char_boundary(window);
        if let Some((start, len)) = added_around(rest, end, &tokenizer.added) {
            end = if start > 0 { start } else { len };
        }
        let text = &rest[..end];
        let encoding = encode(text)?;
        match split_point(
            text,
            encoding.get_word_ids(),
            encoding.get_offsets(),
            &tokenizer.added,
        ) {
            Some((token, byte)) => {
                ids.extend_from_slice(&encoding.get_ids()[..token]);
                rest = &rest[byte..];
                window = first_window;
                if !tokenizer.windows {
                    return Ok(PromptTokens {
                        ids,
                        untokenized_bytes: rest.len(),
                        counted_tokens: 0,
                    });
                }
            }
            None if window < max_window => window *= 2,
            None => {
                tracing::warn!(
                    untokenized_bytes = rest.len(),
                    "a prompt has no point to split its tokenization within {max_window} bytes; the rest is counted by its size"
                );
                return Ok(PromptTokens {
                    ids,
                    untokenized_bytes: rest.len(),
                    counted_tokens: 0,
                });
            }
        }
    }
}

/// The last split point of a window: the index of the first token after it and its
/// byte offset in `text`.
fn split_point(
    text: &str,
    words: &[Option<u32>],
    offsets: &[(usize, usize)],
    added: &[String],
) -> Option<(usize, usize)> {
    let mut words_after = 0;
    for token in (1..words.len()).rev() {
        if words[token].is_none() || words[token] == words[token - 1] {
            continue;
        }
        words_after += 1;
        // The last word may be cut by the window's end: it does not count.
        if words_after <= TAIL_WORDS {
            continue;
        }
        let byte = offsets[token].0;
        // Adjacent offsets: a start moved past a space (trimmed offsets) is no split
        // point, and neither is the window's start.
        let starts_word = byte > 0 && offsets[token - 1].1 == byte;
        let visible_ascii = text.as_bytes().get(byte).is_some_and(u8::is_ascii_graphic);
        if starts_word && visible_ascii && added_around(text, byte, added).is_none() {
            return Some((token, byte));
        }
    }
    None
}

/// Whether the tokenizer's normalizer or pre-tokenizer adds something at the start
/// of a text.
pub(super) fn prepends(tokenizer: &tokenizers::Tokenizer) -> bool {
    let Ok(json) = serde_json::from_str::<Value>(&tokenizer.to_string(false).unwrap_or_default())
    else {
        return true;
    };
    [&json["normalizer"], &json["pre_tokenizer"]]
        .into_iter()
        .any(prepending)
}

fn prepending(value: &Value) -> bool {
    match value {
        Value::Object(fields) => {
            let kind = fields.get("type").and_then(Value::as_str);
            let scheme = fields.get("prepend_scheme").and_then(Value::as_str);
            let prefix_space = fields.get("add_prefix_space") == Some(&Value::Bool(true));
            match kind {
                Some("Prepend") => true,
                Some("Metaspace") => scheme.map_or(prefix_space, |s| s != "never"),
                Some("ByteLevel") => prefix_space,
                _ => fields.values().any(prepending),
            }
        }
        Value::Array(items) => items.iter().any(prepending),
        _ => false,
    }
}

/// An added token whose text covers both sides of `byte`: its start and length.
fn added_around(text: &str, byte: usize, added: &[String]) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    added.iter().find_map(|token| {
        let len = token.len();
        let from = byte.saturating_sub(len - 1);
        let to = (byte + len - 1).min(bytes.len());
        bytes
            .get(from..to)?
            .windows(len)
            .position(|candidate| candidate == token.as_bytes())
            .map(|at| (from + at, len))
            .filter(|(start, _)| *start < byte)
    })
}

#[cfg(test)]
mod tests;
