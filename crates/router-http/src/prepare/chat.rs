//! `POST /v1/chat/completions`: the OpenAI chat body, validated with precise 400s;
//! the prompt is the `messages` array, rendered with the model's chat template.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::checks::{Sampling, check_integer, model, stream_and_sampling};
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
    let stream = stream_and_sampling(&Sampling {
        stream: &probe.stream,
        stream_options: &probe.stream_options,
        n: &probe.n,
        temperature: &probe.temperature,
        top_p: &probe.top_p,
        presence_penalty: &probe.presence_penalty,
        frequency_penalty: &probe.frequency_penalty,
    })?;
    let max_tokens = check_integer(&probe.max_tokens, "max_tokens", 1, u64::from(u32::MAX))?;
    let max_completion_tokens = check_integer(
        &probe.max_completion_tokens,
        "max_completion_tokens",
        1,
        u64::from(u32::MAX),
    )?;
    Ok(Parsed {
        model: Some(model),
        stream,
        batch: None,
        adapter: None,
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
