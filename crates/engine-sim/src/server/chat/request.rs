//! A generation request as the three endpoints read it: its body, and the checks that
//! refuse it before it reaches the engine.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::server::config::SimConfig;
use crate::server::error::ApiError;
use crate::server::placement::{PerPrompt, Rendezvous, adapter_of, is_batch};
use crate::server::tokenizer::{Chat, Tokenizer, check};

/// The endpoint a request came to, which shapes its answer: a chat completion, a text
/// completion or SGLang's `/generate` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Chat,
    Text,
    Generate,
}

/// A request read and checked: what it asks the engine to run, and how to answer.
pub(crate) struct Ask {
    request: ChatRequest,
    /// The prompt as text or token ids (`None`: a chat's messages).
    prompt: Option<Value>,
    /// Whether the prompt came as a batch (of one): `/generate` answers with a list.
    pub(crate) batch: bool,
    /// The bootstrap fields of the request's one prompt.
    pub(crate) bootstrap: Rendezvous,
    /// The output-token limit the request sets.
    pub(crate) limit: Option<u64>,
    /// The LoRA adapter it names.
    pub(crate) adapter: Option<Arc<str>>,
    /// The data-parallel rank it is pinned to.
    pub(crate) pinned: Option<u32>,
}

impl Ask {
    /// Reads `body` as a request for an answer of `shape`.
    ///
    /// # Errors
    /// The first check the request fails: a 400, or a 404 for an adapter not loaded.
    pub(crate) fn read(
        config: &SimConfig,
        headers: &HeaderMap,
        body: &[u8],
        shape: Shape,
    ) -> Result<Self, ApiError> {
        let mut request: ChatRequest = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
        check(&request.chat())
            .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
        let prompt = request.take_prompt(shape)?;
        let batch = prompt.as_ref().is_some_and(is_batch);
        let bootstrap = request.rendezvous(batch).map_err(ApiError::bad_request)?;
        let limit = request.limit(shape, batch)?;
        let adapter = adapter_of(config, request.model.as_deref(), request.lora_path.as_ref())
            .map_err(|e| ApiError::new(StatusCode::NOT_FOUND, e))?;
        let pinned = request.pinned_rank(headers, config.dp_size)?;
        Ok(Self {
            request,
            prompt,
            batch,
            bootstrap,
            limit,
            adapter,
            pinned,
        })
    }

    /// The routing-relevant fields `GET /admin/requests` lists.
    pub(crate) fn record(&self, headers: &HeaderMap) -> Value {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        json!({
            "stream": self.request.stream,
            "max_tokens": self.limit,
            "dp_rank": self.pinned,
            "adapter": self.adapter.as_deref(),
            "bootstrap_host": self.bootstrap.host,
            "bootstrap_port": self.bootstrap.port,
            "bootstrap_room": self.bootstrap.room,
            "batch": self.batch,
            "kv_transfer_params": self.request.kv_transfer_params,
            "priority": self.request.priority,
            "request_id": header("x-request-id"),
            "traceparent": header("traceparent"),
        })
    }

    /// The prompt's tokens: the ids given, the text tokenized, or the chat template
    /// rendered and tokenized.
    ///
    /// # Errors
    /// A prompt that is not one prompt, or has no tokens, for a 400.
    pub(crate) fn tokens(&self, tokenizer: &Tokenizer) -> Result<Vec<u32>, ApiError> {
        let tokens = match &self.prompt {
            Some(prompt) => match serde_json::from_value::<CompletionPrompt>(prompt.clone()) {
                Ok(CompletionPrompt::Text(text)) => tokenizer.encode_text(&text),
                Ok(CompletionPrompt::Ids(ids)) => Ok(ids),
                Ok(CompletionPrompt::Texts(texts)) if texts.len() == 1 => {
                    tokenizer.encode_text(&texts[0])
                }
                Ok(CompletionPrompt::IdLists(mut lists)) if lists.len() == 1 => {
                    Ok(lists.swap_remove(0))
                }
                Ok(_) => Err("the simulated engine answers one prompt a request".to_owned()),
                Err(e) => Err(format!("invalid prompt: {e}")),
            },
            None => tokenizer.encode_chat(&self.request.chat()),
        };
        let tokens = tokens.map_err(ApiError::bad_request)?;
        if tokens.is_empty() {
            return Err(ApiError::bad_request("the prompt has no tokens"));
        }
        Ok(tokens)
    }

    /// Whether the answer is streamed.
    pub(crate) fn stream(&self) -> bool {
        self.request.stream
    }

    /// Whether a stream ends with a usage event (`stream_options.include_usage`).
    pub(crate) fn include_usage(&self) -> bool {
        self.request
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    /// vLLM's prefill/decode hand-over parameters.
    pub(crate) fn kv_transfer_params(&self) -> Option<&Value> {
        self.request.kv_transfer_params.as_ref()
    }

    /// `/generate`'s request id (a batch's first).
    pub(crate) fn rid(&self) -> Option<String> {
        match &self.request.rid {
            Some(Value::String(rid)) => Some(rid.clone()),
            Some(Value::Array(rids)) => rids.first().and_then(Value::as_str).map(str::to_owned),
            _ => None,
        }
    }
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    /// A chat's messages, and what else its template reads, as JSON values with the
    /// client's key order (a tool schema's keys reach the prompt in it).
    #[serde(default)]
    messages: Vec<minijinja::Value>,
    #[serde(default)]
    tools: Option<minijinja::Value>,
    #[serde(default)]
    tool_choice: Option<minijinja::Value>,
    #[serde(default)]
    chat_template_kwargs: Option<minijinja::Value>,
    /// A completion's prompt (read only by `/v1/completions`).
    #[serde(default)]
    prompt: Option<Value>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    /// Token ids instead of text (any prompt form, as `prompt`).
    #[serde(default)]
    input_ids: Option<Value>,
    /// `/generate`'s text prompt.
    #[serde(default)]
    text: Option<Value>,
    /// `/generate`'s sampling parameters.
    #[serde(default)]
    sampling_params: Option<PerPrompt<GenerateSampling>>,
    /// `/generate`'s request id.
    #[serde(default)]
    rid: Option<Value>,
    #[serde(default)]
    bootstrap_host: Option<PerPrompt<String>>,
    #[serde(default)]
    bootstrap_port: Option<PerPrompt<u16>>,
    #[serde(default)]
    bootstrap_room: Option<PerPrompt<u64>>,
    /// vLLM's prefill/decode hand-over.
    #[serde(default)]
    kv_transfer_params: Option<Value>,
    /// The data-parallel rank SGLang is asked to run the request on.
    #[serde(default)]
    data_parallel_rank: Option<u32>,
    /// Newer SGLang's name for it.
    #[serde(default)]
    routed_dp_rank: Option<u32>,
    /// The model, or a LoRA adapter (vLLM: its name; SGLang: `model:adapter`).
    #[serde(default)]
    model: Option<String>,
    /// `/generate`'s LoRA adapter.
    #[serde(default)]
    lora_path: Option<Value>,
    /// The request's priority, as SGLang and vLLM read it (the simulator schedules
    /// first come, first served, and only remembers it).
    #[serde(default)]
    priority: Option<i64>,
}

impl ChatRequest {
    /// The fields the chat template reads.
    fn chat(&self) -> Chat<'_> {
        Chat {
            messages: &self.messages,
            tools: self.tools.as_ref(),
            tool_choice: self.tool_choice.as_ref(),
            template_kwargs: self.chat_template_kwargs.as_ref(),
        }
    }

    /// Takes the prompt out of the field `shape` reads (token ids win); only a chat
    /// may have none, and then needs messages.
    fn take_prompt(&mut self, shape: Shape) -> Result<Option<Value>, ApiError> {
        let (field, prompt) = match shape {
            Shape::Chat => ("messages", None),
            Shape::Text => ("prompt", self.prompt.take()),
            Shape::Generate => ("text", self.text.take()),
        };
        let prompt = self.input_ids.take().or(prompt);
        if prompt.is_none() && (shape != Shape::Chat || self.messages.is_empty()) {
            return Err(ApiError::bad_request(format!("{field} must not be empty")));
        }
        Ok(prompt)
    }

    /// The bootstrap fields of the request's one prompt.
    fn rendezvous(&self, batch: bool) -> Result<Rendezvous, String> {
        Ok(Rendezvous {
            host: PerPrompt::of(self.bootstrap_host.as_ref(), batch, "bootstrap_host")?,
            port: PerPrompt::of(self.bootstrap_port.as_ref(), batch, "bootstrap_port")?,
            room: PerPrompt::of(self.bootstrap_room.as_ref(), batch, "bootstrap_room")?,
        })
    }

    /// The output-token limit: `/generate`'s `max_new_tokens`, else
    /// `max_completion_tokens` or `max_tokens`. A batch's sampling parameters are one
    /// for all prompts, or a list.
    fn limit(&self, shape: Shape, batch: bool) -> Result<Option<u64>, ApiError> {
        let sampling = match &self.sampling_params {
            Some(PerPrompt::List(list)) if batch && list.len() == 1 => list.first(),
            Some(PerPrompt::One(params)) => Some(params),
            None => None,
            Some(PerPrompt::List(_)) => {
                return Err(ApiError::bad_request(
                    "sampling_params must hold one object a prompt of the batch",
                ));
            }
        };
        Ok(match (shape, sampling) {
            (Shape::Generate, Some(params)) => params.max_new_tokens,
            (Shape::Generate, None) => None,
            _ => self.max_completion_tokens.or(self.max_tokens),
        })
    }

    /// The rank the request is pinned to: the header wins over the body, as on
    /// SGLang; a rank the engine lacks is refused.
    fn pinned_rank(&self, headers: &HeaderMap, dp_size: u32) -> Result<Option<u32>, ApiError> {
        let pinned = headers
            .get("x-data-parallel-rank")
            .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
            .or(self.routed_dp_rank)
            .or(self.data_parallel_rank);
        if let Some(rank) = pinned.filter(|rank| *rank >= dp_size) {
            return Err(ApiError::bad_request(format!(
                "DP rank {rank} is not active"
            )));
        }
        Ok(pinned)
    }
}

/// The part of `/generate`'s `sampling_params` the simulator reads.
#[derive(Debug, Deserialize)]
struct GenerateSampling {
    #[serde(default)]
    max_new_tokens: Option<u64>,
}

/// A completion's prompt: text or token ids, alone or in a list of one (the simulated
/// engine answers one prompt a request).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum CompletionPrompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}
