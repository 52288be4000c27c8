//! `POST /v1/chat/completions`: the OpenAI chat body, validated with precise 400s;
//! the prompt is the `messages` array, rendered with the model's chat template.

use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use super::checks::{Sampling, check_integer, each, model, scalar, stream_and_sampling};
use super::owned::present;
use super::{Parsed, Prompt};
use crate::error::ApiError;

/// The most messages a chat may hold: far past any conversation an agent keeps, and
/// a bound on what rendering its template builds.
pub(crate) const MAX_MESSAGES: usize = 1 << 16;

/// The most JSON values a chat's messages may hold in all (an object's entries count
/// twice): the chat template is given a tree of them, a few dozen bytes each.
pub(crate) const MAX_MESSAGE_VALUES: usize = 1 << 19;

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
    messages: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "scalar")]
    stream: Option<Value>,
    #[serde(default, borrow)]
    stream_options: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "scalar")]
    n: Option<Value>,
    #[serde(default, deserialize_with = "scalar")]
    temperature: Option<Value>,
    #[serde(default, deserialize_with = "scalar")]
    top_p: Option<Value>,
    #[serde(default, deserialize_with = "scalar")]
    presence_penalty: Option<Value>,
    #[serde(default, deserialize_with = "scalar")]
    frequency_penalty: Option<Value>,
    #[serde(default, deserialize_with = "scalar")]
    max_tokens: Option<Value>,
    #[serde(default, deserialize_with = "scalar")]
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
        stream_options: probe.stream_options,
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
        stream,
        batch: None,
        adapter: None,
        prompt: Prompt::Messages(messages),
        max_output_tokens: max_completion_tokens.or(max_tokens),
    })
}

/// Checks every message has a valid role, with at most [`MAX_MESSAGES`] messages
/// holding at most [`MAX_MESSAGE_VALUES`] JSON values in all (what the chat template
/// is given is built from them); returns the message count.
fn check_messages(messages: &RawValue) -> Result<usize, ApiError> {
    let mut values = MAX_MESSAGE_VALUES;
    let checked = each(messages, MAX_MESSAGES, "messages", |i, raw| {
        let not_object = || {
            ApiError::invalid(
                "invalid_messages",
                format!("messages[{i}]"),
                format!("messages[{i}] must be an object"),
            )
        };
        if !raw.get().starts_with('{') {
            return Err(not_object());
        }
        let message: MessageProbe<'_> =
            serde_json::from_str(raw.get()).map_err(|_| not_object())?;
        check_role(i, message.role)?;
        serde_json::Deserializer::from_str(raw.get())
            .deserialize_any(Count(&mut values))
            .map_err(|_| {
                ApiError::invalid(
                    "invalid_messages",
                    "messages",
                    format!("messages must hold at most {MAX_MESSAGE_VALUES} JSON values in all"),
                )
            })
    })?;
    checked.ok_or_else(|| {
        ApiError::invalid(
            "invalid_messages",
            "messages",
            "messages must be an array of message objects",
        )
    })
}

fn check_role(i: usize, role: Option<&RawValue>) -> Result<(), ApiError> {
    let param = format!("messages[{i}].role");
    let role = role.ok_or_else(|| {
        ApiError::invalid(
            "invalid_role",
            param.clone(),
            format!("{param} is required"),
        )
    })?;
    let valid = serde_json::from_str::<&str>(role.get()).is_ok_and(|r| ROLES.contains(&r));
    if valid {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "invalid_role",
            param.clone(),
            format!("{param} must be one of {}", ROLES.join(", ")),
        ))
    }
}

/// Counts the JSON values it visits (an object's entries count once more, for their
/// keys) against its budget, keeping none; fails once the budget is spent.
struct Count<'b>(&'b mut usize);

impl Count<'_> {
    fn spend<E: serde::de::Error>(&mut self) -> Result<(), E> {
        *self.0 = self
            .0
            .checked_sub(1)
            .ok_or_else(|| E::custom("too many values"))?;
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E: serde::de::Error>(mut self) -> Result<(), E> {
        self.spend()
    }

    fn visit_bool<E: serde::de::Error>(mut self, _: bool) -> Result<(), E> {
        self.spend()
    }

    fn visit_u64<E: serde::de::Error>(mut self, _: u64) -> Result<(), E> {
        self.spend()
    }

    fn visit_i64<E: serde::de::Error>(mut self, _: i64) -> Result<(), E> {
        self.spend()
    }

    fn visit_f64<E: serde::de::Error>(mut self, _: f64) -> Result<(), E> {
        self.spend()
    }

    fn visit_str<E: serde::de::Error>(mut self, _: &str) -> Result<(), E> {
        self.spend()
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.spend()?;
        while seq.next_element_seed(Count(self.0))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.spend()?;
        while map.next_key::<IgnoredAny>()?.is_some() {
            Count(self.0).spend()?;
            map.next_value_seed(Count(self.0))?;
        }
        Ok(())
    }
}
