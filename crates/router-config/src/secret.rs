//! A setting that must not be printed: a bearer token.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A string kept out of `Debug` output (and so out of logs and panics that print a
/// configuration): it prints as `Secret(..)`. Serialized as the plain string.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
#[schemars(inline)]
pub struct Secret(String);

impl Secret {
    /// The string itself, for whoever checks or sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}
