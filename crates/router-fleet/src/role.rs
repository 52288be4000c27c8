//! The role an engine's `/server_info` gives it: its disaggregation mode, in the
//! router's terms.

use router_state::Role;
use router_upstream::DisaggregationMode;

/// The role of an engine in disaggregation `mode`: `null` is a plain engine, which
/// serves whole requests; `prefill` and `decode` are the roles of the same names.
pub fn role_of(mode: DisaggregationMode) -> Role {
    match mode {
        DisaggregationMode::Null => Role::Plain,
        DisaggregationMode::Prefill => Role::Prefill,
        DisaggregationMode::Decode => Role::Decode,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_is_the_role_of_its_name() {
        assert_eq!(
            [
                DisaggregationMode::Null,
                DisaggregationMode::Prefill,
                DisaggregationMode::Decode
            ]
            .map(role_of),
            [Role::Plain, Role::Prefill, Role::Decode]
        );
    }
}
