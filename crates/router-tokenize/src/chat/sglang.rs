//! How SGLang makes a chat request into the template's arguments: its
//! `_apply_jinja_template` (SGLang 0.5.23).

use minijinja::Value;

use super::{
    ChatRequest, ContentFormat, Dialect, EncodeError, Inputs, Media, Rendering, entries, get,
    invalid, is_media, map, media_part, parsed_arguments, role, transformers_messages,
};
use crate::template::ChatTemplate;

/// SGLang's `_apply_jinja_template`: messages dumped (null fields dropped),
/// arguments parsed, content joined, a final assistant message handled, tools
/// chosen by `tool_choice`.
pub(super) fn sglang(
    template: &ChatTemplate,
    request: &ChatRequest<'_>,
    inputs: Inputs,
) -> Result<Rendering, EncodeError> {
    let Inputs {
        messages,
        tools,
        tool_choice,
        kwargs,
        effort,
        media,
    } = inputs;
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
            // SGLang renders no tools (not an empty list) when none is chosen.
            Some(chosen.map(sglang_tool).collect::<Vec<Value>>()).filter(|t| !t.is_empty())
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
            return Err(invalid(
                "chat_template_kwargs",
                format!("chat_template_kwargs may not set {reserved}"),
            ));
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
        media: 0,
        kept_tools: false,
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
        Some(a) if a.as_str().is_some() => match parsed_arguments(a.as_str().unwrap_or_default()) {
            Some(parsed) => parsed,
            None => {
                return Err(invalid(
                    "messages",
                    "tool_calls[].function.arguments must be a JSON object",
                ));
            }
        },
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
