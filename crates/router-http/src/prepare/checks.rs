//! Checks of body fields that every endpoint shares: the model and the sampling and
//! length parameters, each failure a 400 naming its parameter.

use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::ApiError;

/// The `model` field: a non-empty string.
pub(crate) fn model(model: Option<&RawValue>) -> Result<String, ApiError> {
    match model.map(|m| serde_json::from_str::<Value>(m.get())) {
        None => Err(ApiError::invalid(
            "missing_model",
            "model",
            "model is required",
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

pub(crate) fn check_number(
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
