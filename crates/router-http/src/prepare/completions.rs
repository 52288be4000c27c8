//! `POST /v1/completions`: the OpenAI completion body, validated with precise 400s;
//! the prompt is `prompt` as it is (no chat template): text, token ids, or a list of
//! either.
//!
//! A list of prompts is one request to one engine, which holds every prompt as a
//! sequence of its own: the longest decides the bucket, and cache-aware routing
//! hashes the first. `max_tokens` defaults to 16, as in vLLM and SGLang, and may be 0
//! (vLLM scores a prompt with `echo` and no output).

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde::de::{Deserializer, Error as _, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use super::checks::{
    Sampling, batch_cache_salt, check_integer, model, scalar, stream_and_sampling,
};
use super::owned::present;
use super::{Parsed, Prompt, batch_of};
use crate::error::ApiError;

/// The most token ids a request's prompts may hold together: far past any model's
/// context, and a bound on what a body of ids makes the router hold (4 bytes an id).
pub(crate) const MAX_PROMPT_IDS: usize = 1 << 22;

/// The most prompts a request may list (OpenAI takes 2,048 embedding inputs): each
/// costs the router a few dozen bytes however short.
pub(crate) const MAX_PROMPTS: usize = 1 << 16;

/// The output budget of a completion that names none (vLLM's and SGLang's default).
const DEFAULT_MAX_TOKENS: u64 = 16;

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
    prompt: Option<&'a RawValue>,
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
    /// `Some(Null)` for `null` (no budget), `None` when absent (the default).
    #[serde(default, deserialize_with = "scalar")]
    max_tokens: Option<Value>,
    #[serde(default, deserialize_with = "scalar")]
    add_special_tokens: Option<Value>,
    #[serde(default, borrow)]
    cache_salt: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "scalar")]
    priority: Option<Value>,
}

/// A completion's prompts, each text or token ids; at least one is not empty.
#[derive(Debug)]
pub(crate) enum CompletionPrompts<'b> {
    /// Text, tokenized as it is.
    Texts {
        /// The prompts.
        texts: Vec<Cow<'b, str>>,
        /// The body field they came from, named in errors.
        param: &'static str,
        /// Whether the tokenizer's special tokens are put around each (vLLM's
        /// `add_special_tokens`, true unless the body says otherwise).
        special_tokens: bool,
    },
    /// Token ids, routed on as they are.
    Ids(Vec<Vec<u32>>),
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
    let prompts = read_prompts(prompt, "prompt", special_tokens(probe.add_special_tokens)?)?;
    let stream = stream_and_sampling(&Sampling {
        stream: &probe.stream,
        stream_options: probe.stream_options,
        n: &probe.n,
        temperature: &probe.temperature,
        top_p: &probe.top_p,
        presence_penalty: &probe.presence_penalty,
        frequency_penalty: &probe.frequency_penalty,
    })?;
    // Absent: the engines' default; `null`: no budget.
    let max_tokens = match probe.max_tokens {
        None => Some(DEFAULT_MAX_TOKENS),
        given => check_integer(&given, "max_tokens", 0, u64::from(u32::MAX))?,
    };
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
        model: Some(model),
        stream,
        batch: batch_of(prompt, &prompts),
        adapter: None,
        prompt: Prompt::Completion(prompts),
        max_output_tokens: max_tokens,
    })
}

/// `add_special_tokens`: true unless the body says otherwise.
pub(super) fn special_tokens(value: Option<Value>) -> Result<bool, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(b),
        Some(_) => Err(ApiError::invalid(
            "invalid_parameter",
            "add_special_tokens",
            "add_special_tokens must be a boolean",
        )),
    }
}

/// The prompts in the body field `param` (a completion's `prompt`, an embedding's
/// `input`), read as one of their forms without buffering them: a list of ids is held
/// as 4 bytes an id, at most [`MAX_PROMPT_IDS`] of them.
pub(super) fn read_prompts<'b>(
    prompt: &'b RawValue,
    param: &'static str,
    special_tokens: bool,
) -> Result<CompletionPrompts<'b>, ApiError> {
    let invalid = |message: String| ApiError::invalid("invalid_prompt", param, message);
    let mut reader = serde_json::Deserializer::from_str(prompt.get());
    let form = reader
        .deserialize_any(FormVisitor)
        .map_err(|e| invalid(format!("{param} must be {EXPECTED}: {e}")))?;
    let prompts = match form {
        Form::Texts(texts) => CompletionPrompts::Texts {
            texts,
            param,
            special_tokens,
        },
        Form::Ids(lists) => CompletionPrompts::Ids(lists),
    };
    let (count, all_empty) = match &prompts {
        CompletionPrompts::Texts { texts, .. } => (texts.len(), texts.iter().all(|t| t.is_empty())),
        CompletionPrompts::Ids(lists) => (lists.len(), lists.iter().all(Vec::is_empty)),
    };
    if count == 0 {
        return Err(invalid(format!("{param} must not be an empty list")));
    }
    if all_empty {
        return Err(invalid(format!("{param} must not be empty")));
    }
    Ok(prompts)
}

/// What `prompt` holds: texts, or lists of ids.
enum Form<'b> {
    Texts(Vec<Cow<'b, str>>),
    Ids(Vec<Vec<u32>>),
}

const EXPECTED: &str =
    "a string, a list of strings, a list of token ids or a list of lists of token ids";

/// Reads `prompt` in one pass, deciding its form by its first element.
struct FormVisitor;

impl<'de> Visitor<'de> for FormVisitor {
    type Value = Form<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED)
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, text: &'de str) -> Result<Form<'de>, E> {
        Ok(Form::Texts(vec![Cow::Borrowed(text)]))
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Form<'de>, E> {
        Ok(Form::Texts(vec![Cow::Owned(text.to_owned())]))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Form<'de>, A::Error> {
        let mut ids = 0;
        let mut count = |n: usize| {
            ids += n;
            if ids > MAX_PROMPT_IDS {
                Err(A::Error::custom(format_args!(
                    "the prompts hold more than {MAX_PROMPT_IDS} token ids"
                )))
            } else {
                Ok(())
            }
        };
        let Some(first) = seq.next_element::<Element<'de>>()? else {
            return Ok(Form::Ids(Vec::new()));
        };
        match first {
            Element::Text(text) => {
                let mut texts = vec![text];
                while let Some(element) = seq.next_element::<Element<'de>>()? {
                    if texts.len() == MAX_PROMPTS {
                        return Err(A::Error::custom(format_args!(
                            "more than {MAX_PROMPTS} prompts"
                        )));
                    }
                    let Element::Text(text) = element else {
                        return Err(A::Error::custom("a list mixes texts and token ids"));
                    };
                    texts.push(text);
                }
                Ok(Form::Texts(texts))
            }
            Element::Id(id) => {
                count(1)?;
                let mut list = vec![id];
                while let Some(id) = seq.next_element::<u32>()? {
                    count(1)?;
                    list.push(id);
                }
                Ok(Form::Ids(vec![list]))
            }
            Element::Ids(list) => {
                count(list.len())?;
                let mut lists = vec![list];
                // Each list read as the first was, so none holds more than the bound.
                while let Some(element) = seq.next_element::<Element<'de>>()? {
                    let Element::Ids(list) = element else {
                        return Err(A::Error::custom(
                            "a list of lists of token ids holds something else",
                        ));
                    };
                    if lists.len() == MAX_PROMPTS {
                        return Err(A::Error::custom(format_args!(
                            "more than {MAX_PROMPTS} prompts"
                        )));
                    }
                    count(list.len())?;
                    lists.push(list);
                }
                Ok(Form::Ids(lists))
            }
        }
    }
}

/// The first element of a `prompt` list, which decides the list's form.
enum Element<'b> {
    Text(Cow<'b, str>),
    Id(u32),
    Ids(Vec<u32>),
}

impl<'de> Deserialize<'de> for Element<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ElementVisitor)
    }
}

struct ElementVisitor;

impl<'de> Visitor<'de> for ElementVisitor {
    type Value = Element<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a string, a token id or a list of token ids")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, text: &'de str) -> Result<Element<'de>, E> {
        Ok(Element::Text(Cow::Borrowed(text)))
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Element<'de>, E> {
        Ok(Element::Text(Cow::Owned(text.to_owned())))
    }

    fn visit_u64<E: serde::de::Error>(self, id: u64) -> Result<Element<'de>, E> {
        u32::try_from(id)
            .map(Element::Id)
            .map_err(|_| E::custom(format_args!("token id {id} is out of range")))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Element<'de>, A::Error> {
        let mut ids = Vec::new();
        while let Some(id) = seq.next_element::<u32>()? {
            if ids.len() == MAX_PROMPT_IDS {
                return Err(A::Error::custom(format_args!(
                    "the prompts hold more than {MAX_PROMPT_IDS} token ids"
                )));
            }
            ids.push(id);
        }
        Ok(Element::Ids(ids))
    }
}
