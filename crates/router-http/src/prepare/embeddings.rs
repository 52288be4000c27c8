//! `POST /v1/embeddings`: the OpenAI embedding body, validated with precise 400s;
//! the prompt is `input` as it is, read as a completion's prompt is (text with the
//! tokenizer's special tokens, token ids as sent, or a list of either). An embedding
//! has no output: the expected peak is the input alone. Only plain engines serve
//! embeddings.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;

use super::checks::{model, scalar};
use super::completions::{read_prompts, special_tokens};
use super::owned::present;
use super::{Parsed, Prompt};
use crate::error::ApiError;

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
    input: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "scalar")]
    encoding_format: Option<Value>,
    #[serde(default, deserialize_with = "scalar")]
    dimensions: Option<Value>,
    #[serde(default, deserialize_with = "scalar")]
    add_special_tokens: Option<Value>,
}

/// Validates an embedding body and finds its routing facts.
pub(crate) fn parse(body: &[u8]) -> Result<Parsed<'_>, ApiError> {
    let probe: Probe<'_> = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_body(format!("the body is not a valid embedding request: {e}"))
    })?;
    let model = model(probe.model)?;
    let input = probe
        .input
        .ok_or_else(|| ApiError::invalid("invalid_prompt", "input", "input is required"))?;
    let prompts = read_prompts(input, "input", special_tokens(probe.add_special_tokens)?)?;
    match probe.encoding_format {
        None | Some(Value::Null) => {}
        Some(Value::String(f)) if f == "float" || f == "base64" => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "invalid_parameter",
                "encoding_format",
                "encoding_format must be \"float\" or \"base64\"",
            ));
        }
    }
    if probe
        .dimensions
        .as_ref()
        .is_some_and(|d| !d.is_null() && d.as_u64().is_none_or(|d| d < 1))
    {
        return Err(ApiError::invalid(
            "invalid_parameter",
            "dimensions",
            "dimensions must be a positive integer",
        ));
    }
    Ok(Parsed {
        cache_salt: None,
        priority: None,
        owned: [
            &probe.bootstrap_host,
            &probe.bootstrap_port,
            &probe.bootstrap_room,
            &probe.kv_transfer_params,
            &probe.data_parallel_rank,
        ]
        .iter()
        .any(|field| field.is_some()),
        model: Some(model),
        stream: false,
        batch: None,
        adapter: None,
        prompt: Prompt::Completion(prompts),
        max_output_tokens: Some(0),
    })
}
