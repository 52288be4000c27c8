//! Checks of body fields that every endpoint shares: the model and the sampling and
//! length parameters, each failure a 400 naming its parameter.
//!
//! No field of a client body is read into a tree: a scalar field is read as its one
//! value ([`scalar`]), whose array or object is only skipped over, and the fields that
//! may hold lists are read an element at a time, at most a bounded number of them.

use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Number, Value};

use crate::error::ApiError;

/// A field that holds one value, present (`null` included): a scalar as sent, an
/// array or object as an empty one of its kind (its contents are skipped without
/// being kept, so a huge one costs no memory).
pub(crate) fn scalar<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Value>, D::Error> {
    deserializer.deserialize_any(ScalarVisitor).map(Some)
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(Number::from_f64(n).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Array(Vec::new()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Value::Object(serde_json::Map::new()))
    }
}

/// Calls `f` on each element of the array `raw` (its index and raw text), reading one
/// element at a time; `Ok(None)` when `raw` is not an array. More than `max` elements
/// is an error naming `param`.
pub(crate) fn each<'a>(
    raw: &'a RawValue,
    max: usize,
    param: &str,
    mut f: impl FnMut(usize, &'a RawValue) -> Result<(), ApiError>,
) -> Result<Option<usize>, ApiError> {
    if !raw.get().trim_start().starts_with('[') {
        return Ok(None);
    }
    let mut failed = None;
    let visitor = EachVisitor {
        max,
        f: |i, element| f(i, element).map_err(|e| failed = Some(e)),
    };
    let counted = serde_json::Deserializer::from_str(raw.get()).deserialize_seq(visitor);
    match (counted, failed) {
        (_, Some(error)) => Err(error),
        (Ok(n), None) => Ok(Some(n)),
        (Err(e), None) => Err(ApiError::invalid(
            "invalid_parameter",
            param,
            format!("{param}: {e}"),
        )),
    }
}

struct EachVisitor<F> {
    max: usize,
    f: F,
}

impl<'de, F: FnMut(usize, &'de RawValue) -> Result<(), ()>> Visitor<'de> for EachVisitor<F> {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<usize, A::Error> {
        use serde::de::Error as _;
        let mut n = 0;
        while let Some(element) = seq.next_element::<&'de RawValue>()? {
            if n == self.max {
                return Err(A::Error::custom(format_args!(
                    "more than {} elements",
                    self.max
                )));
            }
            (self.f)(n, element).map_err(|()| A::Error::custom("element refused"))?;
            n += 1;
        }
        Ok(n)
    }
}

/// The longest `model` (or adapter name) accepted: past any served model's id
/// (1-128 bytes) and adapter name (at most 256 bytes are read from an engine), and a
/// bound on what an error echoes.
pub(crate) const MAX_MODEL_BYTES: usize = 256;

/// The `model` field: a non-empty string of at most [`MAX_MODEL_BYTES`].
pub(crate) fn model(model: Option<&RawValue>) -> Result<String, ApiError> {
    let read = |m: &RawValue| scalar(&mut serde_json::Deserializer::from_str(m.get()));
    match model.map(read) {
        None => Err(ApiError::invalid(
            "missing_model",
            "model",
            "model is required",
        )),
        Some(Ok(Some(Value::String(m)))) if m.len() > MAX_MODEL_BYTES => Err(ApiError::invalid(
            "invalid_model",
            "model",
            format!("model must be at most {MAX_MODEL_BYTES} bytes"),
        )),
        Some(Ok(Some(Value::String(m)))) if !m.is_empty() => Ok(m),
        Some(Ok(Some(Value::String(_)))) => Err(ApiError::invalid(
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

/// The body's `priority`, which SGLang and vLLM read: an integer, or none.
pub(crate) fn priority(value: &Option<Value>) -> Result<Option<i64>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64()),
        Some(_) => Err(ApiError::invalid(
            "invalid_parameter",
            "priority",
            "priority must be an integer",
        )),
    }
}

/// The streaming and sampling fields the chat and completion bodies share, as sent.
pub(crate) struct Sampling<'a> {
    pub(crate) stream: &'a Option<Value>,
    pub(crate) stream_options: Option<&'a RawValue>,
    pub(crate) n: &'a Option<Value>,
    pub(crate) temperature: &'a Option<Value>,
    pub(crate) top_p: &'a Option<Value>,
    pub(crate) presence_penalty: &'a Option<Value>,
    pub(crate) frequency_penalty: &'a Option<Value>,
}

/// `stream_options` as read: only `include_usage` is checked.
#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default, deserialize_with = "scalar")]
    include_usage: Option<Value>,
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
    let options = match fields.stream_options {
        Some(raw) if raw.get() != "null" => Some(
            serde_json::from_str::<StreamOptions>(raw.get()).map_err(|_| {
                ApiError::invalid(
                    "invalid_parameter",
                    "stream_options",
                    "stream_options must be an object",
                )
            })?,
        ),
        _ => None,
    };
    if options.is_some() && !stream {
        return Err(ApiError::invalid(
            "invalid_parameter",
            "stream_options",
            "stream_options is only allowed when stream is true",
        ));
    }
    if options.is_some_and(|o| {
        o.include_usage
            .is_some_and(|v| !v.is_boolean() && !v.is_null())
    }) {
        return Err(ApiError::invalid(
            "invalid_parameter",
            "stream_options.include_usage",
            "include_usage must be a boolean",
        ));
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

/// The most bytes of a `cache_salt` (vLLM refuses more than 128 characters).
const MAX_CACHE_SALT_BYTES: usize = 512;

/// A request's `cache_salt`: a non-empty string of at most [`MAX_CACHE_SALT_BYTES`]
/// (an empty one is none, as SGLang reads it).
pub(crate) fn cache_salt(value: Option<&Value>) -> Result<Option<String>, ApiError> {
    let invalid = |message: String| ApiError::invalid("invalid_request", "cache_salt", message);
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s.len() > MAX_CACHE_SALT_BYTES => Err(invalid(format!(
            "cache_salt must be at most {MAX_CACHE_SALT_BYTES} bytes"
        ))),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid("cache_salt must be a string".to_owned())),
    }
}

/// A batch request's `cache_salt` (SGLang's `/v1/completions` and `/generate`): a
/// string, or a list of them, one a prompt, of which the first prompt's is routed on.
pub(crate) fn batch_cache_salt(raw: Option<&RawValue>) -> Result<Option<String>, ApiError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    if !raw.get().starts_with('[') {
        let value = serde_json::Deserializer::from_str(raw.get())
            .deserialize_any(ScalarVisitor)
            .map_err(|_| {
                ApiError::invalid(
                    "invalid_request",
                    "cache_salt",
                    "cache_salt must be a string",
                )
            })?;
        return cache_salt(Some(&value));
    }
    let mut first = None;
    let salts = each(raw, MAX_CACHE_SALTS, "cache_salt", |i, item| {
        let salt: Option<String> = serde_json::from_str(item.get()).map_err(|_| {
            ApiError::invalid(
                "invalid_request",
                "cache_salt",
                format!("cache_salt[{i}] must be a string"),
            )
        })?;
        let salt = cache_salt(salt.map(Value::String).as_ref())?;
        if i == 0 {
            first = salt;
        }
        Ok(())
    })?;
    match salts {
        Some(_) => Ok(first),
        None => Err(ApiError::invalid(
            "invalid_request",
            "cache_salt",
            "cache_salt must be a string or a list of strings",
        )),
    }
}

/// The most salts a batch's `cache_salt` list may give.
const MAX_CACHE_SALTS: usize = 1 << 16;
