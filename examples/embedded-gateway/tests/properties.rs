//! Property tests a gateway runs in its CI: the policy it embeds against the policy
//! crate's naive reference model, and its own bucket rule over random loads.

use std::sync::Arc;

use embedded_gateway::{Gateway, MAX_WAITING, SHORT_PROMPT_TOKENS};
use proptest::prelude::*;
use router_policy::test_kit::{Scenario, admission_limits, engine_loads, reference, request_shape};
use router_policy::{LeastLoadPolicy, PickRequest, Policy};
use router_state::Role;

proptest! {
    #[test]
    fn least_load_picks_an_admitted_candidate_whenever_one_exists(
        loads in engine_loads(1..10),
        limits in admission_limits(),
        shape in request_shape(),
    ) {
        let scenario = Scenario::new("chat", Role::Plain, &loads);
        let policy = LeastLoadPolicy::new(Arc::clone(&scenario.load), Arc::new(limits));
        let request = PickRequest::new(shape.facts("chat"), Role::Plain, "bucket");
        let outcome = scenario.block_on(policy.pick(&scenario.engines, &request));
        if let Err(broken) = reference::check_pick(&scenario, &limits, &outcome, true) {
            prop_assert!(false, "{}", broken);
        }
    }

    #[test]
    fn short_prompts_stay_short_while_a_short_queue_has_room(
        waiting in proptest::collection::vec(0u64..8, 2),
        input_tokens in 1u64..(3 * SHORT_PROMPT_TOKENS),
    ) {
        let gateway = Gateway::new(
            &[("s1", "http://10.0.0.1:8000"), ("s2", "http://10.0.0.2:8000")],
            &[("l1", "http://10.0.1.1:8000")],
        ).expect("a valid gateway");
        for (engine, waiting) in ["s1", "s2"].into_iter().zip(&waiting) {
            gateway.report(engine, 1, *waiting).expect("a gateway engine");
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
        let routed = runtime.block_on(gateway.route(input_tokens)).expect("the long bucket admits all");
        let short_has_room = waiting.iter().any(|w| *w < MAX_WAITING);
        if input_tokens <= SHORT_PROMPT_TOKENS && short_has_room {
            prop_assert_eq!(&*routed.bucket, "short");
            let index = if routed.engine.as_str() == "s1" { 0 } else { 1 };
            prop_assert!(waiting[index] < MAX_WAITING, "{} has a full queue", routed.engine);
        } else {
            prop_assert_eq!(&*routed.bucket, "long");
            prop_assert_eq!(routed.engine.as_str(), "l1");
        }
    }
}
