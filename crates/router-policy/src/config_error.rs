//! What is wrong with a configuration: a policy's settings that cannot be built
//! ([`PolicyConfigError`]), and the one error every layer reports, with the path of
//! the field it concerns ([`ConfigError`]).

use std::fmt;

use router_state::Role;

/// A configuration that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyConfigError {
    /// An admission cap of zero.
    #[error("admission.{limit} must be at least 1: a cap of 0 admits nothing")]
    ZeroCap {
        /// The cap's name.
        limit: &'static str,
    },
    /// A setting outside its valid range.
    #[error("{setting} {reason}")]
    Invalid {
        /// The setting's path within the policy.
        setting: &'static str,
        /// What the value must be.
        reason: &'static str,
    },
    /// The policy cannot serve the group's role.
    #[error("policy {policy} cannot pick {role} engines{hint}")]
    WrongRole {
        /// The policy type.
        policy: &'static str,
        /// The group's role.
        role: Role,
        /// What to do instead.
        hint: &'static str,
    },
    /// The policy needs shared state the application did not provide.
    #[error("policy {policy} needs {needs}")]
    MissingState {
        /// The policy type.
        policy: &'static str,
        /// What is missing and how to provide it.
        needs: &'static str,
    },
}

/// A configuration problem and the path of the field it concerns, e.g.
/// `models[0].buckets[1].groups.pd.decode.engine_ids[0]`. A layer reports paths
/// relative to what it was given; the layer above places them with
/// [`within`](Self::within).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    /// Path of the offending field.
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

impl ConfigError {
    /// A problem of the field at `path`.
    pub fn at(path: impl fmt::Display, message: impl fmt::Display) -> Self {
        Self {
            path: path.to_string(),
            message: message.to_string(),
        }
    }

    /// The same problem seen from the parent: `within("models[0]")` turns
    /// `buckets[1].id` into `models[0].buckets[1].id`.
    #[must_use]
    pub fn within(mut self, parent: &str) -> Self {
        self.path = if self.path.is_empty() {
            parent.to_owned()
        } else if self.path.starts_with('[') {
            format!("{parent}{}", self.path)
        } else {
            format!("{parent}.{}", self.path)
        };
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_nest_from_the_field_up() {
        let error = ConfigError::at("engine_ids[0]", "unknown engine \"X\"")
            .within("groups.plain")
            .within("buckets[1]")
            .within("models[0]");
        assert_eq!(
            error.to_string(),
            "models[0].buckets[1].groups.plain.engine_ids[0]: unknown engine \"X\""
        );
        assert_eq!(
            ConfigError::at("", "bad").within("models[2]").path,
            "models[2]"
        );
        assert_eq!(
            ConfigError::at("[3]", "bad").within("engines").path,
            "engines[3]"
        );
    }
}
