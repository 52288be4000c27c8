//! Turning chat messages into prompt tokens, and generating output text.
//!
//! With a Hugging Face `tokenizer.json` the engine renders the chat template from the
//! `tokenizer_config.json` beside it as SGLang does (`chat`: the request's messages,
//! tools and template arguments made into the template's variables; `template`: the
//! template compiled as transformers compiles it; `json`: its `tojson`) and
//! tokenizes the result as a real engine does. Without one it uses a deterministic
//! built-in tokenizer: one token per whitespace-separated word, so equal prompts give
//! equal tokens and shared prefixes share tokens (it reads only the messages' roles
//! and text).

mod chat;
mod json;
mod template;

use std::path::Path;

use minijinja::Value;
use minijinja::value::ValueKind;

pub(crate) use self::chat::{Chat, check};
use self::template::ChatTemplate;

/// Why a tokenizer could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("loading tokenizer {path}: {message}")]
pub struct TokenizerError {
    path: String,
    message: String,
}

/// A prompt tokenizer.
#[derive(Debug)]
pub(crate) enum Tokenizer {
    BuiltIn,
    HuggingFace(Box<HfTokenizer>),
}

#[derive(Debug)]
pub(crate) struct HfTokenizer {
    tokenizer: tokenizers::Tokenizer,
    template: ChatTemplate,
}

impl Tokenizer {
    /// Loads `tokenizer.json` and the chat template of the `tokenizer_config.json`
    /// beside it.
    pub(crate) fn load(path: &Path) -> Result<Self, TokenizerError> {
        let error = |message: String| TokenizerError {
            path: path.display().to_string(),
            message,
        };
        let tokenizer = tokenizers::Tokenizer::from_file(path).map_err(|e| error(e.to_string()))?;
        let config_path = path.with_file_name("tokenizer_config.json");
        let config: serde_json::Value = std::fs::read_to_string(&config_path)
            .map_err(|e| error(format!("{}: {e}", config_path.display())))
            .and_then(|text| {
                serde_json::from_str(&text)
                    .map_err(|e| error(format!("{}: {e}", config_path.display())))
            })?;
        let template = ChatTemplate::load(&config).map_err(error)?;
        Ok(Tokenizer::HuggingFace(Box::new(HfTokenizer {
            tokenizer,
            template,
        })))
    }

    /// Tokenizes a completion prompt as it is, with the special tokens the tokenizer
    /// adds around a sequence (what vLLM and SGLang do for `/v1/completions`).
    pub(crate) fn encode_text(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Tokenizer::BuiltIn => Ok(text.split_whitespace().map(word_token).collect()),
            Tokenizer::HuggingFace(hf) => hf
                .tokenizer
                .encode(text, true)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(|e| e.to_string()),
        }
    }

    /// Renders the conversation for generation and tokenizes it.
    pub(crate) fn encode_chat(&self, chat: &Chat<'_>) -> Result<Vec<u32>, String> {
        match self {
            Tokenizer::BuiltIn => {
                let mut tokens = Vec::new();
                for message in chat.messages {
                    let role = message.get_attr("role").unwrap_or_default();
                    tokens.push(word_token(&format!("<|{role}|>")));
                    tokens.extend(built_in_text(message).split_whitespace().map(word_token));
                }
                tokens.push(word_token("<|assistant|>"));
                Ok(tokens)
            }
            Tokenizer::HuggingFace(hf) => {
                let prompt = hf.template.render(chat)?;
                let encoding = hf
                    .tokenizer
                    .encode(prompt, false)
                    .map_err(|e| e.to_string())?;
                Ok(encoding.get_ids().to_vec())
            }
        }
    }
}

/// A message's text as the built-in tokenizer reads it: its `content`, or the
/// `text` of each of its parts, run together.
fn built_in_text(message: &Value) -> String {
    let content = message.get_attr("content").unwrap_or_default();
    match content.kind() {
        ValueKind::String => content.to_string(),
        ValueKind::Seq => content
            .try_iter()
            .map(|parts| {
                parts
                    .filter_map(|part| {
                        let text = part.get_attr("text").ok()?;
                        (text.kind() == ValueKind::String).then(|| text.to_string())
                    })
                    .collect()
            })
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// FNV-1a of a word, folded into a 50k vocabulary above the 256 reserved ids.
fn word_token(word: &str) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in word.bytes() {
        hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
    }
    256 + hash % 50_000
}

const WORDS: &[&str] = &[
    "the", "router", "sends", "each", "request", "to", "an", "engine", "that", "holds", "its",
    "prefix", "and", "has", "room", "for", "one", "more", "so", "time", "to", "first", "token",
    "stays", "low",
];

/// The text of output token `index` of a response whose prompt had `prompt_len`
/// tokens: deterministic, one word per token.
pub(crate) fn output_word(prompt_len: usize, index: u64) -> &'static str {
    WORDS[(prompt_len + index as usize) % WORDS.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: &str) -> Value {
        Value::from_iter([("role", role), ("content", content)])
    }

    fn chat(messages: &[Value]) -> Chat<'_> {
        Chat {
            messages,
            tools: None,
            tool_choice: None,
            template_kwargs: None,
        }
    }

    #[test]
    fn the_built_in_tokenizer_is_deterministic_and_prefix_preserving() {
        let t = Tokenizer::BuiltIn;
        let short = t
            .encode_chat(&chat(&[message("user", "hello there")]))
            .unwrap();
        let again = t
            .encode_chat(&chat(&[message("user", "hello there")]))
            .unwrap();
        assert_eq!(short, again);
        assert_eq!(short.len(), 4, "role marker, two words, generation marker");
        let turn = t
            .encode_chat(&chat(&[
                message("user", "hello there"),
                message("assistant", "hi"),
                message("user", "more"),
            ]))
            .unwrap();
        assert_eq!(
            turn[..3],
            short[..3],
            "a later turn extends the earlier prompt"
        );
        assert!(short.iter().all(|&id| (256..50_256).contains(&id)));
    }

    #[test]
    fn a_hugging_face_tokenizer_renders_the_chat_template_then_tokenizes() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/tokenizer-tiny/tokenizer.json");
        let t = Tokenizer::load(&path).unwrap();
        let ids = t
            .encode_chat(&chat(&[
                message("user", "hello world "),
                message("assistant", "again"),
                message("user", "again"),
            ]))
            .unwrap();
        assert_eq!(
            ids,
            [1, 2, 4, 5, 3, 6, 2, 6, 3],
            "<s> <|user|> hello world <|assistant|> again <|user|> again <|assistant|>"
        );
        let ending = t
            .encode_chat(&chat(&[
                message("user", "hello"),
                message("assistant", "again"),
            ]))
            .unwrap();
        assert_eq!(
            ending,
            [1, 2, 4, 2, 6, 3],
            "a final assistant message is rendered as a user one, as SGLang does"
        );
        let unknown = t.encode_chat(&chat(&[message("system", "x")])).unwrap();
        assert_eq!(unknown, [1, 0, 0, 3], "unknown words map to [UNK]");
    }

    #[test]
    fn a_missing_tokenizer_file_names_the_path() {
        let err = Tokenizer::load(Path::new("/nonexistent/tokenizer.json")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("loading tokenizer /nonexistent/tokenizer.json:"),
            "{err}"
        );
    }
}
