//! Prompt tokenization with a model's `tokenizer.json` and chat template, rendered as
//! Hugging Face transformers renders it (what SGLang and vLLM use).
//!
//! Byte-level BPE tokenizers (GPT-2, Qwen, Llama 3 and their kin) are encoded by an
//! exact encoder of their own (`bytelevel`); any other by `tokenizers`, a long
//! prompt in windows of about 256 KiB (`window`), so its working memory (about a
//! hundred times the text) stays bounded whatever the prompt's size, and the ids are
//! still exactly those of the whole. Long prompts' prefixes are kept
//! ([`ChatTokenizer::with_prefix_cache`]), so a conversation's next turn tokenizes
//! only what is new; [`TokenizePool`] runs tokenization on threads of its own. This
//! crate knows nothing of HTTP or of routing.
//!
//! ```
//! use router_tokenize::{ChatRequest, ChatTokenizer};
//!
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/tokenizer-tiny");
//! let tokenizer = ChatTokenizer::load(format!("{dir}/tokenizer.json").as_ref())?;
//! let chat = tokenizer.encode_chat(&ChatRequest {
//!     messages: r#"[{"role": "user", "content": "hello world"}]"#,
//!     ..ChatRequest::default()
//! })?;
//! assert_eq!(chat.ids, [1, 2, 4, 5, 3]);
//! assert_eq!(tokenizer.encode_text("hello world", false)?.ids, [4, 5]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Why a model's tokenizer could not be loaded: the file at fault and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}", file.display())]
pub struct TokenizerError {
    /// `tokenizer.json`, or the `tokenizer_config.json` beside it.
    pub file: PathBuf,
    /// What is wrong with it.
    pub problem: String,
}

/// Why a prompt could not be tokenized.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A part of the chat request the template reads is not what it must be.
    #[error("{message}")]
    Request {
        /// The request field at fault.
        param: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The model's tokenizer has no chat template to render a chat with.
    #[error("the model's tokenizer has no chat template")]
    NoChatTemplate,
    /// The chat template failed on the messages (it may raise an exception itself).
    #[error("the chat template failed: {0}")]
    Template(minijinja::Error),
    /// The tokenizer failed on the text.
    #[error("tokenization failed: {0}")]
    Tokenizer(tokenizers::Error),
}

impl TokenizerError {
    fn at(file: &Path, problem: impl std::fmt::Display) -> Self {
        Self {
            file: file.to_path_buf(),
            problem: problem.to_string(),
        }
    }
}

mod bytelevel;
mod chat;
mod media;
mod pool;
mod prefixes;
#[cfg(test)]
#[path = "../../../tests/python_env.rs"]
mod python_env;
mod template;
mod window;

pub use chat::{
    ChatRequest, Dialect, MAX_TEMPLATE_KWARGS, MAX_TOOL_ARGUMENT_VALUES, count_json_values,
};
use chat::{Media, Rendering};
pub use media::DEFAULT_MEDIA_PART_TOKENS;
pub use pool::TokenizePool;
use prefixes::PrefixCache;
pub use prefixes::PrefixCacheStats;
use template::{ChatTemplate, KnownTools};
pub use template::{MAX_KEPT_TOOLS_BYTES, MAX_PROMPT_BYTES};

/// A prompt's token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptTokens {
    /// The ids, exactly as the whole prompt tokenizes (of its first part, when
    /// `untokenized_bytes` is not 0).
    pub ids: Vec<u32>,
    /// Bytes at the end of the prompt left untokenized: a stretch of more than
    /// 2 MiB without a point where tokenization may be split.
    pub untokenized_bytes: usize,
    /// Tokens of the prompt past `ids` counted, not given: a chat's text from its
    /// first media part on, and each media part at the model's bound
    /// ([`ChatTokenizer::with_media_part_tokens`]).
    pub counted_tokens: u64,
}

/// A model's tokenizer and chat template, loaded once at startup.
#[derive(Debug)]
pub struct ChatTokenizer {
    encoder: Encoder,
    /// Long prompts' prefixes, for the byte-level encoder.
    prefixes: PrefixCache,
    /// The chat template, when the model has one.
    template: Option<ChatTemplate>,
    /// The engine whose way of rendering a chat request is followed.
    dialect: Dialect,
    /// The tool sets seen, ready for the template.
    known_tools: KnownTools,
    /// The tokens each media part of a chat is counted as: as given, else the
    /// bound the model's processor configuration gives.
    media_part_tokens: (Option<u32>, u32),
}

/// How a rendered prompt becomes ids.
#[derive(Debug)]
enum Encoder {
    ByteLevel(bytelevel::ByteLevelBpe),
    General(General),
}

/// The most bytes a chat sending a kept tool set may tokenize anew for the set to
/// stay cheap ([`ChatTokenizer::knows_tools`]): twice what a small chat's rest is.
pub const COSTLY_FRESH_BYTES: usize = 4 << 10;

/// The text a chat's media parts are given in the second render of
/// [`ChatTokenizer::encode_chat`]: a control character no template writes.
const MEDIA_MARK: &str = "\u{2}";

impl Encoder {
    /// Where `text`'s last added token ends (0: it holds none): the ids of the
    /// text up to there are those of any text that starts with it.
    fn last_split(&self, text: &str) -> usize {
        match self {
            Encoder::ByteLevel(encoder) => encoder.added_ends(text).max().unwrap_or(0),
            Encoder::General(general) => general.added_matcher.as_ref().map_or(0, |matcher| {
                matcher
                    .find_iter(text)
                    .map(|found| found.end())
                    .last()
                    .unwrap_or(0)
            }),
        }
    }
}

/// A tokenizer `tokenizers` encodes, with what windowed tokenization needs of it.
#[derive(Debug)]
pub(crate) struct General {
    tokenizer: tokenizers::Tokenizer,
    /// The added tokens' texts: a window never ends inside one.
    added: Vec<String>,
    /// Finds them all in one pass (`None`: the tokenizer has none).
    added_matcher: Option<aho_corasick::AhoCorasick>,
    /// Whether a prompt may be tokenized in several windows: not when the
    /// normalizer or pre-tokenizer adds something at the start of a text (a window
    /// would add it where the whole prompt does not).
    windows: bool,
    /// The special tokens' ids the post-processor puts before and after a sequence
    /// (a completion's prompt); `None` when they could not be worked out.
    around: Option<(Vec<u32>, Vec<u32>)>,
}

impl General {
    fn load(path: &Path) -> Result<Self, TokenizerError> {
        // `tokenizers` panics on some malformed files (a merge whose joined token is
        // missing and longer than any in the vocabulary) instead of refusing them.
        let loaded = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_file(path))
            .map_err(|_| TokenizerError::at(path, "tokenizers could not read it (it panicked)"))?;
        let mut tokenizer = loaded.map_err(|e| TokenizerError::at(path, e))?;
        // Routing needs the prompt's true length: no truncation, no padding.
        tokenizer
            .with_truncation(None)
            .map_err(|e| TokenizerError::at(path, e))?;
        tokenizer.with_padding(None);
        let windows = !window::prepends(&tokenizer);
        let added: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .map(|token| token.content)
            .filter(|content| !content.is_empty())
            .collect();
        let added_matcher = aho_corasick::AhoCorasick::new(&added)
            .ok()
            .filter(|_| !added.is_empty());
        let around = special_tokens_around(&tokenizer);
        if around.is_none() {
            tracing::warn!(
                tokenizer = %path.display(),
                "the special tokens the tokenizer adds around a sequence could not be worked out: completion prompts and embedding inputs are counted without them"
            );
        }
        Ok(Self {
            tokenizer,
            added,
            added_matcher,
            windows,
            around,
        })
    }
}

impl ChatTokenizer {
    /// Loads `tokenizer.json` and the `tokenizer_config.json` beside it, with no
    /// prefix cache ([`with_prefix_cache`](Self::with_prefix_cache) gives it one).
    ///
    /// # Errors
    /// The file at fault and what is wrong with it.
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let encoder = match bytelevel::ByteLevelBpe::load(path) {
            Some(encoder) => Encoder::ByteLevel(encoder),
            None => Encoder::General(General::load(path)?),
        };
        let config_path = path.with_file_name("tokenizer_config.json");
        let at_config = |e: &dyn std::fmt::Display| TokenizerError::at(&config_path, e);
        let text = std::fs::read_to_string(&config_path).map_err(|e| at_config(&e))?;
        let config: Value = serde_json::from_str(&text).map_err(|e| at_config(&e))?;
        // A base model may have no chat template: its completions are still tokenized.
        let template = ChatTemplate::load(&config).map_err(|e| at_config(&e))?;
        Ok(Self {
            encoder,
            prefixes: PrefixCache::new(0),
            template,
            dialect: Dialect::default(),
            known_tools: KnownTools::default(),
            media_part_tokens: (None, media::part_tokens(path)),
        })
    }

    /// Counts each image, audio or video part of a chat as `tokens` (by default, the
    /// bound the model's `preprocessor_config.json` gives, else
    /// [`DEFAULT_MEDIA_PART_TOKENS`]).
    #[must_use]
    pub fn with_media_part_tokens(mut self, tokens: u32) -> Self {
        self.media_part_tokens.0 = Some(tokens);
        self
    }

    /// Keeps at most `bytes` of long prompts' prefixes' token ids (0: none), so the
    /// next turn of a conversation tokenizes only what is new (byte-level BPE
    /// tokenizers only; others encode every prompt whole).
    #[must_use]
    pub fn with_prefix_cache(mut self, bytes: usize) -> Self {
        self.prefixes = PrefixCache::new(bytes);
        self
    }

    /// Renders chat requests as `dialect`'s engine does (SGLang by default).
    #[must_use]
    pub fn with_dialect(mut self, dialect: Dialect) -> Self {
        self.dialect = dialect;
        self
    }

    /// The engine whose way of rendering a chat request is followed.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The tokens each media part of a chat was given to count as
    /// ([`with_media_part_tokens`](Self::with_media_part_tokens)); `None`: the bound
    /// of the model's processor configuration, or the default.
    pub fn media_part_tokens(&self) -> Option<u32> {
        self.media_part_tokens.0
    }

    /// What the prefix cache has done and holds.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.prefixes.stats()
    }

    /// A completion's prompt as it is, with the special tokens the tokenizer adds
    /// around a sequence when `special_tokens` (as vLLM and SGLang tokenize
    /// `/v1/completions` prompts, `add_special_tokens` true unless the request says
    /// otherwise). A tokenizer whose post-processor is not understood adds none.
    ///
    /// # Errors
    /// The tokenizer failed on it.
    pub fn encode_text(
        &self,
        text: &str,
        special_tokens: bool,
    ) -> Result<PromptTokens, EncodeError> {
        let (around, body) = match &self.encoder {
            Encoder::ByteLevel(encoder) => {
                let (ids, untokenized_bytes) = self.prefixes.encode(encoder, text);
                let body = PromptTokens {
                    ids,
                    untokenized_bytes,
                    counted_tokens: 0,
                };
                (encoder.around(), body)
            }
            Encoder::General(general) => {
                let body = window::encode(general, text, window::WINDOW, window::MAX_WINDOW)?;
                (general.around.as_ref(), body)
            }
        };
        let (before, after) = match around {
            Some((before, after)) if special_tokens => (&before[..], &after[..]),
            _ => (&[][..], &[][..]),
        };
        let mut ids = Vec::with_capacity(before.len() + body.ids.len() + after.len());
        ids.extend_from_slice(before);
        ids.extend(body.ids);
        if body.untokenized_bytes == 0 {
            ids.extend_from_slice(after);
        }
        Ok(PromptTokens {
            ids,
            untokenized_bytes: body.untokenized_bytes,
            counted_tokens: 0,
        })
    }

    /// Whether the tool set `tools` with `tool_choice` was seen before, is kept
    /// ready for the template, and chats sending it again tokenized little anew (at
    /// most [`COSTLY_FRESH_BYTES`]: the prefix cache gave the ids of the part of the
    /// prompt holding the tools): its size costs little again. A kept set whose
    /// chats did tokenize more is not.
    pub fn knows_tools(&self, tools: &str, tool_choice: Option<&str>) -> bool {
        self.known_tools
            .cheap(tools, tool_choice.unwrap_or_default())
    }

    /// Renders a chat request as the engine serving the model renders it (its
    /// messages, tools, documents and template arguments; see [`Dialect`]) and
    /// returns the prompt's token ids. The template adds any special tokens: the
    /// rendered text is tokenized without them, as both engines tokenize it.
    ///
    /// # Errors
    /// A part of the request is not what it must be, or the template or the
    /// tokenizer failed. A chat holding media (an image, audio, video) gives the ids
    /// of its prompt up to the first media part, the rest counted
    /// ([`PromptTokens::counted_tokens`]).
    pub fn encode_chat(&self, request: &ChatRequest<'_>) -> Result<PromptTokens, EncodeError> {
        let template = self.template.as_ref().ok_or(EncodeError::NoChatTemplate)?;
        let rendering = chat::rendering(
            self.dialect,
            template,
            request,
            Media::Part,
            &self.known_tools,
        )?;
        let mut prompt = self.render(template, &rendering)?;
        if rendering.media > 0 {
            let (mut tokens, reused) =
                self.encode_before_media(template, request, &prompt, rendering.media)?;
            self.learn_tools_cost(request, &rendering, prompt.len() - reused);
            if let Some(suffix) = &rendering.suffix {
                // SGLang's continued final message, after the media: counted.
                let more = self.encode_rendered(suffix)?;
                tokens.counted_tokens += more.ids.len() as u64 + more.counted_tokens;
                tokens.untokenized_bytes += more.untokenized_bytes;
            }
            return Ok(tokens);
        }
        if let Some(text) = &rendering.cut_after {
            // transformers' `continue_final_message`: the prompt ends where the final
            // message's text does.
            let found = prompt
                .rfind(text.as_str())
                .map(|at| at + text.len())
                .or_else(|| prompt.rfind(text.trim()).map(|at| at + text.trim().len()));
            match found {
                Some(end) => prompt.truncate(end),
                None => {
                    return Err(EncodeError::Request {
                        param: "continue_final_message",
                        message: "the final message is not in the rendered prompt".to_owned(),
                    });
                }
            }
        }
        let (mut tokens, reused) = self.encode_rendered_reusing(&prompt)?;
        self.learn_tools_cost(request, &rendering, prompt.len() - reused);
        if let Some(suffix) = &rendering.suffix {
            // SGLang tokenizes a continued final message apart, without a BOS.
            let mut more = self.encode_rendered(suffix)?;
            if tokens.untokenized_bytes == 0 {
                tokens.ids.append(&mut more.ids);
                tokens.untokenized_bytes = more.untokenized_bytes;
            }
        }
        Ok(tokens)
    }

    /// A chat holding `parts` media parts: the ids of its prompt up to the first
    /// media part (the text `prompt`, its render, shares with a render giving each
    /// media part as a text of its own, cut after its last added token there). The
    /// rest of `prompt` (which holds the template's marks for each part, not the
    /// media) is tokenized to be counted, and each part counted at the model's
    /// bound: the prompt's length is never below what the engine's processor makes
    /// of it while each part is within the bound. Also gives the bytes of `prompt`
    /// whose ids the prefix cache gave.
    fn encode_before_media(
        &self,
        template: &ChatTemplate,
        request: &ChatRequest<'_>,
        prompt: &str,
        parts: usize,
    ) -> Result<(PromptTokens, usize), EncodeError> {
        let other = chat::rendering(
            self.dialect,
            template,
            request,
            Media::Text(MEDIA_MARK),
            &self.known_tools,
        )?;
        let other = self.render(template, &other)?;
        let shared = prompt
            .char_indices()
            .zip(other.chars())
            .find(|((_, a), b)| a != b)
            .map_or(prompt.len().min(other.len()), |((at, _), _)| at);
        let cut = self.encoder.last_split(&prompt[..shared]);
        let (mut tokens, reused) = self.encode_rendered_reusing(&prompt[..cut])?;
        let rest = self.encode_rendered(&prompt[cut..])?;
        tokens.untokenized_bytes += rest.untokenized_bytes;
        tokens.counted_tokens = rest.ids.len() as u64
            + rest.counted_tokens
            + parts as u64
                * u64::from(self.media_part_tokens.0.unwrap_or(self.media_part_tokens.1));
        Ok((tokens, reused))
    }

    /// Renders `rendering`; for SGLang, a render failing with tools is tried once
    /// more with each tool given as its `function` object, as SGLang does.
    fn render(
        &self,
        template: &ChatTemplate,
        rendering: &Rendering,
    ) -> Result<String, EncodeError> {
        match template.render(rendering) {
            Err(first) if self.dialect == Dialect::Sglang => {
                match rendering.with_function_tools() {
                    Some(again) => template
                        .render(&again)
                        .map_err(|_| EncodeError::Template(first)),
                    None => Err(EncodeError::Template(first)),
                }
            }
            rendered => rendered.map_err(EncodeError::Template),
        }
    }

    /// Marks a kept tool set costly when a chat sending it again tokenized more than
    /// [`COSTLY_FRESH_BYTES`] anew (`fresh`): its tools' part of the prompt was not
    /// in the prefix cache.
    fn learn_tools_cost(&self, request: &ChatRequest<'_>, rendering: &Rendering, fresh: usize) {
        if let Some(tools) = request.tools
            && rendering.kept_tools
            && fresh > COSTLY_FRESH_BYTES
        {
            self.known_tools
                .mark_costly(tools, request.tool_choice.unwrap_or_default());
        }
    }

    /// A rendered prompt's ids, and how many of its bytes the prefix cache gave.
    fn encode_rendered_reusing(&self, prompt: &str) -> Result<(PromptTokens, usize), EncodeError> {
        match &self.encoder {
            Encoder::ByteLevel(encoder) => {
                let (ids, untokenized_bytes, reused) =
                    self.prefixes.encode_reusing(encoder, prompt);
                let tokens = PromptTokens {
                    ids,
                    untokenized_bytes,
                    counted_tokens: 0,
                };
                Ok((tokens, reused))
            }
            Encoder::General(_) => Ok((self.encode_rendered(prompt)?, 0)),
        }
    }

    /// A rendered prompt's ids, without added special tokens.
    fn encode_rendered(&self, prompt: &str) -> Result<PromptTokens, EncodeError> {
        match &self.encoder {
            Encoder::ByteLevel(encoder) => {
                let (ids, untokenized_bytes) = self.prefixes.encode(encoder, prompt);
                Ok(PromptTokens {
                    ids,
                    untokenized_bytes,
                    counted_tokens: 0,
                })
            }
            Encoder::General(general) => {
                window::encode(general, prompt, window::WINDOW, window::MAX_WINDOW)
            }
        }
    }
}

/// The ids `tokenizer` puts before and after a sequence when it adds special tokens:
/// a text encoded with them, less the same text encoded without; `None` when no
/// probe text shows it.
fn special_tokens_around(tokenizer: &tokenizers::Tokenizer) -> Option<(Vec<u32>, Vec<u32>)> {
    ["a", "hello", "0", "."].into_iter().find_map(|probe| {
        let with = tokenizer.encode(probe, true).ok()?.get_ids().to_vec();
        let without = tokenizer.encode(probe, false).ok()?.get_ids().to_vec();
        if without.is_empty() {
            return None;
        }
        let at = (0..=with.len().saturating_sub(without.len()))
            .find(|&i| with[i..].starts_with(&without))?;
        Some((with[..at].to_vec(), with[at + without.len()..].to_vec()))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn renders_the_template_and_tokenizes() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/tokenizer-tiny/tokenizer.json");
        let t = ChatTokenizer::load(&path).unwrap();
        let messages = json!([{"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}]);
        let messages = messages.to_string();
        let chat = ChatRequest {
            messages: &messages,
            ..ChatRequest::default()
        };
        assert_eq!(
            t.encode_chat(&chat).unwrap().ids,
            [1, 2, 4, 5, 3],
            "<s> <|user|> hello world <|assistant|>"
        );
        let missing = ChatTokenizer::load(Path::new("/missing/tokenizer.json")).unwrap_err();
        assert_eq!(missing.file, Path::new("/missing/tokenizer.json"));
        assert!(
            missing.to_string().starts_with("/missing/tokenizer.json: "),
            "{missing}"
        );
    }

    /// The tiny tokenizer with `post_processor` and, beside it, its config without a
    /// chat template, written to a directory of its own.
    fn tiny_base_model(post_processor: serde_json::Value) -> PathBuf {
        let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizer-tiny");
        let mut file: Value =
            serde_json::from_slice(&std::fs::read(testdata.join("tokenizer.json")).unwrap())
                .unwrap();
        file["post_processor"] = post_processor;
        let dir =
            std::env::temp_dir().join(format!("switchyard-base-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), file.to_string()).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), r#"{"bos_token": "<s>"}"#).unwrap();
        dir.join("tokenizer.json")
    }

    #[test]
    fn a_base_model_without_a_chat_template_tokenizes_completions_with_its_special_tokens() {
        let template = json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
        });
        let path = tiny_base_model(template);
        let t = ChatTokenizer::load(&path).unwrap();
        let reference = tokenizers::Tokenizer::from_file(&path).unwrap();
        let with = reference.encode("hello world", true).unwrap();
        assert_eq!(with.get_ids(), [1, 4, 5], "<s> hello world");
        assert_eq!(
            t.encode_text("hello world", true).unwrap().ids,
            with.get_ids()
        );
        assert_eq!(t.encode_text("hello world", false).unwrap().ids, [4, 5]);
        let chat = json!([{"role": "user", "content": "hello"}]).to_string();
        assert!(
            matches!(
                t.encode_chat(&ChatRequest {
                    messages: &chat,
                    ..ChatRequest::default()
                }),
                Err(EncodeError::NoChatTemplate)
            ),
            "a chat is refused"
        );
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
