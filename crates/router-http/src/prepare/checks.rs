//! Checks of body fields that every endpoint shares: the model and the sampling and
//! length parameters, each failure a 400 naming its parameter.

use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::ApiError;

/// The longest `model` (or adapter name) accepted: past any served model's id
/// (1-128 bytes) and adapter name (at most 256 bytes are read from an engine), and a
/// bound on what an error echoes.
pub(crate) const MAX_MODEL_BYTES: usize = 256;

/// The `model` field: a non-empty string of at most [`MAX_MODEL_BYTES`].
pub(crate) fn model(model: Option<&RawValue>) -> Result<String, ApiError> {
    match model.map(|m| serde_json::from_str::<Value>(m.get())) {
        None => Err(ApiError::invalid(
            "missing_model",
            "model",
            "model is required",
        )),
        Some(Ok(Value::String(m))) if m.len() > MAX_MODEL_BYTES => Err(ApiError::invalid(
            "invalid_model",
            "model",
            format!("model must be at most {MAX_MODEL_BYTES} bytes"),
        )),
        Some(Ok(Value::String(m))) if !m.is_empty() => Ok(m),
        Some(Ok(Value::String(_))) => Err(ApiError::invalid(
            "invalid_model",
            "model",
            "model must not be empty",
        )),
        Some(_) => Err(ApiError::invalid(
            "invalid_model",
            "model",
            "model must be a string",
        )),
    }
}

fn check_number(
    value: &Option<Value>,
    name: &str,
    ok: impl Fn(f64) -> bool,
    range: &str,
) -> Result<(), ApiError> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Number(n)) if n.as_f64().is_some_and(&ok) => Ok(()),
        Some(_) => Err(ApiError::invalid(
            "invalid_parameter",
            name,
            format!("{name} must be a number {range}"),
        )),
    }
}

pub(crate) fn check_integer(
    value: &Option<Value>,
    name: &str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some_and(|v| (min..=max).contains(&v)) => {
            Ok(n.as_u64())
        }
        Some(_) => Err(ApiError::invalid(
            "invalid_parameter",
            name,
            format!("{name} must be an integer from {min} to {max}"),
        )),
    }
}

/// The streaming and sampling fields the chat and completion bodies share, as sent.
pub(crate) struct Sampling<'a> {
    pub(crate) stream: &'a Option<Value>,
    pub(crate) stream_options: &'a Option<Value>,
    pub(crate) n: &'a Option<Value>,
    pub(crate) temperature: &'a Option<Value>,
    pub(crate) top_p: &'a Option<Value>,
    pub(crate) presence_penalty: &'a Option<Value>,
    pub(crate) frequency_penalty: &'a Option<Value>,
}

/// Checks the streaming and sampling fields; returns whether the answer is streamed.
pub(crate) fn stream_and_sampling(fields: &Sampling<'_>) -> Result<bool, ApiError> {
    let stream = match fields.stream {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid(
                "invalid_parameter",
                "stream",
                "stream must be a boolean",
            ));
        }
    };
    match fields.stream_options {
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
        fields.temperature,
        "temperature",
        |v| (0.0..=2.0).contains(&v),
        "between 0 and 2",
    )?;
    check_number(
        fields.top_p,
        "top_p",
        |v| v > 0.0 && v <= 1.0,
        "greater than 0 and at most 1",
    )?;
    check_number(
        fields.presence_penalty,
        "presence_penalty",
        |v| (-2.0..=2.0).contains(&v),
        "between -2 and 2",
    )?;
    check_number(
        fields.frequency_penalty,
        "frequency_penalty",
        |v| (-2.0..=2.0).contains(&v),
        "between -2 and 2",
    )?;
    check_integer(fields.n, "n", 1, 128)?;
    Ok(stream)
}
