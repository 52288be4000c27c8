//! `POST /v1/chat/completions`: the OpenAI chat body, validated with precise 400s;
//! the prompt is the `messages` array, rendered with the model's chat template.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::checks::{check_integer, check_number, model};
use super::{Parsed, Prompt};
use crate::error::ApiError;

/// Roles a chat message may have.
const ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(default, borrow)]
    model: Option<&'a RawValue>,
    #[serde(default, borrow)]
    messages: Option<&'a RawValue>,
    #[serde(default)]
    stream: Option<Value>,
    #[serde(default)]
    stream_options: Option<Value>,
    #[serde(default)]
    n: Option<Value>,
    #[serde(default)]
    temperature: Option<Value>,
    #[serde(default)]
    top_p: Option<Value>,
    #[serde(default)]
    presence_penalty: Option<Value>,
    #[serde(default)]
    frequency_penalty: Option<Value>,
    #[serde(default)]
    max_tokens: Option<Value>,
    #[serde(default)]
    max_completion_tokens: Option<Value>,
}

#[derive(Deserialize)]
struct MessageProbe<'a> {
    #[serde(default, borrow)]
    role: Option<&'a RawValue>,
}

/// Validates a chat body and finds its routing facts.
pub(crate) fn parse(body: &[u8]) -> Result<Parsed<'_>, ApiError> {
    let probe: Probe<'_> = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_body(format!("the body is not a valid chat request: {e}")))?;
    let model = model(probe.model)?;
    let messages = probe
        .messages
        .ok_or_else(|| ApiError::invalid("invalid_messages", "messages", "messages is required"))?;
    let message_count = check_messages(messages)?;
    if message_count == 0 {
        return Err(ApiError::invalid(
            "invalid_messages",
            "messages",
            "messages must not be empty",
        ));
    }
    let stream = match probe.stream {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(_) => {
            return Err(ApiError::invalid(
                "invalid_parameter",
                "stream",
                "stream must be a boolean",
            ));
        }
    };
    match probe.stream_options {
        None | Some(Value::Null) => {}
        Some(_) if !stream => {
            return Err(ApiError::invalid(
                "invalid_parameter",
                "stream_options",
                "stream_options is only allowed when stream is true",
            ));
        }
        Some(Value::Object(options)) => {
            if options
                .get("include_usage")
                .is_some_and(|v| !v.is_boolean() && !v.is_null())
            {
                return Err(ApiError::invalid(
                    "invalid_parameter",
                    "stream_options.include_usage",
                    "include_usage must be a boolean",
                ));
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "invalid_parameter",
                "stream_options",
                "stream_options must be an object",
            ));
        }
    }
    check_number(
        &probe.temperature,
        "temperature",
        |v| (0.0..=2.0).contains(&v),
        "between 0 and 2",
    )?;
    check_number(
        &probe.top_p,
        "top_p",
        |v| v > 0.0 && v <= 1.0,
        "greater than 0 and at most 1",
    )?;
    check_number(
        &probe.presence_penalty,
        "presence_penalty",
        |v| (-2.0..=2.0).contains(&v),
        "between -2 and 2",
    )?;
    check_number(
        &probe.frequency_penalty,
        "frequency_penalty",
        |v| (-2.0..=2.0).contains(&v),
        "between -2 and 2",
    )?;
    check_integer(&probe.n, "n", 1, 128)?;
    let max_tokens = check_integer(&probe.max_tokens, "max_tokens", 1, u64::from(u32::MAX))?;
    let max_completion_tokens = check_integer(
        &probe.max_completion_tokens,
        "max_completion_tokens",
        1,
        u64::from(u32::MAX),
    )?;
    Ok(Parsed {
        model,
        stream,
        prompt: Prompt::Messages(messages),
        max_output_tokens: max_completion_tokens.or(max_tokens),
    })
}

/// Checks every message has a valid role; returns the message count.
fn check_messages(messages: &RawValue) -> Result<usize, ApiError> {
    let list: Vec<&RawValue> = serde_json::from_str(messages.get()).map_err(|_| {
        ApiError::invalid(
            "invalid_messages",
            "messages",
            "messages must be an array of message objects",
        )
    })?;
    for (i, raw) in list.iter().enumerate() {
        let message: MessageProbe<'_> = serde_json::from_str(raw.get()).map_err(|_| {
            ApiError::invalid(
                "invalid_messages",
                format!("messages[{i}]"),
                format!("messages[{i}] must be an object"),
            )
        })?;
        let param = format!("messages[{i}].role");
        let role = message.role.ok_or_else(|| {
            ApiError::invalid(
                "invalid_role",
                param.clone(),
                format!("{param} is required"),
            )
        })?;
        let valid = serde_json::from_str::<&str>(role.get()).is_ok_and(|r| ROLES.contains(&r));
        if !valid {
            return Err(ApiError::invalid(
                "invalid_role",
                param.clone(),
                format!("{param} must be one of {}", ROLES.join(", ")),
            ));
        }
    }
    Ok(list.len())
}
