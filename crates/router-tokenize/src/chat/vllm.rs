//! How vLLM makes a chat request into the template's arguments: its
//! `parse_chat_messages`, `_postprocess_messages` and kwargs merge (vLLM 0.33).

use minijinja::Value;

use super::{
    ChatRequest, ContentFormat, Dialect, EncodeError, Inputs, Media, Rendering, empty_object,
    entries, get, invalid, is_media, map, media_part, media_text, parse, parsed_arguments,
    part_text, replace, role, transformers_messages,
};
use crate::template::ChatTemplate;

/// vLLM's `parse_chat_messages`, `_postprocess_messages` and kwargs merge.
pub(super) fn vllm(
    template: &ChatTemplate,
    request: &ChatRequest<'_>,
    inputs: Inputs,
) -> Result<Rendering, EncodeError> {
    let Inputs {
        messages,
        tools,
        kwargs,
        effort,
        media,
        ..
    } = inputs;
    let add_generation_prompt = request.add_generation_prompt.unwrap_or(true);
    let continue_final = request.continue_final_message.unwrap_or(false);
    if add_generation_prompt && continue_final {
        return Err(invalid(
            "continue_final_message",
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
    // transformers cuts after the final message's text: its content, or its last
    // text part's.
    let cut_after = match out.last().and_then(|m| get(m, "content")) {
        Some(content) if continue_final => match content.as_str() {
            Some(text) => Some(text.to_owned()),
            None => Some(
                content
                    .try_iter()
                    .ok()
                    .and_then(|parts| parts.filter_map(|p| get(&p, "text")).last())
                    .map(|t| t.to_string())
                    .ok_or_else(|| {
                        invalid(
                            "continue_final_message",
                            "continue_final_message needs a final message with text",
                        )
                    })?,
            ),
        },
        _ => None,
    };
    context.push(("messages", Value::from(transformers_messages(out))));
    Ok(Rendering {
        context,
        kwargs,
        suffix: None,
        cut_after,
        media: 0,
        kept_tools: false,
    })
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
            "messages",
            "chat completions only support assistant tool_calls of type 'function'.",
        ));
    };
    let arguments = match get(&function, "arguments") {
        Some(a) if a.as_str().is_some() => {
            parsed_arguments(a.as_str().unwrap_or_default()).unwrap_or_else(empty_object)
        }
        Some(a) if a.kind() == minijinja::value::ValueKind::Map => a,
        Some(a) if a.is_true() => empty_object(),
        _ => empty_object(),
    };
    let function = replace(&function, "arguments", arguments);
    Ok(replace(call, "function", function))
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
