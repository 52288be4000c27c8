//! A chat request made into what the chat template is given, as the engine serving
//! the model makes it: the messages normalised (content parts joined, tool-call
//! arguments parsed, reasoning kept), the tools, documents and template arguments.
//! SGLang and vLLM differ here, so each step follows the [`Dialect`].

use minijinja::Value;
use serde::Deserialize;

use crate::EncodeError;
use crate::template::{ChatTemplate, ContentFormat};

/// The engine that serves a model, whose way of turning a chat request into a
/// prompt the router follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dialect {
    /// SGLang: text parts joined with a space, tools dropped for `tool_choice:
    /// "none"`, a final assistant message turned into a user one.
    #[default]
    Sglang,
    /// vLLM: text parts joined with a newline, `developer` turned into `system` for
    /// templates without it, `add_generation_prompt` and `continue_final_message`
    /// taken from the request.
    Vllm,
}

/// The parts of an OpenAI chat request the chat template reads, each as the JSON
/// text the body holds.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatRequest<'a> {
    /// `messages`: a JSON array of message objects.
    pub messages: &'a str,
    /// `tools`: a JSON array of `{"type": "function", "function": {...}}`.
    pub tools: Option<&'a str>,
    /// `tool_choice`: `"none"`, `"auto"`, `"required"` or a named function.
    pub tool_choice: Option<&'a str>,
    /// `documents` (vLLM): a JSON array of objects.
    pub documents: Option<&'a str>,
    /// `chat_template_kwargs`: a JSON object of the template's own arguments.
    pub chat_template_kwargs: Option<&'a str>,
    /// `add_generation_prompt` (vLLM; default true).
    pub add_generation_prompt: Option<bool>,
    /// `continue_final_message` (default false).
    pub continue_final_message: Option<bool>,
    /// `reasoning_effort`: a JSON string (or number, for SGLang).
    pub reasoning_effort: Option<&'a str>,
}

/// What rendering needs: the template's arguments and, for SGLang's
/// `continue_final_message`, the final message's text, tokenized apart and appended.
pub(crate) struct Rendering {
    /// The template's arguments besides the special tokens.
    pub(crate) context: Vec<(&'static str, Value)>,
    /// Arguments the request gave for the template (`chat_template_kwargs`).
    pub(crate) kwargs: Vec<(String, Value)>,
    /// Text appended to the rendered prompt's ids, tokenized alone (its leading BOS
    /// left out).
    pub(crate) suffix: Option<String>,
    /// vLLM's `continue_final_message`: the rendered prompt ends with this text, the
    /// final message's (what follows it is cut).
    pub(crate) cut_after: Option<String>,
    /// Whether the messages hold media (see [`Media`]).
    pub(crate) media: bool,
}

fn invalid(message: impl Into<String>) -> EncodeError {
    EncodeError::Request(message.into())
}

fn parse<'a, T: Deserialize<'a>>(text: &'a str, field: &str) -> Result<T, EncodeError> {
    serde_json::from_str(text).map_err(|e| invalid(format!("{field}: {e}")))
}

/// A map value's entries, in order.
fn entries(value: &Value) -> Vec<(Value, Value)> {
    let Ok(keys) = value.try_iter() else {
        return Vec::new();
    };
    keys.map(|key| {
        let item = value.get_item(&key).unwrap_or_default();
        (key, item)
    })
    .collect()
}

fn get(value: &Value, key: &str) -> Option<Value> {
    value
        .get_attr(key)
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_none())
}

fn map(entries: Vec<(Value, Value)>) -> Value {
    Value::from_iter(entries)
}

/// Part types whose text a template that wants a string is given.
fn part_text(part: &Value) -> Option<Value> {
    let kind = get(part, "type")?;
    let field = match kind.as_str()? {
        "text" | "input_text" | "output_text" => "text",
        "refusal" => "refusal",
        "thinking" => "thinking",
        _ => return None,
    };
    get(part, field)
}

/// How an image, audio or video part is given to the template. The tokens the
/// engine's processor makes of one cannot be reproduced, so a chat holding media is
/// rendered twice, once each way, and routed on what the two renders share: the
/// prompt up to the first media part.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Media {
    /// As the engine gives it: `{"type": "image"}` to a template that wants parts;
    /// to one that wants a string, a placeholder (vLLM) or nothing (SGLang).
    Part,
    /// As this text instead.
    Text(&'static str),
}

/// The modality vLLM and SGLang name a media part by (`image_url` is an image).
fn modality(part: &Value) -> &'static str {
    let kind = get(part, "type").map(|k| k.to_string()).unwrap_or_default();
    if kind.contains("audio") {
        "audio"
    } else if kind.contains("video") {
        "video"
    } else {
        "image"
    }
}

/// The part `media` gives a template that wants parts, for a media part.
fn media_part(part: &Value, media: Media) -> Value {
    match media {
        Media::Part => map(vec![(Value::from("type"), Value::from(modality(part)))]),
        Media::Text(text) => map(vec![
            (Value::from("type"), Value::from("text")),
            (Value::from("text"), Value::from(text)),
        ]),
    }
}

/// The placeholder text `media` gives (vLLM) a template that wants a string: the
/// engine's own, model-specific, is never rendered, so the two renders differ there.
fn media_text(media: Media) -> &'static str {
    match media {
        Media::Part => "\u{1}media",
        Media::Text(text) => text,
    }
}

/// Whether a chat's messages hold a media part.
fn holds_media(messages: &[Value]) -> bool {
    messages.iter().any(|message| {
        get(message, "content").is_some_and(|content| {
            content.as_str().is_none()
                && content
                    .try_iter()
                    .is_ok_and(|mut parts| parts.any(|part| is_media(&part)))
        })
    })
}

/// Whether a part is an image, audio or video the engine's processor turns into
/// tokens the router cannot reproduce.
fn is_media(part: &Value) -> bool {
    get(part, "type")
        .and_then(|kind| kind.as_str().map(str::to_owned))
        .is_some_and(|kind| {
            !matches!(
                kind.as_str(),
                "text" | "input_text" | "output_text" | "refusal" | "thinking" | "tool_reference"
            )
        })
}

/// Builds the template's arguments for `request` as `dialect`'s engine does.
pub(crate) fn rendering(
    dialect: Dialect,
    template: &ChatTemplate,
    request: &ChatRequest<'_>,
    media: Media,
) -> Result<Rendering, EncodeError> {
    let messages: Vec<Value> = parse(request.messages, "messages")?;
    let holds_media = holds_media(&messages);
    let tools: Option<Vec<Value>> = request.tools.map(|t| parse(t, "tools")).transpose()?;
    let kwargs: Vec<(String, Value)> = match request.chat_template_kwargs {
        None => Vec::new(),
        Some(text) => {
            let object: Value = parse(text, "chat_template_kwargs")?;
            if object.is_none() {
                Vec::new()
            } else if object.kind() != minijinja::value::ValueKind::Map {
                return Err(invalid("chat_template_kwargs must be an object"));
            } else {
                entries(&object)
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v)))
                    .collect()
            }
        }
    };
    let tool_choice: Option<Value> = request
        .tool_choice
        .map(|t| parse(t, "tool_choice"))
        .transpose()?;
    let effort: Option<Value> = request
        .reasoning_effort
        .map(|t| parse(t, "reasoning_effort"))
        .transpose()?
        .filter(|v: &Value| !v.is_none());
    let rendering = match dialect {
        Dialect::Vllm => vllm(template, request, messages, tools, kwargs, effort, media),
        Dialect::Sglang => sglang(
            template,
            request,
            messages,
            tools,
            tool_choice,
            kwargs,
            effort,
            media,
        ),
    }?;
    Ok(Rendering {
        media: holds_media,
        ..rendering
    })
}

/// vLLM's `parse_chat_messages`, `_postprocess_messages` and kwargs merge.
fn vllm(
    template: &ChatTemplate,
    request: &ChatRequest<'_>,
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    kwargs: Vec<(String, Value)>,
    effort: Option<Value>,
    media: Media,
) -> Result<Rendering, EncodeError> {
    let add_generation_prompt = request.add_generation_prompt.unwrap_or(true);
    let continue_final = request.continue_final_message.unwrap_or(false);
    if add_generation_prompt && continue_final {
        return Err(invalid(
            "continue_final_message and add_generation_prompt cannot both be true",
        ));
    }
    let openai = template.format(Dialect::Vllm) == ContentFormat::OpenAi;
    let mut out = Vec::with_capacity(messages.len());
    for message in &messages {
        out.push(vllm_message(message, openai, media)?);
    }
    if out.iter().any(|m| role(m) == "developer") && !template.mentions_developer() {
        out = vllm_developer_as_system(out);
    }
    let tools = tools.map(|tools| tools.iter().map(vllm_tool).collect::<Vec<Value>>());
    let mut context: Vec<(&'static str, Value)> = vec![
        ("tools", tools.map_or(Value::from(()), Value::from)),
        ("add_generation_prompt", Value::from(add_generation_prompt)),
        ("continue_final_message", Value::from(continue_final)),
    ];
    if let Some(documents) = request.documents {
        let documents: Value = parse(documents, "documents")?;
        if !documents.is_none() {
            context.push(("documents", documents));
        }
    }
    let mut kwargs = kwargs;
    if let Some(effort) = effort {
        if !kwargs.iter().any(|(k, _)| k == "enable_thinking") {
            let thinking = effort.as_str() != Some("none");
            kwargs.push(("enable_thinking".to_owned(), Value::from(thinking)));
        }
        kwargs.push(("reasoning_effort".to_owned(), effort));
    }
    // Top-level fields win over `chat_template_kwargs` (vLLM's merge order).
    kwargs.retain(|(k, _)| match k.as_str() {
        "add_generation_prompt" | "continue_final_message" | "messages" => false,
        "documents" => request.documents.is_none(),
        _ => true,
    });
    let cut_after = continue_final
        .then(|| out.last().and_then(|m| get(m, "content")))
        .flatten()
        .and_then(|c| c.as_str().map(str::to_owned));
    context.push(("messages", Value::from(transformers_messages(out))));
    Ok(Rendering {
        context,
        kwargs,
        suffix: None,
        cut_after,
        media: false,
    })
}

fn role(message: &Value) -> String {
    get(message, "role")
        .and_then(|r| r.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// What transformers' `apply_chat_template` does to messages before rendering them
/// (`_normalize_chat_messages`, `_alias_reasoning_fields`): keys whose value is
/// `null` dropped, and a message's reasoning also under `thinking` (first) and
/// `reasoning_content`.
fn transformers_messages(messages: Vec<Value>) -> Vec<Value> {
    messages
        .into_iter()
        .map(|message| {
            let mut fields: Vec<(Value, Value)> = entries(&message)
                .into_iter()
                .filter(|(_, v)| !v.is_none() && !v.is_undefined())
                .collect();
            let reasoning = ["reasoning_content", "thinking", "reasoning"]
                .iter()
                .find_map(|name| fields.iter().find(|(k, _)| k.as_str() == Some(name)))
                .map(|(_, v)| v.clone());
            if let Some(reasoning) = reasoning {
                if !fields.iter().any(|(k, _)| k.as_str() == Some("thinking")) {
                    fields.insert(0, (Value::from("thinking"), reasoning.clone()));
                }
                match fields
                    .iter_mut()
                    .find(|(k, _)| k.as_str() == Some("reasoning_content"))
                {
                    Some(entry) => entry.1 = reasoning,
                    None => fields.push((Value::from("reasoning_content"), reasoning)),
                }
            }
            map(fields)
        })
        .collect()
}

/// One message as vLLM gives it to the template.
fn vllm_message(message: &Value, openai: bool, media: Media) -> Result<Value, EncodeError> {
    let role = role(message);
    let content = match get(message, "content") {
        None => Vec::new(),
        Some(c) if c.as_str().is_some() => {
            vec![map(vec![
                (Value::from("type"), Value::from("text")),
                (Value::from("text"), c),
            ])]
        }
        Some(c) => c.try_iter().map(Iterator::collect).unwrap_or_default(),
    };
    let content = if openai {
        let mut parts = Vec::with_capacity(content.len());
        for part in &content {
            if let Some(text) = part.as_str() {
                parts.push(text_part(Value::from(text), &[]));
            } else if let Some(text) = part_text(part) {
                parts.push(text_part(text, &entries(part)));
            } else if is_media(part) {
                parts.push(media_part(part, media));
            }
        }
        if role == "tool"
            && parts
                .iter()
                .all(|p| get(p, "type").as_ref().and_then(Value::as_str) == Some("text"))
        {
            let texts: Vec<String> = parts
                .iter()
                .filter_map(|p| get(p, "text"))
                .map(|t| t.to_string())
                .collect();
            Value::from(texts.join("\n"))
        } else {
            Value::from(parts)
        }
    } else {
        let mut texts = Vec::with_capacity(content.len());
        // vLLM puts media placeholders before the message's text.
        let mut placeholders = Vec::new();
        for part in &content {
            if let Some(text) = part.as_str() {
                texts.push(text.to_owned());
            } else if let Some(text) = part_text(part) {
                texts.push(text.to_string());
            } else if is_media(part) {
                placeholders.push(media_text(media).to_owned());
            }
        }
        placeholders.extend(texts);
        Value::from(placeholders.join("\n"))
    };
    let mut out = vec![
        (Value::from("role"), Value::from(role.as_str())),
        (Value::from("content"), content),
    ];
    if role == "assistant" {
        if let Some(calls) = get(message, "tool_calls") {
            let calls: Vec<Value> = calls.try_iter().map(Iterator::collect).unwrap_or_default();
            if !calls.is_empty() {
                let calls = calls
                    .iter()
                    .map(vllm_tool_call)
                    .collect::<Result<Vec<_>, _>>()?;
                out.push((Value::from("tool_calls"), Value::from(calls)));
            }
        }
        let reasoning = get(message, "reasoning").or_else(|| get(message, "reasoning_content"));
        if let Some(reasoning) = reasoning {
            out.push((Value::from("reasoning"), reasoning.clone()));
            out.push((Value::from("reasoning_content"), reasoning));
        }
    } else if role == "tool"
        && let Some(id) = message
            .get_attr("tool_call_id")
            .ok()
            .filter(|v| !v.is_undefined())
    {
        out.push((Value::from("tool_call_id"), id));
    }
    if let Some(name) = get(message, "name").filter(|n| n.as_str().is_some()) {
        out.push((Value::from("name"), name));
    }
    if let Some(task) = get(message, "task").filter(|n| n.as_str().is_some()) {
        out.push((Value::from("task"), task));
    }
    if role == "developer" {
        let tools = message
            .get_attr("tools")
            .ok()
            .filter(|v| !v.is_undefined())
            .unwrap_or(Value::from(()));
        out.push((Value::from("tools"), tools));
    }
    Ok(map(out))
}

/// A text part as vLLM wraps it: `{"type": "text", "text": ...}` and the part's
/// other fields.
fn text_part(text: Value, fields: &[(Value, Value)]) -> Value {
    let mut out = vec![
        (Value::from("type"), Value::from("text")),
        (Value::from("text"), text),
    ];
    out.extend(
        fields
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), Some("type" | "text" | "refusal" | "thinking")))
            .cloned(),
    );
    map(out)
}

/// A tool call with its `arguments` parsed into an object (`{}` when they are not
/// one), as vLLM's `_postprocess_messages` leaves it.
fn vllm_tool_call(call: &Value) -> Result<Value, EncodeError> {
    let function = get(call, "function").filter(|f| f.kind() == minijinja::value::ValueKind::Map);
    let kind = get(call, "type");
    let (Some(function), true) = (
        function,
        kind.as_ref().is_none_or(|k| k.as_str() == Some("function")),
    ) else {
        return Err(invalid(
            "chat completions only support assistant tool_calls of type 'function'.",
        ));
    };
    let arguments = match get(&function, "arguments") {
        Some(a) if a.as_str().is_some() => {
            let text = a.as_str().unwrap_or_default();
            if text.is_empty() {
                empty_object()
            } else {
                match serde_json::from_str::<Value>(text) {
                    Ok(parsed) if parsed.kind() == minijinja::value::ValueKind::Map => parsed,
                    _ => empty_object(),
                }
            }
        }
        Some(a) if a.kind() == minijinja::value::ValueKind::Map => a,
        Some(a) if a.is_true() => empty_object(),
        _ => empty_object(),
    };
    let function = replace(&function, "arguments", arguments);
    Ok(replace(call, "function", function))
}

fn empty_object() -> Value {
    map(Vec::new())
}

/// `value` (a map) with `key` set to `new`, in its place (or last).
fn replace(value: &Value, key: &str, new: Value) -> Value {
    let mut out = entries(value);
    match out.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
        Some(entry) => entry.1 = new,
        None => out.push((Value::from(key), new)),
    }
    map(out)
}

/// A tool as vLLM's pydantic model dumps it: `{"type": "function", "function":
/// {"name", "description", "parameters"[, "strict"]}}`.
fn vllm_tool(tool: &Value) -> Value {
    let function = get(tool, "function").unwrap_or_default();
    let field = |name: &str| get(&function, name).unwrap_or(Value::from(()));
    let mut inner = vec![
        (Value::from("name"), field("name")),
        (Value::from("description"), field("description")),
        (Value::from("parameters"), field("parameters")),
    ];
    if let Some(strict) = get(&function, "strict") {
        inner.push((Value::from("strict"), strict));
    }
    map(vec![
        (
            Value::from("type"),
            get(tool, "type").unwrap_or(Value::from("function")),
        ),
        (Value::from("function"), map(inner)),
    ])
}

/// vLLM's `_convert_developer_to_system` and `_consolidate_system_messages`.
fn vllm_developer_as_system(messages: Vec<Value>) -> Vec<Value> {
    let converted: Vec<Value> = messages
        .into_iter()
        .map(|m| {
            if role(&m) == "developer" {
                let kept = entries(&m)
                    .into_iter()
                    .filter(|(k, _)| k.as_str() != Some("tools"))
                    .map(|(k, v)| {
                        if k.as_str() == Some("role") {
                            (k, Value::from("system"))
                        } else {
                            (k, v)
                        }
                    })
                    .collect();
                map(kept)
            } else {
                m
            }
        })
        .collect();
    let mut system = Vec::new();
    let mut others = Vec::new();
    let mut consolidate = false;
    for (i, message) in converted.iter().enumerate() {
        if role(message) == "system" {
            if i > 0 || !system.is_empty() {
                consolidate = true;
            }
            let content = get(message, "content").unwrap_or(Value::from(""));
            let text = match content.as_str() {
                Some(text) => text.to_owned(),
                None => content
                    .try_iter()
                    .map(|parts| {
                        parts
                            .filter_map(|p| {
                                p.as_str()
                                    .map(str::to_owned)
                                    .or_else(|| get(&p, "text").map(|t| t.to_string()))
                            })
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                    .unwrap_or_default(),
            };
            if !text.is_empty() {
                system.push(text);
            }
        } else {
            others.push(message.clone());
        }
    }
    if !consolidate {
        return converted;
    }
    let merged = map(vec![
        (Value::from("role"), Value::from("system")),
        (Value::from("content"), Value::from(system.join("\n\n"))),
    ]);
    std::iter::once(merged).chain(others).collect()
}

/// SGLang's `_apply_jinja_template`: messages dumped (null fields dropped),
/// arguments parsed, content joined, a final assistant message handled, tools
/// chosen by `tool_choice`.
fn sglang(
    template: &ChatTemplate,
    request: &ChatRequest<'_>,
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    kwargs: Vec<(String, Value)>,
    effort: Option<Value>,
    media: Media,
) -> Result<Rendering, EncodeError> {
    let openai = template.format(Dialect::Sglang) == ContentFormat::OpenAi;
    let mut out = Vec::with_capacity(messages.len());
    for message in &messages {
        out.push(sglang_message(message, openai, media)?);
    }
    let mut suffix = None;
    if out.last().is_some_and(|m| role(m) == "assistant") {
        let last = out.pop().expect("a last message");
        match get(&last, "content").filter(|c| c.as_str().is_some()) {
            Some(content) if request.continue_final_message == Some(true) => {
                suffix = Some(content.as_str().unwrap_or_default().to_owned());
            }
            Some(content) => out.push(map(vec![
                (Value::from("role"), Value::from("user")),
                (Value::from("content"), content),
            ])),
            None => out.push(last),
        }
    }
    let none = tool_choice.as_ref().and_then(Value::as_str) == Some("none");
    let named = tool_choice
        .as_ref()
        .and_then(|c| get(c, "function"))
        .and_then(|f| get(&f, "name"))
        .map(|n| n.to_string());
    let tools = match tools {
        Some(tools) if !tools.is_empty() && !none => {
            let chosen = tools.iter().filter(|tool| {
                named.as_deref().is_none_or(|name| {
                    get(tool, "function")
                        .and_then(|f| get(&f, "name"))
                        .is_some_and(|n| n.as_str() == Some(name))
                })
            });
            Some(chosen.map(sglang_tool).collect::<Vec<Value>>())
        }
        _ => None,
    };
    let mut all = Vec::new();
    if let Some(effort) = &effort {
        all.push(("reasoning_effort".to_owned(), effort.clone()));
    }
    all.extend(kwargs);
    if let Some(effort) = effort {
        let thinking = effort.as_str() != Some("none");
        for key in ["thinking", "enable_thinking"] {
            if !all.iter().any(|(k, _)| k == key) {
                all.push((key.to_owned(), Value::from(thinking)));
            }
        }
    }
    for reserved in ["add_generation_prompt", "tools", "tokenize", "return_dict"] {
        if all.iter().any(|(k, _)| k == reserved) {
            return Err(invalid(format!(
                "chat_template_kwargs may not set {reserved}"
            )));
        }
    }
    let context = vec![
        ("messages", Value::from(transformers_messages(out))),
        ("tools", tools.map_or(Value::from(()), Value::from)),
        ("add_generation_prompt", Value::from(true)),
    ];
    Ok(Rendering {
        context,
        kwargs: all,
        suffix,
        cut_after: None,
        media: false,
    })
}

/// One message as SGLang's `model_dump` and normalisation leave it.
fn sglang_message(message: &Value, openai: bool, media: Media) -> Result<Value, EncodeError> {
    const FIELDS: [&str; 8] = [
        "role",
        "content",
        "tool_call_id",
        "name",
        "reasoning_content",
        "tool_calls",
        "tools",
        "prefix",
    ];
    let role = role(message);
    let mut out = Vec::new();
    for field in FIELDS {
        let value = match field {
            "content" => Some(sglang_content(
                &role,
                get(message, "content"),
                openai,
                media,
            )),
            "tool_calls" => match get(message, "tool_calls") {
                Some(calls) => {
                    let calls: Vec<Value> =
                        calls.try_iter().map(Iterator::collect).unwrap_or_default();
                    Some(Value::from(
                        calls
                            .iter()
                            .map(sglang_tool_call)
                            .collect::<Result<Vec<_>, _>>()?,
                    ))
                }
                None => None,
            },
            other => get(message, other),
        };
        if let Some(value) = value {
            out.push((Value::from(field), value));
        }
    }
    Ok(map(out))
}

/// A message's content as SGLang gives it to the template: media parts dropped
/// from a string ([`Media::Text`] puts its text in their place, so the renders
/// differ there), given as `{"type": "image"}` in a list.
fn sglang_content(role: &str, content: Option<Value>, openai: bool, media: Media) -> Value {
    let Some(content) = content else {
        return Value::from("");
    };
    if content.as_str().is_some() {
        return content;
    }
    let parts: Vec<Value> = content
        .try_iter()
        .map(Iterator::collect)
        .unwrap_or_default();
    let texts = || {
        parts
            .iter()
            .filter_map(|p| match get(p, "type").as_ref().and_then(Value::as_str) {
                Some("text" | "input_text") => get(p, "text").map(|t| t.to_string()),
                _ if is_media(p) => match media {
                    Media::Part => None,
                    Media::Text(text) => Some(text.to_owned()),
                },
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    if role == "tool" || !openai {
        return Value::from(texts());
    }
    let kept = parts
        .iter()
        .filter_map(|p| match get(p, "type").as_ref().and_then(Value::as_str) {
            Some("text" | "input_text") => Some(map(vec![
                (Value::from("type"), Value::from("text")),
                (
                    Value::from("text"),
                    get(p, "text").unwrap_or(Value::from("")),
                ),
            ])),
            Some("tool_reference") => Some(p.clone()),
            _ if is_media(p) => Some(media_part(p, media)),
            _ => None,
        })
        .collect::<Vec<_>>();
    Value::from(kept)
}

/// A tool call as SGLang's `ToolCall.model_dump` leaves it, `arguments` parsed
/// (a string that is not a JSON object is refused, as SGLang refuses it).
fn sglang_tool_call(call: &Value) -> Result<Value, EncodeError> {
    let function = get(call, "function").unwrap_or_default();
    let arguments = match get(&function, "arguments") {
        Some(a) if a.as_str().is_some() => {
            match serde_json::from_str::<Value>(a.as_str().unwrap_or_default()) {
                Ok(parsed) if parsed.kind() == minijinja::value::ValueKind::Map => parsed,
                _ => {
                    return Err(invalid(
                        "tool_calls[].function.arguments must be a JSON object",
                    ));
                }
            }
        }
        Some(a) => a,
        None => Value::from(()),
    };
    let function = map(vec![
        (
            Value::from("name"),
            get(&function, "name").unwrap_or(Value::from(())),
        ),
        (Value::from("arguments"), arguments),
    ]);
    Ok(map(vec![
        (
            Value::from("id"),
            get(call, "id").unwrap_or(Value::from(())),
        ),
        (
            Value::from("index"),
            get(call, "index").unwrap_or(Value::from(())),
        ),
        (
            Value::from("type"),
            get(call, "type").unwrap_or(Value::from("function")),
        ),
        (Value::from("function"), function),
    ]))
}

/// A tool as SGLang's `Tool.model_dump` leaves it: the function's fields in the
/// client's order with `description` added when missing, and `defer_loading`.
fn sglang_tool(tool: &Value) -> Value {
    let function = get(tool, "function").unwrap_or_default();
    let mut inner = entries(&function);
    if !inner.iter().any(|(k, _)| k.as_str() == Some("description")) {
        inner.push((Value::from("description"), Value::from(())));
    }
    map(vec![
        (
            Value::from("type"),
            get(tool, "type").unwrap_or(Value::from("function")),
        ),
        (Value::from("function"), map(inner)),
        (
            Value::from("defer_loading"),
            get(tool, "defer_loading").unwrap_or(Value::from(())),
        ),
    ])
}
