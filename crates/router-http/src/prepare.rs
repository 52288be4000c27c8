//! Request preparation: an endpoint validates its body with precise 400s and names its
//! prompt; preparation then works out the routing facts (model, prompt length,
//! output budget, token ids).
//!
//! The body is read once, borrowing from the original bytes; the prompt is only
//! parsed when the model's prompts are tokenized (its route can depend on them). The
//! original bytes are what is forwarded.

mod chat;
mod checks;
mod completions;
mod embeddings;
mod generate;
mod owned;

use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::error::ApiError;
use completions::CompletionPrompts;
pub(crate) use owned::rewrite;
use router_tokenize::{ChatRequest, ChatTokenizer, EncodeError, PromptTokens, TokenizePool};

/// An endpoint the router serves: its path (the same on the engine) and how its body
/// is read. A new endpoint is one module with a parser, one value here and one route.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// The route path, and the path the request is sent to on the engine.
    pub(crate) path: &'static str,
    /// Validates a body and finds its routing facts.
    parse: fn(&[u8]) -> Result<Parsed<'_>, ApiError>,
    /// Whether only plain engines serve it (prefill/decode engines generate).
    pub(crate) plain_only: bool,
    /// Whether vLLM's prefill/decode hand-over serves it (its OpenAI endpoints).
    pub(crate) vllm_pd: bool,
}

/// `POST /v1/chat/completions`.
pub(crate) const CHAT: Endpoint = Endpoint {
    path: "/v1/chat/completions",
    parse: chat::parse,
    plain_only: false,
    vllm_pd: true,
};

/// `POST /v1/completions`.
pub(crate) const COMPLETIONS: Endpoint = Endpoint {
    path: "/v1/completions",
    parse: completions::parse,
    plain_only: false,
    vllm_pd: true,
};

/// `POST /v1/embeddings`.
pub(crate) const EMBEDDINGS: Endpoint = Endpoint {
    path: "/v1/embeddings",
    parse: embeddings::parse,
    plain_only: true,
    vllm_pd: false,
};

/// `POST /generate` (SGLang's native endpoint).
pub(crate) const GENERATE: Endpoint = Endpoint {
    path: "/generate",
    parse: generate::parse,
    plain_only: false,
    vllm_pd: false,
};

/// The largest body whose prompt is tokenized on the request's own thread (less a
/// tool set seen before: [`Prompt::costly_bytes`]): at most a few hundred tokens,
/// tens of microseconds with the byte-level encoder, while handing a prompt to a
/// tokenizing thread and back costs about as much again in CPU and latency
/// (docs/BENCHMARKS.md).
pub(crate) const INLINE_BODY_BYTES: usize = 2 << 10;

/// What an endpoint's parser finds in a valid body.
#[derive(Debug)]
pub(crate) struct Parsed<'b> {
    /// Whether the body sent a field the router owns (`owned::OWNED`).
    owned: bool,
    /// The model named (SGLang's `/generate` may name none).
    model: Option<String>,
    /// Whether the answer is streamed (its head comes before the generation).
    stream: bool,
    /// The number of prompts of a batch: set when the prompt is a list of prompts,
    /// which the engines take as a batch even of one.
    batch: Option<usize>,
    /// The LoRA adapter a field other than `model` names (`/generate`'s `lora_path`).
    adapter: Option<String>,
    prompt: Prompt<'b>,
    max_output_tokens: Option<u64>,
    /// The request's `cache_salt`: its pages are in the salt's cache namespace.
    cache_salt: Option<String>,
    /// The request's `priority`, as the engines read it.
    priority: Option<i64>,
}

/// The part of a body that is routed on.
#[derive(Debug)]
enum Prompt<'b> {
    /// A chat, rendered with the model's chat template.
    Chat(ChatPrompt<'b>),
    /// A completion's prompts, tokenized as they are (or token ids already).
    Completion(CompletionPrompts<'b>),
}

/// What of a chat body the chat template reads, as sent.
#[derive(Debug)]
struct ChatPrompt<'b> {
    messages: &'b RawValue,
    tools: Option<&'b RawValue>,
    tool_choice: Option<&'b RawValue>,
    documents: Option<&'b RawValue>,
    chat_template_kwargs: Option<&'b RawValue>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    reasoning_effort: Option<&'b RawValue>,
    /// Whether the tokenizer keeps `tools` as a cheap set
    /// ([`ChatTokenizer::knows_tools`]), once looked up.
    cheap_tools: std::cell::Cell<Option<bool>>,
}

impl ChatPrompt<'_> {
    /// Whether `tokenizer` keeps the chat's tools as a cheap set: looked up once a
    /// request (the lookup hashes the whole `tools` text).
    fn cheap_tools(&self, tokenizer: &ChatTokenizer) -> bool {
        let Some(tools) = self.tools else {
            return false;
        };
        *self.cheap_tools.get().get_or_insert_with(|| {
            tokenizer.knows_tools(tools.get(), self.tool_choice.map(RawValue::get))
        })
    }

    fn request(&self) -> ChatRequest<'_> {
        ChatRequest {
            messages: self.messages.get(),
            tools: self.tools.map(RawValue::get),
            tool_choice: self.tool_choice.map(RawValue::get),
            documents: self.documents.map(RawValue::get),
            chat_template_kwargs: self.chat_template_kwargs.map(RawValue::get),
            add_generation_prompt: self.add_generation_prompt,
            continue_final_message: self.continue_final_message,
            reasoning_effort: self.reasoning_effort.map(RawValue::get),
        }
    }
}

/// A prompt's length and the token ids routed on.
#[derive(Debug)]
pub(crate) struct Counted {
    /// The prompt's length in tokens: of the longest, for several prompts.
    tokens: u64,
    /// The ids of the (first) prompt, of its first part when it was not wholly
    /// tokenized.
    ids: Vec<u32>,
}

impl Counted {
    /// The prompt's length in tokens.
    pub(crate) fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The token ids routed on.
    pub(crate) fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn of(tokens: PromptTokens) -> Self {
        Self {
            tokens: tokens.ids.len() as u64
                + tokens.counted_tokens
                + estimate(tokens.untokenized_bytes),
            ids: tokens.ids,
        }
    }
}

impl Prompt<'_> {
    /// The length and ids the body gives without a tokenizer (token ids as sent,
    /// the first list taken out of the prompt).
    fn given(&mut self) -> Option<Counted> {
        match self {
            Prompt::Completion(CompletionPrompts::Ids(lists)) => Some(Counted {
                tokens: lists.iter().map(|ids| ids.len() as u64).max().unwrap_or(0),
                ids: lists.first_mut().map(std::mem::take).unwrap_or_default(),
            }),
            Prompt::Chat(_) | Prompt::Completion(CompletionPrompts::Texts { .. }) => None,
        }
    }

    /// The prompt's length estimated from its size (`body` bytes in all).
    fn estimate(&self, body: usize) -> u64 {
        let bytes = match self {
            Prompt::Completion(CompletionPrompts::Texts { texts, .. }) => {
                texts.iter().map(|t| t.len()).max().unwrap_or(0)
            }
            Prompt::Chat(_) | Prompt::Completion(CompletionPrompts::Ids(_)) => body,
        };
        estimate(bytes).max(1)
    }

    /// Of `body` bytes in all, those whose tokenization costs: a tool set the
    /// tokenizer keeps from an earlier request is rendered from what it keeps and
    /// its start's ids come from the prefix cache, so it does not count.
    fn costly_bytes(&self, body: usize, tokenizer: &ChatTokenizer) -> usize {
        match self {
            Prompt::Chat(
                chat @ ChatPrompt {
                    tools: Some(tools), ..
                },
            ) if chat.cheap_tools(tokenizer) => body.saturating_sub(tools.get().len()),
            Prompt::Chat(_) | Prompt::Completion(_) => body,
        }
    }

    /// The length and ids `tokenizer` gives (token ids: as sent).
    fn count(&mut self, tokenizer: &ChatTokenizer) -> Result<Counted, ApiError> {
        let texts = match self {
            Prompt::Chat(chat) => {
                chat.check_values(tokenizer)?;
                return match tokenizer.encode_chat(&chat.request()) {
                    Ok(tokens) => Ok(Counted::of(tokens)),
                    Err(EncodeError::Request { param, message }) => {
                        Err(ApiError::invalid("invalid_request", param, message))
                    }
                    Err(e) => Err(ApiError::invalid(
                        "invalid_messages",
                        "messages",
                        e.to_string(),
                    )),
                };
            }
            Prompt::Completion(CompletionPrompts::Ids(_)) => {
                return Ok(self.given().unwrap_or(Counted {
                    tokens: 0,
                    ids: Vec::new(),
                }));
            }
            Prompt::Completion(CompletionPrompts::Texts {
                texts,
                param,
                special_tokens,
            }) => texts.iter().map(|text| {
                tokenizer
                    .encode_text(text, *special_tokens)
                    .map(Counted::of)
                    .map_err(|e| ApiError::invalid("invalid_prompt", *param, e.to_string()))
            }),
        };
        let mut first = None;
        let mut longest = 0;
        for counted in texts {
            let counted = counted?;
            longest = longest.max(counted.tokens);
            first.get_or_insert(counted.ids);
        }
        Ok(Counted {
            tokens: longest,
            ids: first.unwrap_or_default(),
        })
    }
}

/// The routing facts of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prepared {
    /// Whether the body sent a field the router owns, which must be taken out before
    /// it is sent (see [`Prepared::forwarded`]).
    pub(crate) owned: bool,
    pub(crate) stream: bool,
    /// The number of prompts of a batch (see [`Parsed`]).
    pub(crate) batch: Option<usize>,
    /// The LoRA adapter a field other than `model` names (see [`Parsed`]).
    pub(crate) adapter: Option<String>,
    /// The prompt's length in tokens: counted once tokenized, else estimated.
    pub(crate) input_tokens: u64,
    pub(crate) max_output_tokens: Option<u64>,
    pub(crate) token_ids: Option<Vec<u32>>,
    /// The request's `cache_salt` (see [`Parsed`]).
    pub(crate) cache_salt: Option<String>,
    /// The request's `priority` (see [`Parsed`]).
    pub(crate) priority: Option<i64>,
}

impl Prepared {
    /// What is sent of `body` (as validated): the body without the fields the router
    /// owns, which each leg writes itself.
    pub(crate) fn forwarded(&self, body: Bytes) -> Result<Bytes, ApiError> {
        if self.owned {
            owned::without_owned(&body)
        } else {
            Ok(body)
        }
    }

    /// With the prompt's counted length and token ids.
    pub(crate) fn with_tokens(mut self, counted: Counted) -> Self {
        self.input_tokens = counted.tokens;
        self.token_ids = Some(counted.ids);
        self
    }
}

/// The tokenization a request with a large prompt still needs: the costly part of
/// preparation, done apart from the request thread.
#[derive(Debug)]
pub(crate) struct Tokenize {
    endpoint: &'static Endpoint,
    body: Bytes,
    tokenizer: Arc<ChatTokenizer>,
}

impl Tokenize {
    /// The tokenization of `body`'s prompt, read as `endpoint` reads it, by
    /// `tokenizer`.
    pub(crate) fn new(
        endpoint: &'static Endpoint,
        body: Bytes,
        tokenizer: Arc<ChatTokenizer>,
    ) -> Self {
        Self {
            endpoint,
            body,
            tokenizer,
        }
    }

    /// Tokenizes the prompt on this thread (the body is parsed again, borrowing from
    /// it: the prompt is never copied).
    fn run(self) -> Result<Counted, ApiError> {
        let mut parsed = (self.endpoint.parse)(&self.body)?;
        parsed.prompt.count(&self.tokenizer)
    }

    /// Tokenizes the prompt on one of `pool`'s threads, so a large prompt never
    /// stalls the threads that serve requests.
    pub(crate) async fn off_thread(self, pool: &TokenizePool) -> Result<Counted, ApiError> {
        pool.run(move || self.run())
            .await
            .ok_or_else(|| ApiError::internal("tokenization failed"))?
    }
}

/// Validates `body` as `endpoint` reads it; `tokenizer(model)` gives the tokenizer of
/// the model named (or of the one served, when none is), `Ok(None)` for a model whose
/// prompts are not tokenized, or the error for a model not served. Token ids sent as
/// the prompt are routed on as they are. A prompt in a body of at most
/// [`INLINE_BODY_BYTES`] (less a tool set the tokenizer keeps) is tokenized here,
/// where it costs less than handing it to another thread and back; a larger one's
/// tokenization is returned, to be run off the request thread.
pub(crate) fn prepare(
    endpoint: &'static Endpoint,
    body: &Bytes,
    tokenizer: impl FnOnce(Option<&str>) -> Result<Option<Arc<ChatTokenizer>>, ApiError>,
) -> Result<(Prepared, Option<Tokenize>), ApiError> {
    let mut parsed = (endpoint.parse)(body)?;
    let tokenizer = tokenizer(parsed.model.as_deref())?;
    let mut inline = parsed.prompt.given();
    let mut tokenize = None;
    match tokenizer {
        _ if inline.is_some() => {}
        Some(tokenizer)
            if parsed.prompt.costly_bytes(body.len(), &tokenizer) <= INLINE_BODY_BYTES =>
        {
            inline = Some(parsed.prompt.count(&tokenizer)?);
        }
        Some(tokenizer) => {
            tokenize = Some(Tokenize::new(endpoint, body.clone(), tokenizer));
        }
        None => {}
    }
    let prepared = Prepared {
        owned: parsed.owned,
        stream: parsed.stream,
        batch: parsed.batch,
        adapter: parsed.adapter,
        input_tokens: parsed.prompt.estimate(body.len()),
        max_output_tokens: parsed.max_output_tokens,
        token_ids: None,
        cache_salt: parsed.cache_salt,
        priority: parsed.priority,
    };
    match inline {
        Some(tokens) => Ok((prepared.with_tokens(tokens), None)),
        None => Ok((prepared, tokenize)),
    }
}

/// The endpoints whose prompt [`prompt_ids`] reads, by path.
const PROMPT_ENDPOINTS: [&Endpoint; 3] = [&CHAT, &COMPLETIONS, &GENERATE];

/// The token ids the router routes a body sent to `path` on
/// (`/v1/chat/completions`, `/v1/completions` or `/generate`), for a model tokenized
/// by `tokenizer`: the ids of its (first) prompt (for a chat with media, up to its
/// first media part).
///
/// # Errors
/// `path` is not one of those, or the body is refused as the router refuses it.
pub fn prompt_ids(
    path: &str,
    body: &[u8],
    tokenizer: &ChatTokenizer,
) -> Result<Vec<u32>, ApiError> {
    let endpoint = PROMPT_ENDPOINTS
        .into_iter()
        .find(|e| e.path == path)
        .ok_or_else(|| ApiError::bad_body(format!("no prompt is read from {path}")))?;
    let mut parsed = (endpoint.parse)(body)?;
    Ok(parsed.prompt.count(tokenizer)?.ids)
}

#[cfg(test)]
mod tests;

/// The number of prompts when `raw`, read as `prompts`, is a list of prompts (texts,
/// or lists of ids); `None` for one prompt (a string, or a flat list of ids).
fn batch_of(raw: &RawValue, prompts: &CompletionPrompts<'_>) -> Option<usize> {
    let list = raw.get().trim_start().strip_prefix('[')?;
    match prompts {
        CompletionPrompts::Texts { texts, .. } => Some(texts.len()),
        CompletionPrompts::Ids(lists) if list.trim_start().starts_with('[') => Some(lists.len()),
        CompletionPrompts::Ids(_) => None,
    }
}

/// Tokens in `bytes` of text, estimated: about four bytes a token.
fn estimate(bytes: usize) -> u64 {
    bytes as u64 / 4
}
