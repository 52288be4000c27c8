//! The body fields the router owns: where a PD request's KV goes (SGLang's bootstrap
//! fields, vLLM's `kv_transfer_params`) and which data-parallel rank serves it. A
//! client's own values for them never reach an engine: they are taken out of the body
//! before any leg is built, and each leg writes the router's once.
//!
//! Rewriting an object keeps every other field as sent (its text, not a parse of it)
//! and writes as it reads, holding no more than the body's size.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::ApiError;

/// The top-level fields the router writes on the legs that need them.
pub(crate) const OWNED: [&str; 5] = [
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "kv_transfer_params",
    "data_parallel_rank",
];

/// A field that was sent, whatever its value (`null` included): what the router owns
/// is taken out however a client fills it.
pub(crate) fn present<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<IgnoredAny>, D::Error> {
    IgnoredAny::deserialize(deserializer).map(Some)
}

/// `body` (a JSON object) without the fields of [`OWNED`].
pub(crate) fn without_owned(body: &[u8]) -> Result<Bytes, ApiError> {
    rewrite(body, |key| !OWNED.contains(&key)).map(Bytes::from)
}

/// The JSON object `body` with only the top-level fields `keep` keeps, in order, each
/// value as sent.
pub(crate) fn rewrite(body: &[u8], keep: impl FnMut(&str) -> bool) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::with_capacity(body.len());
    let mut reader = serde_json::Deserializer::from_slice(body);
    reader
        .deserialize_map(Rewrite {
            out: &mut out,
            keep,
        })
        .and_then(|()| reader.end())
        .map_err(|e| ApiError::bad_body(format!("the body is not a JSON object: {e}")))?;
    Ok(out)
}

struct Rewrite<'o, F> {
    out: &'o mut Vec<u8>,
    keep: F,
}

impl<'de, F: FnMut(&str) -> bool> Visitor<'de> for Rewrite<'_, F> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.out.push(b'{');
        let mut first = true;
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            let value = map.next_value::<&'de RawValue>()?;
            if !(self.keep)(&key) {
                continue;
            }
            if !first {
                self.out.push(b',');
            }
            first = false;
            serde_json::to_writer(&mut *self.out, &key).map_err(serde::de::Error::custom)?;
            self.out.push(b':');
            self.out.extend_from_slice(value.get().as_bytes());
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// A field name, borrowed from the body unless it holds escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }

            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }

            fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn owned_fields_are_taken_out_whatever_their_spelling() {
        let body = br#"{"model":"m","kv_transfer_params":{"remote_host":"10.9.9.9"},"b\u006fotstrap_host":"x","data_parallel_rank":3,"bootstrap_room":null,"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let out: Value = serde_json::from_slice(&without_owned(body).unwrap()).unwrap();
        assert_eq!(
            out,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true})
        );
        let kept = br#"{"model":"m","x":{"kv_transfer_params":1}}"#;
        assert_eq!(
            &without_owned(kept).unwrap()[..],
            &kept[..],
            "only top-level fields are the router's"
        );
        assert!(without_owned(b"[1]").is_err());
    }
}
