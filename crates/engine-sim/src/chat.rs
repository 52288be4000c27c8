//! `POST /v1/chat/completions` and `POST /v1/completions` in the exact OpenAI shapes,
//! JSON and SSE.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::bootstrap::{RoomInfo, fetch_room};
use crate::config::EngineRole;
use crate::engine::Run;
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
    #[serde(default)]
    input_ids: Option<Vec<u32>>,
    #[serde(default)]
    bootstrap_host: Option<String>,
    #[serde(default)]
    bootstrap_port: Option<u16>,
    #[serde(default)]
    bootstrap_room: Option<u64>,
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

/// The shape of the answer: a chat completion or a text completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Chat,
    Text,
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

async fn respond(app: Arc<AppState>, headers: &HeaderMap, body: &[u8], shape: Shape) -> Response {
    let visit = app.visits.arrive();
    match answer(app, headers, body, shape).await {
        Answer::Whole(response) => {
            visit.answered();
            response
        }
        Answer::Stream(generation, include_usage) => {
            stream_response(generation, include_usage, visit)
        }
    }
}

/// A chat request's answer: whole, or a generation to stream.
enum Answer {
    Whole(Response),
    Stream(Generation, bool),
}

impl From<Response> for Answer {
    fn from(response: Response) -> Self {
        Self::Whole(response)
    }
}

async fn answer(app: Arc<AppState>, headers: &HeaderMap, body: &[u8], shape: Shape) -> Answer {
    let request_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
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
    let missing = match shape {
        Shape::Chat => request.messages.is_empty() && request.input_ids.is_none(),
        Shape::Text => request.prompt.is_none() && request.input_ids.is_none(),
    };
    if missing {
        let field = if shape == Shape::Chat {
            "messages"
        } else {
            "prompt"
        };
        return error_response(
            StatusCode::BAD_REQUEST,
            format!("{field} must not be empty"),
        )
        .into();
    }
    app.remember(json!({
        "stream": request.stream,
        "max_tokens": request.max_completion_tokens.or(request.max_tokens),
        "bootstrap_host": request.bootstrap_host,
        "bootstrap_port": request.bootstrap_port,
        "bootstrap_room": request.bootstrap_room,
        "request_id": request_id,
    }));
    app.engine.faults().hold(0).await;
    let faults = app.engine.faults().current();
    if faults.slow_start_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.slow_start_ms)).await;
    }
    if faults.hang_before_first_byte {
        std::future::pending::<()>().await;
    }
    if app.engine.faults().draw_error() {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "simulated engine failure",
        )
        .into();
    }
    let tokens = match (request.input_ids.clone(), &request.prompt) {
        (Some(ids), _) => Ok(ids),
        (None, Some(prompt)) if shape == Shape::Text => {
            match serde_json::from_value::<CompletionPrompt>(prompt.clone()) {
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
            }
        }
        _ => {
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
    let run = match start_run(&app, &request, tokens).await {
        Ok(run) => run,
        Err(response) => return (*response).into(),
    };
    let limit = request.max_completion_tokens.or(request.max_tokens);
    let wanted = limit.unwrap_or(u64::from(app.config.output_tokens));
    let output_tokens = if app.config.role == EngineRole::Prefill {
        wanted.min(1)
    } else {
        wanted
    };
    let prefix = if shape == Shape::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    let generation = Generation {
        app: Arc::clone(&app),
        run,
        shape,
        id: format!("{prefix}-{}", app.next_id()),
        created: unix_seconds(),
        output_tokens,
        finish_reason: if limit == Some(output_tokens) {
            "length"
        } else {
            "stop"
        },
        room: request.bootstrap_room,
        cached_tokens: 0,
        produced: 0,
    };
    if request.stream {
        let include_usage = request.stream_options.is_some_and(|o| o.include_usage);
        Answer::Stream(generation, include_usage)
    } else {
        json_response(generation).await.into()
    }
}

/// Registers the request on its rank; a decode engine first waits for its room.
async fn start_run(
    app: &AppState,
    request: &ChatRequest,
    tokens: Vec<u32>,
) -> Result<Run, Box<Response>> {
    let bad = |m: &str| Box::new(error_response(StatusCode::BAD_REQUEST, m));
    match app.config.role {
        EngineRole::Plain => Ok(app.engine.start(tokens, None)),
        EngineRole::Prefill => {
            let room = request
                .bootstrap_room
                .ok_or_else(|| bad("a prefill engine needs bootstrap_room"))?;
            Ok(app.engine.start(tokens, Some(room)))
        }
        EngineRole::Decode => {
            let (Some(host), Some(port), Some(room)) = (
                &request.bootstrap_host,
                request.bootstrap_port,
                request.bootstrap_room,
            ) else {
                return Err(bad(
                    "a decode engine needs bootstrap_host, bootstrap_port and bootstrap_room",
                ));
            };
            let timeout = Duration::from_millis(app.config.bootstrap_timeout_ms);
            fetch_room(&app.client, host, port, room, timeout)
                .await
                .map_err(|e| {
                    Box::new(error_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("KV transfer failed: {e}"),
                    ))
                })?;
            Ok(app.engine.start(tokens, Some(room)))
        }
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
}

impl Generation {
    /// Waits for a slot and computes the prompt (a decode engine received it).
    async fn prefill(&mut self) {
        self.run.admit().await;
        if self.app.config.role == EngineRole::Decode {
            return;
        }
        self.cached_tokens = self.run.prefill().await;
        if let (Some(rooms), Some(room)) = (&self.app.rooms, self.room) {
            rooms.mark_ready(RoomInfo {
                room,
                prompt_tokens: self.run.prompt_tokens(),
            });
        }
    }

    /// The next output word, or `None` when done.
    async fn next_word(&mut self) -> Option<&'static str> {
        if self.produced == self.output_tokens {
            return None;
        }
        self.run.decode_token().await;
        self.produced += 1;
        Some(output_word(
            self.run.prompt_tokens() as usize,
            self.produced,
        ))
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
        let choice = match (self.shape, text) {
            (Shape::Chat, None) => json!({"role": "assistant", "content": ""}),
            (Shape::Chat, Some(text)) if finish_reason.is_none() => json!({"content": text}),
            (Shape::Chat, Some(_)) => json!({}),
            (Shape::Text, text) => json!(text.unwrap_or_default()),
        };
        let choice = match self.shape {
            Shape::Chat => {
                json!({"index": 0, "delta": choice, "logprobs": null, "finish_reason": finish_reason})
            }
            Shape::Text => {
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
            Shape::Text => "text_completion",
        }
    }
}

async fn json_response(mut generation: Generation) -> Response {
    generation.prefill().await;
    let mut words = Vec::new();
    while let Some(word) = generation.next_word().await {
        words.push(word);
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
        Shape::Text => (
            "text_completion",
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": generation.finish_reason}),
        ),
    };
    let body = json!({
        "id": generation.id,
        "object": object,
        "created": generation.created,
        "model": generation.app.config.model,
        "choices": [choice],
        "usage": generation.usage(),
    });
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
