//! `POST /v1/chat/completions` and `POST /v1/completions` in the exact OpenAI shapes,
//! and SGLang's native `POST /generate`, JSON and SSE.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::bootstrap::RoomInfo;
use crate::config::{EngineRole, PdProtocol};
use crate::engine::Run;
use crate::nixl;
use crate::placement::{PerPrompt, Rendezvous, adapter_of, is_batch, start_run};
use crate::server::AppState;
use crate::tokenizer::{ChatMessage, output_word};
use crate::visits::Visit;

#[derive(Debug, Deserialize)]
struct ChatRequest {
    #[serde(default)]
    messages: Vec<RawMessage>,
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

/// The shape of the answer: a chat completion, a text completion or SGLang's
/// `/generate` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Chat,
    Text,
    Generate,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize)]
struct RawMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(default)]
    text: Option<String>,
}

impl RawMessage {
    fn flatten(&self) -> ChatMessage {
        let content = match &self.content {
            None => String::new(),
            Some(Content::Text(text)) => text.clone(),
            Some(Content::Parts(parts)) => parts
                .iter()
                .filter_map(|p| p.text.as_deref())
                .collect::<Vec<_>>()
                .join(""),
        };
        ChatMessage {
            role: self.role.clone(),
            content,
        }
    }
}

/// An OpenAI-shaped error response.
pub(crate) fn error_response(status: StatusCode, message: impl Into<String>) -> Response {
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    let body = json!({"error": {"message": message.into(), "type": kind, "param": null, "code": status.as_u16()}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub(crate) async fn chat_completions(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    respond(app, &headers, &body, Shape::Chat).await
}

pub(crate) async fn completions(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    respond(app, &headers, &body, Shape::Text).await
}

pub(crate) async fn generate(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    respond(app, &headers, &body, Shape::Generate).await
}

async fn respond(app: Arc<AppState>, headers: &HeaderMap, body: &[u8], shape: Shape) -> Response {
    let visit = app.visits.arrive();
    match answer(app, headers, body, shape).await {
        Answer::Whole(response) => {
            visit.answered();
            response
        }
        Answer::Stream(generation, include_usage) => {
            stream_response(*generation, include_usage, visit)
        }
    }
}

/// A chat request's answer: whole, or a generation to stream.
enum Answer {
    Whole(Response),
    Stream(Box<Generation>, bool),
}

impl From<Response> for Answer {
    fn from(response: Response) -> Self {
        Self::Whole(response)
    }
}

async fn answer(app: Arc<AppState>, headers: &HeaderMap, body: &[u8], shape: Shape) -> Answer {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (request_id, traceparent) = (header("x-request-id"), header("traceparent"));
    let request: ChatRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("invalid request body: {e}"),
            )
            .into();
        }
    };
    let (field, prompt) = match shape {
        Shape::Chat => ("messages", None),
        Shape::Text => ("prompt", request.prompt.as_ref()),
        Shape::Generate => ("text", request.text.as_ref()),
    };
    let prompt = request.input_ids.as_ref().or(prompt);
    if prompt.is_none() && (shape != Shape::Chat || request.messages.is_empty()) {
        return error_response(
            StatusCode::BAD_REQUEST,
            format!("{field} must not be empty"),
        )
        .into();
    }
    let batch = prompt.is_some_and(is_batch);
    let bootstrap = (|| {
        Ok::<_, String>(Rendezvous {
            host: PerPrompt::of(request.bootstrap_host.as_ref(), batch, "bootstrap_host")?,
            port: PerPrompt::of(request.bootstrap_port.as_ref(), batch, "bootstrap_port")?,
            room: PerPrompt::of(request.bootstrap_room.as_ref(), batch, "bootstrap_room")?,
        })
    })();
    let bootstrap = match bootstrap {
        Ok(bootstrap) => bootstrap,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, e).into(),
    };
    // A batch's sampling parameters are one for all prompts, or a list.
    let sampling = match &request.sampling_params {
        Some(PerPrompt::List(list)) if batch && list.len() == 1 => list.first(),
        Some(PerPrompt::One(params)) => Some(params),
        None => None,
        Some(PerPrompt::List(_)) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "sampling_params must hold one object a prompt of the batch",
            )
            .into();
        }
    };
    let limit = match (shape, sampling) {
        (Shape::Generate, Some(params)) => params.max_new_tokens,
        (Shape::Generate, None) => None,
        _ => request.max_completion_tokens.or(request.max_tokens),
    };
    let adapter = match adapter_of(
        &app.config,
        request.model.as_deref(),
        request.lora_path.as_ref(),
    ) {
        Ok(adapter) => adapter,
        Err(e) => return error_response(StatusCode::NOT_FOUND, e).into(),
    };
    // The header wins over the body, as on SGLang; a rank the engine lacks is refused.
    let pinned = headers
        .get("x-data-parallel-rank")
        .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
        .or(request.routed_dp_rank)
        .or(request.data_parallel_rank);
    if let Some(rank) = pinned.filter(|rank| *rank >= app.config.dp_size) {
        return error_response(
            StatusCode::BAD_REQUEST,
            format!("DP rank {rank} is not active"),
        )
        .into();
    }
    app.remember(json!({
        "stream": request.stream,
        "max_tokens": limit,
        "dp_rank": pinned,
        "adapter": adapter.as_deref(),
        "bootstrap_host": bootstrap.host,
        "bootstrap_port": bootstrap.port,
        "bootstrap_room": bootstrap.room,
        "batch": batch,
        "kv_transfer_params": request.kv_transfer_params,
        "request_id": request_id,
        "traceparent": traceparent,
    }));
    app.engine.faults().hold(0).await;
    let faults = app.engine.faults().current();
    if faults.slow_start_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.slow_start_ms)).await;
    }
    if faults.hang_before_first_byte {
        std::future::pending::<()>().await;
    }
    if let Some(status) = app.engine.faults().draw_error() {
        return error_response(status, "simulated engine failure").into();
    }
    let tokens = match prompt {
        Some(prompt) => match serde_json::from_value::<CompletionPrompt>(prompt.clone()) {
            Ok(CompletionPrompt::Text(text)) => app.tokenizer.encode_text(&text),
            Ok(CompletionPrompt::Ids(ids)) => Ok(ids),
            Ok(CompletionPrompt::Texts(texts)) if texts.len() == 1 => {
                app.tokenizer.encode_text(&texts[0])
            }
            Ok(CompletionPrompt::IdLists(mut lists)) if lists.len() == 1 => {
                Ok(lists.swap_remove(0))
            }
            Ok(_) => Err("the simulated engine answers one prompt a request".to_owned()),
            Err(e) => Err(format!("invalid prompt: {e}")),
        },
        None => {
            let messages: Vec<ChatMessage> =
                request.messages.iter().map(RawMessage::flatten).collect();
            app.tokenizer.encode_chat(&messages)
        }
    };
    let tokens = match tokens {
        Ok(tokens) => tokens,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, e).into(),
    };
    if tokens.is_empty() {
        return error_response(StatusCode::BAD_REQUEST, "the prompt has no tokens").into();
    }
    let run = if app.config.pd_protocol == PdProtocol::Vllm {
        let handover = match app.config.role {
            EngineRole::Prefill => {
                nixl::check_prefill(request.kv_transfer_params.as_ref(), request.stream, limit)
            }
            EngineRole::Decode => match &request.kv_transfer_params {
                Some(params) => nixl::receive(&app, params).await,
                // No hand-over: the decode engine computes the prompt itself.
                None => Ok(()),
            },
            EngineRole::Plain => Ok(()),
        };
        if let Err(e) = handover {
            return error_response(StatusCode::BAD_REQUEST, e).into();
        }
        app.engine.start_for(tokens, pinned.map(u64::from), adapter)
    } else {
        match start_run(&app, &bootstrap, pinned, adapter, tokens).await {
            Ok(run) => run,
            Err(response) => return (*response).into(),
        }
    };
    let wanted = limit.unwrap_or(u64::from(app.config.output_tokens));
    let output_tokens = if app.config.role == EngineRole::Prefill {
        wanted.min(1)
    } else {
        wanted
    };
    let prefix = match shape {
        Shape::Chat => "chatcmpl",
        Shape::Text => "cmpl",
        Shape::Generate => "gen",
    };
    let rid = match &request.rid {
        Some(Value::String(rid)) => Some(rid.clone()),
        Some(Value::Array(rids)) => rids.first().and_then(Value::as_str).map(str::to_owned),
        _ => None,
    };
    let generation = Generation {
        app: Arc::clone(&app),
        run,
        shape,
        id: rid.unwrap_or_else(|| format!("{prefix}-{}", app.next_id())),
        created: unix_seconds(),
        output_tokens,
        finish_reason: if limit == Some(output_tokens) {
            "length"
        } else {
            "stop"
        },
        room: bootstrap.room,
        cached_tokens: 0,
        produced: 0,
        text: String::new(),
        batch,
        transfer: None,
    };
    if request.stream {
        let include_usage =
            shape != Shape::Generate && request.stream_options.is_some_and(|o| o.include_usage);
        Answer::Stream(Box::new(generation), include_usage)
    } else {
        json_response(generation).await.into()
    }
}

/// One response being generated. Dropping it (a client that went away) drops the run
/// and frees the engine slot.
struct Generation {
    app: Arc<AppState>,
    run: Run,
    shape: Shape,
    id: String,
    created: u64,
    output_tokens: u64,
    finish_reason: &'static str,
    room: Option<u64>,
    cached_tokens: u64,
    produced: u64,
    /// The words so far (`/generate` streams them cumulatively, as SGLang does).
    text: String,
    /// Whether the prompt came as a batch (of one): `/generate` answers with a list.
    batch: bool,
    /// A vLLM prefill's `kv_transfer_params`, once its prompt is computed.
    transfer: Option<Value>,
}

impl Generation {
    /// Waits for a slot and computes the prompt (a decode engine received it).
    async fn prefill(&mut self) {
        self.run.admit().await;
        if self.app.config.role == EngineRole::Decode {
            return;
        }
        self.cached_tokens = self.run.prefill().await;
        if self.app.config.pd_protocol == PdProtocol::Vllm
            && self.app.config.role == EngineRole::Prefill
        {
            self.transfer = Some(nixl::offer(&self.app, self.run.prompt_tokens()));
        }
        if let (Some(rooms), Some(room)) = (&self.app.rooms, self.room) {
            rooms.mark_ready(RoomInfo {
                room,
                prompt_tokens: self.run.prompt_tokens(),
                rank: self.run.rank(),
                dp_size: self.app.config.dp_size,
            });
        }
    }

    /// The next output word, or `None` when done.
    async fn next_word(&mut self) -> Option<&'static str> {
        if self.produced == self.output_tokens {
            self.run.end();
            return None;
        }
        self.run.decode_token().await;
        self.produced += 1;
        let word = output_word(self.run.prompt_tokens() as usize, self.produced);
        if self.shape == Shape::Generate {
            if !self.text.is_empty() {
                self.text.push(' ');
            }
            self.text.push_str(word);
        }
        Some(word)
    }

    /// A `/generate` answer so far: its cumulative text, output ids (the simulator's
    /// ids count the tokens) and `meta_info`, with `finish_reason` once done.
    fn generated(&self, done: bool) -> Value {
        let finish_reason = match (done, self.finish_reason) {
            (false, _) => Value::Null,
            (true, "length") => json!({"type": "length", "length": self.produced}),
            (true, _) => json!({"type": "stop", "matched": null}),
        };
        json!({
            "text": self.text,
            "output_ids": (1..=self.produced).collect::<Vec<_>>(),
            "meta_info": {
                "id": self.id,
                "finish_reason": finish_reason,
                "prompt_tokens": self.run.prompt_tokens(),
                "completion_tokens": self.produced,
                "cached_tokens": self.cached_tokens,
            },
        })
    }

    fn usage(&self) -> Value {
        let prompt = self.run.prompt_tokens();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": self.produced,
            "total_tokens": prompt + self.produced,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    /// A streamed event with `text` (for a chat, the content delta; `None`: the
    /// role, the first event of a chat stream).
    fn chunk(&self, text: Option<&str>, finish_reason: Option<&str>) -> Bytes {
        if self.shape == Shape::Generate {
            return sse(&self.generated(finish_reason.is_some()));
        }
        let choice = match (self.shape, text) {
            (Shape::Chat, None) => json!({"role": "assistant", "content": ""}),
            (Shape::Chat, Some(text)) if finish_reason.is_none() => json!({"content": text}),
            (Shape::Chat, Some(_)) => json!({}),
            (Shape::Text | Shape::Generate, text) => json!(text.unwrap_or_default()),
        };
        let choice = match self.shape {
            Shape::Chat => {
                json!({"index": 0, "delta": choice, "logprobs": null, "finish_reason": finish_reason})
            }
            Shape::Text | Shape::Generate => {
                json!({"index": 0, "text": choice, "logprobs": null, "finish_reason": finish_reason})
            }
        };
        sse(&json!({
            "id": self.id,
            "object": self.chunk_object(),
            "created": self.created,
            "model": self.app.config.model,
            "choices": [choice],
        }))
    }

    /// The `object` of a streamed event.
    fn chunk_object(&self) -> &'static str {
        match self.shape {
            Shape::Chat => "chat.completion.chunk",
            Shape::Text | Shape::Generate => "text_completion",
        }
    }
}

async fn json_response(mut generation: Generation) -> Response {
    generation.prefill().await;
    let mut words = Vec::new();
    while let Some(word) = generation.next_word().await {
        words.push(word);
    }
    if generation.shape == Shape::Generate {
        let answer = generation.generated(true);
        let body = if generation.batch {
            json!([answer])
        } else {
            answer
        };
        return (
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
    }
    let text = words.join(" ");
    let (object, choice) = match generation.shape {
        Shape::Chat => (
            "chat.completion",
            json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": generation.finish_reason,
            }),
        ),
        Shape::Text | Shape::Generate => (
            "text_completion",
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": generation.finish_reason}),
        ),
    };
    let mut body = json!({
        "id": generation.id,
        "object": object,
        "created": generation.created,
        "model": generation.app.config.model,
        "choices": [choice],
        "usage": generation.usage(),
    });
    if let Some(params) = generation.transfer.take() {
        body["kv_transfer_params"] = params;
    }
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

enum Step {
    Role,
    Words,
    Finish,
    Usage,
    Done,
    End,
}

struct StreamState {
    generation: Generation,
    step: Step,
    include_usage: bool,
    sent: u32,
    /// Taken when the engine ends the stream itself; dropped with the stream before
    /// that, the request was abandoned.
    visit: Option<Visit>,
}

impl StreamState {
    async fn next_event(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        let faults = self.generation.app.engine.faults();
        faults.hold(self.sent).await;
        let disconnect_after = faults.current().disconnect_after_chunks;
        if disconnect_after.is_some_and(|n| self.sent >= n) {
            // Let the server flush what was sent before the connection is cut.
            tokio::task::yield_now().await;
            if let Some(visit) = self.visit.take() {
                visit.answered();
            }
            return Some(Err(std::io::Error::other("simulated disconnect")));
        }
        let g = &mut self.generation;
        let event = loop {
            match self.step {
                Step::Role => {
                    g.prefill().await;
                    self.step = Step::Words;
                    // A text completion's stream has no role event.
                    if g.shape == Shape::Chat {
                        break g.chunk(None, None);
                    }
                }
                Step::Words => match g.next_word().await {
                    Some(word) => {
                        let text = if g.produced == 1 {
                            word.to_owned()
                        } else {
                            format!(" {word}")
                        };
                        break g.chunk(Some(&text), None);
                    }
                    None => self.step = Step::Finish,
                },
                Step::Finish => {
                    self.step = if self.include_usage {
                        Step::Usage
                    } else {
                        Step::Done
                    };
                    break g.chunk(Some(""), Some(g.finish_reason));
                }
                Step::Usage => {
                    self.step = Step::Done;
                    break sse(&json!({
                        "id": g.id,
                        "object": g.chunk_object(),
                        "created": g.created,
                        "model": g.app.config.model,
                        "choices": [],
                        "usage": g.usage(),
                    }));
                }
                Step::Done => {
                    self.step = Step::End;
                    if let Some(visit) = self.visit.take() {
                        visit.answered();
                    }
                    break Bytes::from_static(b"data: [DONE]\n\n");
                }
                Step::End => return None,
            }
        };
        self.sent += 1;
        Some(Ok(event))
    }
}

fn stream_response(generation: Generation, include_usage: bool, visit: Visit) -> Response {
    let state = StreamState {
        generation,
        step: Step::Role,
        include_usage,
        sent: 0,
        visit: Some(visit),
    };
    let stream = futures_util::stream::unfold(state, |mut state| async move {
        let event = state.next_event().await?;
        Some((event, state))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .expect("a static response head is valid")
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
