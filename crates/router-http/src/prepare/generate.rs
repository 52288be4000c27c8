//! `POST /generate`: SGLang's native body, validated with precise 400s; the prompt is
//! `text` (tokenized as it is, with the tokenizer's special tokens, as SGLang does) or
//! `input_ids` (routed on as sent), one prompt or a batch.
//!
//! SGLang clients send no `model`: the router's only model serves them (with several,
//! a missing `model` is refused naming them). The output budget is
//! `sampling_params.max_new_tokens`, 128 when absent (SGLang's default), `null` for
//! none; a batch's `sampling_params` may be a list, one per prompt, and its largest
//! budget counts. A batch is routed as a completion's list of prompts is.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;

use super::checks::{MAX_MODEL_BYTES, batch_cache_salt, check_integer, each, scalar};
use super::completions::MAX_PROMPTS;
use super::completions::{CompletionPrompts, read_prompts};
use super::owned::present;
use super::{Parsed, Prompt, batch_of};
use crate::error::ApiError;

/// The output budget of a request that names none (SGLang's default).
const DEFAULT_MAX_NEW_TOKENS: u64 = 128;

#[derive(Deserialize)]
struct Probe<'a> {
    // The fields the router owns (`owned::OWNED`): only whether they were sent
    // (`null` included).
    #[serde(default, deserialize_with = "present")]
    bootstrap_host: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "present")]
    bootstrap_port: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "present")]
    bootstrap_room: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "present")]
    kv_transfer_params: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "present")]
    data_parallel_rank: Option<IgnoredAny>,
    #[serde(default, borrow)]
    model: Option<&'a RawValue>,
    #[serde(default, borrow)]
    text: Option<&'a RawValue>,
    #[serde(default, borrow)]
    input_ids: Option<&'a RawValue>,
    #[serde(default, borrow)]
    input_embeds: Option<&'a RawValue>,
    #[serde(default, borrow)]
    sampling_params: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "scalar")]
    stream: Option<Value>,
    #[serde(default, borrow)]
    rid: Option<&'a RawValue>,
    #[serde(default, borrow)]
    lora_path: Option<&'a RawValue>,
    #[serde(default, borrow)]
    cache_salt: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "scalar")]
    priority: Option<Value>,
}

/// One prompt's `sampling_params` as read: only `max_new_tokens`.
#[derive(Deserialize)]
struct SamplingParams {
    #[serde(default, deserialize_with = "scalar")]
    max_new_tokens: Option<Value>,
}

/// Validates a `/generate` body and finds its routing facts.
pub(crate) fn parse(body: &[u8]) -> Result<Parsed<'_>, ApiError> {
    let probe: Probe<'_> = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_body(format!("the body is not a valid generate request: {e}"))
    })?;
    let model = match probe.model {
        None => None,
        given => Some(super::checks::model(given)?),
    };
    if probe.input_embeds.is_some() {
        return Err(ApiError::invalid(
            "invalid_prompt",
            "input_embeds",
            "input_embeds cannot be routed on: send text or input_ids",
        ));
    }
    let (raw, prompts) = match (probe.text, probe.input_ids) {
        (Some(text), None) => (text, read_prompts(text, "text", true)?),
        (None, Some(ids)) => (ids, read_prompts(ids, "input_ids", true)?),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "invalid_prompt",
                "text",
                "send either text or input_ids, not both",
            ));
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "invalid_prompt",
                "text",
                "text or input_ids is required",
            ));
        }
    };
    match (&prompts, probe.input_ids.is_some()) {
        (CompletionPrompts::Ids(_), false) => {
            return Err(ApiError::invalid(
                "invalid_prompt",
                "text",
                "text must be a string or a list of strings (token ids go in input_ids)",
            ));
        }
        (CompletionPrompts::Texts { .. }, true) => {
            return Err(ApiError::invalid(
                "invalid_prompt",
                "input_ids",
                "input_ids must be a list of token ids or a list of lists of token ids",
            ));
        }
        _ => {}
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
    check_names(probe.rid, "rid")?;
    Ok(Parsed {
        cache_salt: batch_cache_salt(probe.cache_salt)?,
        priority: super::checks::priority(&probe.priority)?,
        owned: [
            &probe.bootstrap_host,
            &probe.bootstrap_port,
            &probe.bootstrap_room,
            &probe.kv_transfer_params,
            &probe.data_parallel_rank,
        ]
        .iter()
        .any(|field| field.is_some()),
        model,
        stream,
        batch: batch_of(raw, &prompts),
        adapter: adapter(probe.lora_path)?,
        prompt: Prompt::Completion(prompts),
        max_output_tokens: max_new_tokens(probe.sampling_params)?,
    })
}

/// The largest `max_new_tokens` of `sampling_params` (an object, or a list of at most
/// [`MAX_PROMPTS`] of them): the default when none names one, `None` when one is
/// `null` (no budget).
fn max_new_tokens(params: Option<&RawValue>) -> Result<Option<u64>, ApiError> {
    let invalid = || {
        ApiError::invalid(
            "invalid_parameter",
            "sampling_params",
            "sampling_params must be an object or a list of objects",
        )
    };
    let one = |params: &RawValue| -> Result<Option<u64>, ApiError> {
        if !params.get().trim_start().starts_with('{') {
            return Err(invalid());
        }
        let params: SamplingParams = serde_json::from_str(params.get()).map_err(|_| invalid())?;
        match params.max_new_tokens {
            None => Ok(Some(DEFAULT_MAX_NEW_TOKENS)),
            Some(Value::Null) => Ok(None),
            given => check_integer(
                &given,
                "sampling_params.max_new_tokens",
                0,
                u64::from(u32::MAX),
            ),
        }
    };
    let Some(params) = params.filter(|p| p.get() != "null") else {
        return Ok(Some(DEFAULT_MAX_NEW_TOKENS));
    };
    let mut largest = Some(0);
    let listed = each(params, MAX_PROMPTS, "sampling_params", |_, params| {
        largest = match (largest, one(params)?) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
        Ok(())
    })?;
    match listed {
        None => one(params),
        Some(0) => Ok(Some(DEFAULT_MAX_NEW_TOKENS)),
        Some(_) => Ok(largest),
    }
}

/// A name in `rid` or `lora_path`: a string or `null`.
fn name(raw: &RawValue, param: &'static str) -> Result<Option<String>, ApiError> {
    match scalar(&mut serde_json::Deserializer::from_str(raw.get())) {
        Ok(Some(Value::String(name))) => Ok(Some(name)),
        Ok(Some(Value::Null)) => Ok(None),
        _ => Err(ApiError::invalid(
            "invalid_parameter",
            param,
            format!("{param} must be a string or a list of strings"),
        )),
    }
}

/// The adapter `lora_path` names: its string, or the one name a batch's list (of at
/// most [`MAX_PROMPTS`]) gives every prompt (`null`: the base model).
fn adapter(lora_path: Option<&RawValue>) -> Result<Option<String>, ApiError> {
    let Some(raw) = lora_path else {
        return Ok(None);
    };
    let mut first: Option<Option<String>> = None;
    let listed = each(raw, MAX_PROMPTS, "lora_path", |_, element| {
        let named = name(element, "lora_path")?;
        match &first {
            None => first = Some(named),
            Some(first) if *first == named => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    "invalid_parameter",
                    "lora_path",
                    "the prompts of a batch must name one adapter (or all none) to be routed",
                ));
            }
        }
        Ok(())
    })?;
    let name = match listed {
        None => name(raw, "lora_path")?,
        Some(_) => first.flatten(),
    };
    if name.as_ref().is_some_and(|n| n.len() > MAX_MODEL_BYTES) {
        return Err(ApiError::invalid(
            "invalid_parameter",
            "lora_path",
            format!("lora_path must name an adapter of at most {MAX_MODEL_BYTES} bytes"),
        ));
    }
    Ok(name)
}

/// `rid`: a string, a list of at most [`MAX_PROMPTS`] strings (or nulls), or null;
/// relayed as sent.
fn check_names(value: Option<&RawValue>, param: &'static str) -> Result<(), ApiError> {
    let Some(raw) = value else {
        return Ok(());
    };
    if each(raw, MAX_PROMPTS, param, |_, element| {
        name(element, param).map(drop)
    })?
    .is_none()
    {
        name(raw, param)?;
    }
    Ok(())
}
