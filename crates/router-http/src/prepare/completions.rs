//! `POST /v1/completions`: the OpenAI completion body, validated with precise 400s;
//! the prompt is `prompt` as it is (no chat template): text, token ids, or a list of
//! either.
//!
//! A list of prompts is one request to one engine, which holds every prompt as a
//! sequence of its own: the longest decides the bucket, and cache-aware routing
//! hashes the first.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::checks::{Sampling, check_integer, model, stream_and_sampling};
use super::{Parsed, Prompt};
use crate::error::ApiError;

#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(default, borrow)]
    model: Option<&'a RawValue>,
    #[serde(default, borrow)]
    prompt: Option<&'a RawValue>,
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
}

/// A completion's prompts, each text or token ids (never empty).
#[derive(Debug)]
pub(crate) enum CompletionPrompts<'b> {
    /// Text, tokenized as it is.
    Texts(Vec<Cow<'b, str>>),
    /// Token ids, routed on as they are.
    Ids(Vec<Vec<u32>>),
}

/// The forms `prompt` may take.
#[derive(Deserialize)]
#[serde(untagged)]
enum Form<'b> {
    Text(#[serde(borrow)] Cow<'b, str>),
    Ids(Vec<u32>),
    Texts(#[serde(borrow)] Vec<Cow<'b, str>>),
    IdLists(Vec<Vec<u32>>),
}

/// Validates a completion body and finds its routing facts.
pub(crate) fn parse(body: &[u8]) -> Result<Parsed<'_>, ApiError> {
    let probe: Probe<'_> = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_body(format!("the body is not a valid completion request: {e}"))
    })?;
    let model = model(probe.model)?;
    let prompt = probe
        .prompt
        .ok_or_else(|| ApiError::invalid("invalid_prompt", "prompt", "prompt is required"))?;
    let prompts = prompts(prompt)?;
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
    Ok(Parsed {
        model,
        stream,
        prompt: Prompt::Completion(prompts),
        max_output_tokens: max_tokens,
    })
}

/// `prompt` read as one of its forms, each prompt and the list non-empty.
fn prompts(prompt: &RawValue) -> Result<CompletionPrompts<'_>, ApiError> {
    let invalid = |message: &str| ApiError::invalid("invalid_prompt", "prompt", message);
    let form: Form<'_> = serde_json::from_str(prompt.get()).map_err(|_| {
        invalid("prompt must be a string, a list of strings, a list of token ids or a list of such lists")
    })?;
    let prompts = match form {
        Form::Text(text) => CompletionPrompts::Texts(vec![text]),
        Form::Ids(ids) => CompletionPrompts::Ids(vec![ids]),
        Form::Texts(texts) => CompletionPrompts::Texts(texts),
        Form::IdLists(lists) => CompletionPrompts::Ids(lists),
    };
    let (count, empty) = match &prompts {
        CompletionPrompts::Texts(texts) => (texts.len(), texts.iter().any(|t| t.is_empty())),
        CompletionPrompts::Ids(lists) => (lists.len(), lists.iter().any(Vec::is_empty)),
    };
    if count == 0 {
        return Err(invalid("prompt must not be an empty list"));
    }
    if empty {
        return Err(invalid("a prompt must not be empty"));
    }
    Ok(prompts)
}
