//! What an engine's `/server_info` makes of it in the router's terms: its role (its
//! disaggregation mode) and what its KV hand-over needs of a PD partner.

use router_state::{PdProfile, Role};
use router_upstream::{DisaggregationMode, HandOver};

/// The role of an engine in disaggregation `mode`: `null` is a plain engine, which
/// serves whole requests; `prefill` and `decode` are the roles of the same names.
pub fn role_of(mode: DisaggregationMode) -> Role {
    match mode {
        DisaggregationMode::Null => Role::Plain,
        DisaggregationMode::Prefill => Role::Prefill,
        DisaggregationMode::Decode => Role::Decode,
    }
}

/// What the KV hand-over an engine's `/server_info` describes needs of the engine
/// at the other end of a prefill/decode pair.
pub fn pd_profile_of(hand_over: &HandOver) -> PdProfile {
    PdProfile {
        transfer_backend: hand_over.transfer_backend.as_deref().map(Into::into),
        page_size: hand_over.page_size,
        kv_cache_dtype: hand_over.kv_cache_dtype.as_deref().map(Into::into),
        attention_tp_size: hand_over.attention_tp_size,
        pp_size: hand_over.pp_size,
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
