//! A chat request made into what the chat template is given, as the engine serving
//! the model makes it: the messages normalised (content parts joined, tool-call
//! arguments parsed, reasoning kept), the tools, documents and template arguments.
//! SGLang and vLLM differ here, so each step follows the [`Dialect`].

use minijinja::Value;
use serde::Deserialize;

mod counting;
mod sglang;
mod vllm;

pub use counting::count_json_values;

use crate::EncodeError;
use crate::template::{ChatTemplate, ContentFormat, KnownTool, KnownTools};

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
#[derive(Clone)]
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
    /// The media parts the messages hold (see [`Media`]).
    pub(crate) media: usize,
    /// Whether the tools were a set kept from an earlier request.
    pub(crate) kept_tools: bool,
}

impl Rendering {
    /// The same with each tool given as its `function` object: SGLang renders
    /// again so when a template fails on the whole tools (`None`: no tools).
    pub(crate) fn with_function_tools(&self) -> Option<Self> {
        let mut again = self.clone();
        let (_, tools) = again.context.iter_mut().find(|(k, _)| *k == "tools")?;
        let functions: Vec<Value> = tools
            .try_iter()
            .ok()?
            .map(|tool| get(&tool, "function").unwrap_or_default())
            .collect();
        if functions.is_empty() {
            return None;
        }
        *tools = Value::from(functions);
        Some(again)
    }
}

fn invalid(param: &'static str, message: impl Into<String>) -> EncodeError {
    EncodeError::Request {
        param,
        message: message.into(),
    }
}

fn parse<'a, T: Deserialize<'a>>(text: &'a str, field: &'static str) -> Result<T, EncodeError> {
    serde_json::from_str(text).map_err(|e| invalid(field, format!("{field}: {e}")))
}

/// The most arguments `chat_template_kwargs` may give: templates read a handful.
pub const MAX_TEMPLATE_KWARGS: usize = 256;

/// The most JSON values the assistant tool calls' `arguments` strings of one chat
/// may hold in all: each is parsed into a tree for the template.
pub const MAX_TOOL_ARGUMENT_VALUES: usize = 1 << 19;

/// Checks the tool calls' `arguments` strings of `messages` hold at most
/// [`MAX_TOOL_ARGUMENT_VALUES`] JSON values in all, counting without keeping any.
fn check_arguments(messages: &[Value]) -> Result<(), EncodeError> {
    let mut budget = MAX_TOOL_ARGUMENT_VALUES;
    for message in messages {
        let Some(calls) = get(message, "tool_calls") else {
            continue;
        };
        let Ok(calls) = calls.try_iter() else {
            continue;
        };
        for call in calls {
            let arguments = get(&call, "function").and_then(|f| get(&f, "arguments"));
            let Some(text) = arguments.as_ref().and_then(Value::as_str) else {
                continue;
            };
            // Not an object: not parsed into a tree (SGLang refuses it, vLLM takes `{}`).
            if !text.trim_start().starts_with('{') {
                continue;
            }
            let counted = counting::count_json_values(text, &mut budget);
            if counted.is_err() && budget == 0 {
                return Err(invalid(
                    "messages",
                    format!(
                        "the tool calls' arguments must hold at most {MAX_TOOL_ARGUMENT_VALUES} JSON values in all"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Whether a tool call's `arguments` text may be parsed (it is an object; the
/// values it holds were counted by [`check_arguments`]).
fn parsed_arguments(text: &str) -> Option<Value> {
    if !text.trim_start().starts_with('{') {
        return None;
    }
    serde_json::from_str::<Value>(text)
        .ok()
        .filter(|parsed| parsed.kind() == minijinja::value::ValueKind::Map)
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

/// A part's kind: its `type`, or for a part without one the media field it holds
/// (vLLM takes `{"image_url": ...}` as an image part).
fn kind_of(part: &Value) -> Option<String> {
    if let Some(kind) = get(part, "type") {
        return kind.as_str().map(str::to_owned);
    }
    [
        "image_url",
        "audio_url",
        "video_url",
        "input_audio",
        "image_embeds",
    ]
    .into_iter()
    .find(|field| get(part, field).is_some())
    .map(str::to_owned)
}

/// The modality vLLM and SGLang name a media part by (`image_url` is an image).
fn modality(part: &Value) -> &'static str {
    let kind = kind_of(part).unwrap_or_default();
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

/// The media parts a chat's messages hold.
fn media_parts(messages: &[Value]) -> usize {
    messages
        .iter()
        .filter_map(|message| get(message, "content"))
        .filter(|content| content.as_str().is_none())
        .filter_map(|content| content.try_iter().ok())
        .map(|parts| parts.filter(is_media).count())
        .sum()
}

/// Whether a part is an image, audio or video the engine's processor turns into
/// tokens the router cannot reproduce.
fn is_media(part: &Value) -> bool {
    kind_of(part).is_some_and(|kind| {
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
    known: &KnownTools,
) -> Result<Rendering, EncodeError> {
    let messages: Vec<Value> = parse(request.messages, "messages")?;
    check_arguments(&messages)?;
    let media_parts = media_parts(&messages);
    let choice = request.tool_choice.unwrap_or_default();
    let kept = request.tools.and_then(|t| known.get(t, choice));
    let tools: Option<Vec<Value>> = match kept {
        Some(_) => None,
        None => request.tools.map(|t| parse(t, "tools")).transpose()?,
    };
    let kwargs: Vec<(String, Value)> = match request.chat_template_kwargs {
        None => Vec::new(),
        Some(text) => {
            let object: Value = parse(text, "chat_template_kwargs")?;
            if object.is_none() {
                Vec::new()
            } else if object.kind() != minijinja::value::ValueKind::Map {
                return Err(invalid(
                    "chat_template_kwargs",
                    "chat_template_kwargs must be an object",
                ));
            } else if object.len().unwrap_or(0) > MAX_TEMPLATE_KWARGS {
                return Err(invalid(
                    "chat_template_kwargs",
                    format!(
                        "chat_template_kwargs may give at most {MAX_TEMPLATE_KWARGS} arguments"
                    ),
                ));
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
    let inputs = Inputs {
        messages,
        tools,
        tool_choice,
        kwargs,
        effort,
        media,
    };
    let mut rendering = match dialect {
        Dialect::Vllm => vllm::vllm(template, request, inputs),
        Dialect::Sglang => sglang::sglang(template, request, inputs),
    }?;
    let kept_tools = kept.is_some();
    // The tools the template is given: kept from an earlier request that sent the
    // same, or kept now.
    if let (Some(text), Some((_, tools))) = (
        request.tools,
        rendering.context.iter_mut().find(|(k, _)| *k == "tools"),
    ) {
        *tools = match kept {
            Some(list) => list,
            None if tools.is_none() => Value::from(()),
            None => {
                let list: Vec<Value> = tools
                    .try_iter()
                    .map(KnownTool::wrap_all)
                    .unwrap_or_default();
                known.keep(text, choice, Value::from(list))
            }
        };
    }
    Ok(Rendering {
        media: media_parts,
        kept_tools,
        ..rendering
    })
}

/// A chat request's parts, parsed, and how its media is given.
struct Inputs {
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    kwargs: Vec<(String, Value)>,
    effort: Option<Value>,
    media: Media,
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

#[cfg(test)]
mod tests;
