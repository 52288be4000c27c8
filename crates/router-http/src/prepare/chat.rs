//! `POST /v1/chat/completions`: the OpenAI chat body, validated with precise 400s;
//! the prompt is the `messages` array, rendered with the model's chat template.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;

use super::checks::{
    Sampling, cache_salt, check_integer, each, model, scalar, stream_and_sampling,
};
use super::owned::present as sent;
use super::{ChatPrompt, Parsed, Prompt};
use crate::error::ApiError;
use router_tokenize::{ChatTokenizer, count_json_values};

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
    #[serde(default, deserialize_with = "sent")]
    bootstrap_host: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "sent")]
    bootstrap_port: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "sent")]
    bootstrap_room: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "sent")]
    kv_transfer_params: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "sent")]
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
    // What the chat template reads besides the messages (`ChatPrompt`).
    #[serde(default, borrow)]
    tools: Option<&'a RawValue>,
    #[serde(default, borrow)]
    tool_choice: Option<&'a RawValue>,
    #[serde(default, borrow)]
    documents: Option<&'a RawValue>,
    #[serde(default, borrow)]
    chat_template_kwargs: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "scalar")]
    add_generation_prompt: Option<Value>,
    #[serde(default, deserialize_with = "scalar")]
    continue_final_message: Option<Value>,
    #[serde(default, borrow)]
    reasoning_effort: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "scalar")]
    cache_salt: Option<Value>,
    #[serde(default, deserialize_with = "scalar")]
    priority: Option<Value>,
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
    check_template_fields(&[
        ("tools", probe.tools),
        ("documents", probe.documents),
        ("chat_template_kwargs", probe.chat_template_kwargs),
        ("tool_choice", probe.tool_choice),
        ("reasoning_effort", probe.reasoning_effort),
    ])?;
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
        cache_salt: cache_salt(probe.cache_salt.as_ref())?,
        priority: super::checks::priority(&probe.priority)?,
        prompt: Prompt::Chat(ChatPrompt {
            messages,
            tools: present(probe.tools),
            tool_choice: present(probe.tool_choice),
            documents: present(probe.documents),
            chat_template_kwargs: present(probe.chat_template_kwargs),
            add_generation_prompt: flag(&probe.add_generation_prompt, "add_generation_prompt")?,
            continue_final_message: flag(&probe.continue_final_message, "continue_final_message")?,
            reasoning_effort: present(probe.reasoning_effort),
            cheap_tools: std::cell::Cell::new(None),
        }),
        max_output_tokens: max_completion_tokens.or(max_tokens),
    })
}

/// The most JSON values the fields the template reads besides the messages may
/// hold in all (`tools`, `documents`, `chat_template_kwargs`, `tool_choice`).
pub(crate) const MAX_TEMPLATE_VALUES: usize = 1 << 18;

/// A field sent as JSON `null` is the same as one not sent.
fn present(raw: Option<&RawValue>) -> Option<&RawValue> {
    raw.filter(|r| r.get() != "null")
}

/// A boolean field: absent, `null`, or `true`/`false`.
fn flag(value: &Option<Value>, param: &str) -> Result<Option<bool>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid(
            "invalid_request",
            param,
            format!("{param} must be a boolean"),
        )),
    }
}

/// Checks the shapes of the fields the template reads besides the messages: `tools`
/// a list, `documents` a list, `chat_template_kwargs` an object, `reasoning_effort`
/// a string or a number.
fn check_template_fields(fields: &[(&str, Option<&RawValue>)]) -> Result<(), ApiError> {
    for (param, raw) in fields {
        let Some(raw) = present(*raw) else {
            continue;
        };
        let shape = match *param {
            "tools" => Some(('[', "tools must be an array of tool objects")),
            "documents" => Some(('[', "documents must be an array of objects")),
            "chat_template_kwargs" => Some(('{', "chat_template_kwargs must be an object")),
            _ => None,
        };
        if *param == "reasoning_effort"
            && (raw.get().starts_with('[') || raw.get().starts_with('{'))
        {
            return Err(ApiError::invalid(
                "invalid_request",
                "reasoning_effort",
                "reasoning_effort must be a string or a number",
            ));
        }
        if let Some((open, message)) = shape
            && !raw.get().starts_with(open)
        {
            return Err(ApiError::invalid("invalid_request", *param, message));
        }
    }
    Ok(())
}

impl ChatPrompt<'_> {
    /// Checks the fields the template reads besides the messages hold at most
    /// [`MAX_TEMPLATE_VALUES`] JSON values in all, before `tokenizer` makes a tree of
    /// them. A tool set it keeps from an earlier request is not counted again: it
    /// is rendered from what is kept, at most [`router_tokenize::MAX_KEPT_TOOLS_BYTES`]
    /// of text.
    pub(super) fn check_values(&self, tokenizer: &ChatTokenizer) -> Result<(), ApiError> {
        let known = self.cheap_tools(tokenizer);
        let fields = [
            ("tools", if known { None } else { self.tools }),
            ("documents", self.documents),
            ("chat_template_kwargs", self.chat_template_kwargs),
            ("tool_choice", self.tool_choice),
        ];
        let mut values = MAX_TEMPLATE_VALUES;
        for (param, raw) in fields {
            let Some(raw) = raw else { continue };
            count_json_values(raw.get(), &mut values).map_err(|_| {
                    ApiError::invalid(
                        "invalid_request",
                        param,
                        format!(
                            "tools, documents, chat_template_kwargs and tool_choice must hold at most {MAX_TEMPLATE_VALUES} JSON values in all"
                        ),
                    )
                })?;
        }
        Ok(())
    }
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
        count_json_values(raw.get(), &mut values).map_err(|_| {
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
