//! A chat request made into the chat template's variables as SGLang makes them
//! (`_apply_jinja_template`), then as transformers' `apply_chat_template` passes
//! them on.
//!
//! SGLang dumps each message through its pydantic model (the model's fields in its
//! order, tool calls as `{"id", "index", "type", "function": {"name",
//! "arguments"}}`), parses tool-call arguments given as a JSON string, turns a
//! missing `content` into `""`, joins text parts with a space for a template that
//! wants a string, drops fields that are `null`, and turns a final assistant message
//! into a user one. Tools are dumped through its `Tool` model and dropped for
//! `tool_choice: "none"`. Transformers then drops `null` fields (again) and gives a
//! message with `reasoning_content` a `thinking` field too.

use minijinja::Value;
use minijinja::value::ValueKind;

/// The fields of a chat request the chat template reads, as the body holds them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chat<'a> {
    /// `messages`.
    pub(crate) messages: &'a [Value],
    /// `tools`.
    pub(crate) tools: Option<&'a Value>,
    /// `tool_choice`.
    pub(crate) tool_choice: Option<&'a Value>,
    /// `chat_template_kwargs`.
    pub(crate) template_kwargs: Option<&'a Value>,
}

/// What a template wants a message's `content` to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ContentFormat {
    /// One string: text parts joined with a space.
    String,
    /// The OpenAI list of parts.
    Parts,
}

/// A JSON object's entries, in order.
type Fields = Vec<(String, Value)>;

/// The entries of `value` when it is a map.
fn fields(value: &Value) -> Option<Fields> {
    if value.kind() != ValueKind::Map {
        return None;
    }
    let pairs = value.as_object()?.try_iter_pairs()?;
    Some(
        pairs
            .filter_map(|(key, item)| Some((key.as_str()?.to_owned(), item)))
            .collect(),
    )
}

/// `value[key]` when it is there and not `null`.
fn field(value: &Value, key: &str) -> Option<Value> {
    value
        .get_attr(key)
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_none())
}

fn object(fields: Fields) -> Value {
    Value::from_iter(fields)
}

fn none() -> Value {
    Value::from(())
}

/// Checks the shapes rendering relies on: each message an object with a string
/// `role`, `tools` a list of objects, `chat_template_kwargs` an object.
pub(crate) fn check(chat: &Chat<'_>) -> Result<(), String> {
    for (i, message) in chat.messages.iter().enumerate() {
        if field(message, "role")
            .and_then(|r| r.as_str().map(str::len))
            .is_none()
        {
            return Err(format!(
                "messages[{i}] must be an object with a string role"
            ));
        }
        let content = field(message, "content");
        if content
            .as_ref()
            .is_some_and(|c| !matches!(c.kind(), ValueKind::String | ValueKind::Seq))
        {
            return Err(format!("messages[{i}].content must be a string or a list"));
        }
    }
    if let Some(tools) = chat.tools.filter(|t| !t.is_none()) {
        let listed = tools.kind() == ValueKind::Seq
            && tools
                .try_iter()
                .is_ok_and(|mut each| each.all(|t| t.kind() == ValueKind::Map));
        if !listed {
            return Err("tools must be a list of objects".into());
        }
    }
    if chat
        .template_kwargs
        .is_some_and(|k| !k.is_none() && k.kind() != ValueKind::Map)
    {
        return Err("chat_template_kwargs must be an object".into());
    }
    Ok(())
}

/// The template's variables for `chat`, later ones winning: the request's
/// `chat_template_kwargs`, then `messages`, `tools` and `add_generation_prompt`.
pub(super) fn variables(chat: &Chat<'_>, format: ContentFormat) -> Result<Fields, String> {
    let mut messages = Vec::with_capacity(chat.messages.len());
    for message in chat.messages {
        messages.push(sglang_message(message, format)?);
    }
    if let Some(last) = messages.last_mut()
        && role(last) == "assistant"
        && let Some((_, content)) = last.iter().find(|(k, _)| k == "content")
        && content.kind() == ValueKind::String
    {
        *last = vec![
            ("role".into(), Value::from("user")),
            ("content".into(), content.clone()),
        ];
    }
    let messages: Vec<Value> = messages.into_iter().map(transformers_message).collect();
    let mut out = chat.template_kwargs.and_then(fields).unwrap_or_default();
    out.push(("messages".into(), Value::from(messages)));
    out.push(("tools".into(), tools(chat.tools, chat.tool_choice)));
    out.push(("add_generation_prompt".into(), Value::from(true)));
    Ok(out)
}

fn role(message: &Fields) -> &str {
    message
        .iter()
        .find(|(k, _)| k == "role")
        .and_then(|(_, v)| v.as_str())
        .unwrap_or_default()
}

/// One message as SGLang's pydantic model dumps it and `_apply_jinja_template`
/// normalises it.
fn sglang_message(message: &Value, format: ContentFormat) -> Result<Fields, String> {
    // `ChatCompletionMessageUserParam` and `ChatCompletionMessageGenericParam`.
    const USER: &[&str] = &["role", "content"];
    const GENERIC: &[&str] = &[
        "role",
        "content",
        "tool_call_id",
        "name",
        "phase",
        "reasoning_content",
        "tool_calls",
        "tools",
        "prefix",
    ];
    let role = field(message, "role")
        .map(|r| r.to_string())
        .unwrap_or_default();
    let names = if role == "user" { USER } else { GENERIC };
    let given = field(message, "content");
    // For a template that wants parts, SGLang rebuilds a message whose content is a
    // list around it: the content comes last.
    let last = format == ContentFormat::Parts
        && given.as_ref().is_some_and(|c| c.kind() == ValueKind::Seq);
    let content = content(&role, given, format);
    let mut out = Fields::new();
    for &name in names {
        let value = match name {
            "content" if last => None,
            "content" => Some(content.clone()),
            "tool_calls" => match field(message, "tool_calls") {
                Some(calls) => Some(tool_calls(&calls, role == "assistant")?),
                None => None,
            },
            _ => field(message, name),
        };
        if let Some(value) = value {
            out.push((name.to_owned(), value));
        }
    }
    if last {
        out.push(("content".into(), content));
    }
    Ok(out)
}

/// A message's content for the template: `""` when missing; text parts joined with
/// a space for a template that wants a string; else the parts, text and media in
/// SGLang's forms (a tool's all-text parts joined all the same).
fn content(role: &str, content: Option<Value>, format: ContentFormat) -> Value {
    let Some(content) = content else {
        return Value::from("");
    };
    if content.kind() != ValueKind::Seq {
        return content;
    }
    let Ok(items) = content.try_iter() else {
        return content;
    };
    let kind = |part: &Value| field(part, "type").map(|t| t.to_string());
    let text = |part: &Value| {
        field(part, "text")
            .map(|t| t.to_string())
            .unwrap_or_default()
    };
    let items: Vec<Value> = items.collect();
    let join = |parts: &[Value]| {
        let texts: Vec<String> = parts.iter().map(text).collect();
        Value::from(texts.join(" "))
    };
    if format == ContentFormat::String {
        let texts: Vec<Value> = items
            .into_iter()
            .filter(|p| matches!(kind(p).as_deref(), Some("text" | "input_text")))
            .collect();
        return join(&texts);
    }
    let typed = |name: &str| object(vec![("type".into(), Value::from(name))]);
    let parts: Vec<Value> = items
        .iter()
        .filter_map(|part| match kind(part).as_deref() {
            Some("text" | "input_text") => Some(object(vec![
                ("type".into(), Value::from("text")),
                ("text".into(), Value::from(text(part))),
            ])),
            Some("image_url" | "input_image") => Some(typed("image")),
            Some("video_url") => Some(typed("video")),
            Some("audio_url") => Some(typed("audio")),
            Some("tool_reference") => Some(part.clone()),
            _ => None,
        })
        .collect();
    if role == "tool" && parts.iter().all(|p| kind(p).as_deref() == Some("text")) {
        return join(&parts);
    }
    Value::from(parts)
}

/// Tool calls as SGLang's `ToolCall` model dumps them; an assistant's arguments
/// given as a JSON string parsed into their object (one that is not an object is
/// refused, as SGLang refuses it).
fn tool_calls(calls: &Value, assistant: bool) -> Result<Value, String> {
    let Ok(each) = calls.try_iter() else {
        return Ok(calls.clone());
    };
    let mut out = Vec::new();
    for call in each {
        let function = field(&call, "function").ok_or("a tool call needs its function")?;
        let arguments = match field(&function, "arguments") {
            Some(text) if assistant && text.kind() == ValueKind::String => {
                let parsed: Value = serde_json::from_str(text.as_str().unwrap_or_default())
                    .map_err(|_| "tool call arguments must be valid JSON")?;
                if parsed.kind() != ValueKind::Map {
                    return Err("tool call arguments must be a JSON object".into());
                }
                parsed
            }
            Some(other) => other,
            None => none(),
        };
        out.push(object(vec![
            ("id".into(), field(&call, "id").unwrap_or_else(none)),
            ("index".into(), field(&call, "index").unwrap_or_else(none)),
            (
                "type".into(),
                field(&call, "type").unwrap_or_else(|| Value::from("function")),
            ),
            (
                "function".into(),
                object(vec![
                    ("name".into(), field(&function, "name").unwrap_or_else(none)),
                    ("arguments".into(), arguments),
                ]),
            ),
        ]));
    }
    Ok(Value::from(out))
}

/// The tools the template is given: none for `tool_choice: "none"` or an empty
/// list, only the named one for a named choice, each as SGLang's `Tool` model
/// dumps it.
fn tools(tools: Option<&Value>, choice: Option<&Value>) -> Value {
    let Some(listed) = tools.filter(|t| !t.is_none()) else {
        return none();
    };
    if choice.and_then(Value::as_str) == Some("none") {
        return none();
    }
    let named = choice
        .and_then(|c| field(c, "function"))
        .and_then(|f| field(&f, "name"));
    let chosen: Vec<Value> = listed
        .try_iter()
        .map(|each| {
            each.filter(|tool| {
                named.as_ref().is_none_or(|name| {
                    field(tool, "function")
                        .and_then(|f| field(&f, "name"))
                        .as_ref()
                        == Some(name)
                })
            })
            .map(|tool| sglang_tool(&tool))
            .collect()
        })
        .unwrap_or_default();
    if chosen.is_empty() {
        none()
    } else {
        Value::from(chosen)
    }
}

/// `{"type", "function": {...}, "defer_loading"}`: the function's fields of
/// SGLang's `Function` model in the client's order, then those it left out
/// (`description` and `parameters` as `null`; `strict` and `defer_loading` only when
/// set, a tool's `defer_loading` carried into its function).
fn sglang_tool(tool: &Value) -> Value {
    const MODEL: [&str; 5] = [
        "description",
        "name",
        "parameters",
        "strict",
        "defer_loading",
    ];
    let function = field(tool, "function").unwrap_or_else(none);
    let defer = field(tool, "defer_loading");
    let value_of = |name: &str| {
        let given = field(&function, name);
        match name {
            "defer_loading" => given.or_else(|| defer.clone()),
            "strict" => given,
            _ => Some(given.unwrap_or_else(none)),
        }
    };
    let client_order = fields(&function)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| MODEL.contains(&k.as_str()));
    let mut inner = Fields::new();
    for name in client_order.chain(MODEL.iter().map(|k| (*k).to_owned())) {
        if inner.iter().any(|(k, _)| *k == name) {
            continue;
        }
        if let Some(value) = value_of(&name) {
            inner.push((name, value));
        }
    }
    object(vec![
        (
            "type".into(),
            field(tool, "type").unwrap_or_else(|| Value::from("function")),
        ),
        ("function".into(), object(inner)),
        ("defer_loading".into(), defer.unwrap_or_else(none)),
    ])
}

/// What transformers does to a message before rendering: `null` fields dropped, and
/// `reasoning_content` also given as `thinking`, first.
fn transformers_message(mut message: Fields) -> Value {
    message.retain(|(_, v)| !v.is_none() && !v.is_undefined());
    let reasoning = message
        .iter()
        .find(|(k, _)| k == "reasoning_content")
        .map(|(_, v)| v.clone());
    if let Some(reasoning) = reasoning
        && !message.iter().any(|(k, _)| k == "thinking")
    {
        message.insert(0, ("thinking".into(), reasoning));
    }
    object(message)
}

#[cfg(test)]
mod tests;
