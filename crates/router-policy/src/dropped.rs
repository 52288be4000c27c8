//! Options of earlier routers that the bucket-first design removed.
//!
//! They are rejected with a message naming what replaced them, never accepted and
//! ignored. One table serves configuration keys, policy type names and command-line
//! flags (`--stable-pair` is looked up as `stable_pair`).

use std::fmt;

/// A removed option and its replacement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DroppedOption {
    /// The option's name in configuration form (`snake_case`).
    pub name: &'static str,
    /// What to use instead.
    pub replacement: &'static str,
}

impl fmt::Display for DroppedOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` was removed: {}", self.name, self.replacement)
    }
}

const SCORE_REPLACEMENT: &str = "attach an explicit policy to each role group instead \
     (`cache_aware` for prefix reuse, `load_based` or `power_of_two` for load) with `admission` caps";

/// Removed policy type names.
pub const DROPPED_POLICY_TYPES: &[DroppedOption] = &[
    DroppedOption {
        name: "fused_score",
        replacement: SCORE_REPLACEMENT,
    },
    DroppedOption {
        name: "score_policy",
        replacement: SCORE_REPLACEMENT,
    },
    DroppedOption {
        name: "legacy_host_affinity",
        replacement: "attach `power_of_two` (or any policy) to the decode group; \
                      both engines of a PD pair always come from one bucket",
    },
];

/// Removed configuration keys and flags.
pub const DROPPED_OPTIONS: &[DroppedOption] = &[
    DroppedOption {
        name: "fuse",
        replacement: SCORE_REPLACEMENT,
    },
    DroppedOption {
        name: "stable_pair",
        replacement: "bucket-first selection always takes both PD engines from the same bucket",
    },
    DroppedOption {
        name: "affinity_mode",
        replacement: "`session_aware` always reuses admitted bindings (the former strict mode); \
                      soft mode's pressure escape is gone",
    },
    DroppedOption {
        name: "session_affinity_mode",
        replacement: "sessions are bound per model, bucket and stage by `session_aware`; \
                      global modes are not supported",
    },
    DroppedOption {
        name: "prefix_cache_min_share",
        replacement: "use `cache_aware` with `min_matched_tokens` (not equivalent to the share filter)",
    },
    DroppedOption {
        name: "filter",
        replacement: "`admission.max_inflight_requests` replaces the `overloaded` filter; \
                      `cache_aware` with `min_matched_tokens` replaces `prefix_cache`",
    },
    DroppedOption {
        name: "max_in_flight",
        replacement: "use `admission.max_inflight_requests`",
    },
];

/// The removed policy type `name`, if it is one.
pub fn dropped_policy_type(name: &str) -> Option<&'static DroppedOption> {
    DROPPED_POLICY_TYPES.iter().find(|d| d.name == name)
}

/// The removed option `name`, given as a key (`stable_pair`) or a flag
/// (`--stable-pair`).
pub fn dropped_option(name: &str) -> Option<&'static DroppedOption> {
    let key = name.trim_start_matches('-').replace('-', "_");
    DROPPED_OPTIONS.iter().find(|d| d.name == key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_keys_find_the_same_entry() {
        assert_eq!(
            dropped_option("--stable-pair"),
            dropped_option("stable_pair")
        );
        assert_eq!(
            dropped_option("--prefix-cache-min-share")
                .unwrap()
                .to_string(),
            "`prefix_cache_min_share` was removed: use `cache_aware` with `min_matched_tokens` \
             (not equivalent to the share filter)"
        );
        assert!(dropped_option("--policy").is_none());
        assert_eq!(
            dropped_policy_type("score_policy").unwrap().replacement,
            SCORE_REPLACEMENT
        );
        assert!(dropped_policy_type("power_of_two").is_none());
    }
}
