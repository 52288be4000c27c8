//! What a replay changes of a configuration's policies: every one of a type being
//! compared, and seeds for those that draw random numbers.

use router_buckets::DefaultPolicies;
use router_config::{RolePolicies, RouterConfig};
use router_policy::PolicyConfig;
use router_state::Role;

use crate::ReplayError;

/// `config` with every policy of every group (and every default) of type `name`, each
/// keeping the admission caps of the policy it replaces.
///
/// # Errors
/// `name` is not a policy type.
pub fn with_policy(config: &RouterConfig, name: &str) -> Result<RouterConfig, ReplayError> {
    let fresh: PolicyConfig =
        serde_json::from_value(serde_json::json!({ "type": name })).map_err(|problem| {
            ReplayError::Policy {
                name: name.to_owned(),
                problem,
            }
        })?;
    let swap = |slot: &mut Option<PolicyConfig>, keep_unset: bool| {
        let admission = slot.as_ref().map(|p| *p.admission());
        if slot.is_none() && keep_unset {
            return;
        }
        let mut policy = fresh.clone();
        if let Some(admission) = admission {
            *policy.admission_mut() = admission;
        }
        *slot = Some(policy);
    };
    let mut config = config.clone();
    for slot in roles(&mut config.policies) {
        swap(slot, false);
    }
    for_each_model_policy(&mut config, |slot| swap(slot, true));
    Ok(config)
}

/// `config` with every policy that draws random numbers and names no seed given
/// `seed`, so a replay draws the same numbers every time.
pub fn seeded(config: &RouterConfig, seed: u64) -> RouterConfig {
    let seed_one = |slot: &mut Option<PolicyConfig>| {
        let Some(policy) = slot else { return };
        let Ok(serde_json::Value::Object(mut fields)) = serde_json::to_value(&*policy) else {
            return;
        };
        if fields.get("seed").is_some_and(|s| !s.is_null()) {
            return;
        }
        fields.insert("seed".into(), seed.into());
        // Types without a seed refuse the field and stay as they are.
        if let Ok(with_seed) = serde_json::from_value(serde_json::Value::Object(fields)) {
            *policy = with_seed;
        }
    };
    let mut config = config.clone();
    let builtin = DefaultPolicies::default();
    for (slot, role) in
        roles(&mut config.policies)
            .into_iter()
            .zip([Role::Plain, Role::Prefill, Role::Decode])
    {
        if slot.is_none() {
            *slot = Some(builtin.for_role(role).clone());
        }
    }
    for slot in roles(&mut config.policies) {
        seed_one(slot);
    }
    for_each_model_policy(&mut config, seed_one);
    config
}

/// Applies `f` to every policy slot of every model: its role defaults and its groups'.
fn for_each_model_policy(config: &mut RouterConfig, mut f: impl FnMut(&mut Option<PolicyConfig>)) {
    for model in &mut config.models {
        for slot in roles(&mut model.policies) {
            f(slot);
        }
        for bucket in model.buckets.iter_mut().flatten() {
            let groups = &mut bucket.groups;
            let pd = groups
                .pd
                .as_mut()
                .map(|pd| [&mut pd.prefill, &mut pd.decode]);
            for group in groups.plain.iter_mut().chain(pd.into_iter().flatten()) {
                f(&mut group.policy);
            }
        }
    }
}

fn roles(policies: &mut RolePolicies) -> [&mut Option<PolicyConfig>; 3] {
    [
        &mut policies.plain,
        &mut policies.prefill,
        &mut policies.decode,
    ]
}
