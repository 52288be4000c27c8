//! Bucket configuration (serde + JSON Schema), validation with field paths, and
//! construction of a model's [`BucketResolver`].

use std::collections::{BTreeMap, BTreeSet};

use router_policy::{ConfigError, PolicyConfig, PolicyHandles};
use router_state::{EngineId, ModelMode, Role};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::bucket::{Bucket, BucketError, BucketGroups, TokenLimits};
use crate::group::EngineGroup;
use crate::resolver::BucketResolver;
use crate::shadow::ShadowConfig;
use crate::slo::SloTargets;

/// One bucket as configured.
///
/// ```yaml
/// id: short-context
/// rank: 10
/// limits: {min: 0, max: 4096}
/// max_context_tokens: 8192
/// groups:
///   pd:
///     prefill: {engine_ids: [P1], policy: {type: power_of_two}}
///     decode: {engine_ids: [D1]}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    /// Unique, non-empty id; appears in metrics and the `x-switchyard-bucket` header.
    pub id: String,
    /// Tie-breaker between buckets of equal capacity; lower is tried first.
    #[serde(default)]
    pub rank: i32,
    /// Accepted prompt lengths in tokens (inclusive); default 0 to unbounded.
    #[serde(default)]
    pub limits: TokenLimits,
    /// Longest prompt plus output the bucket's engines hold; absent = unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_context_tokens: Option<u64>,
    /// The bucket's engine groups: `plain`, or `pd` with `prefill` and `decode`.
    pub groups: GroupsConfig,
    /// Latency targets: a request goes first to the fitting buckets predicted to meet
    /// theirs; absent = none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<SloTargets>,
}

/// A bucket's groups: exactly one of `plain` or `pd`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupsConfig {
    /// One group of plain engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain: Option<GroupConfig>,
    /// A prefill group and a decode group; both are required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pd: Option<PdGroupsConfig>,
}

/// The two groups of a PD bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PdGroupsConfig {
    /// The prefill group.
    pub prefill: GroupConfig,
    /// The decode group.
    pub decode: GroupConfig,
}

/// One engine group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// Member engine ids; absent = every healthy engine of the model in this role,
    /// `[]` = none.
    #[serde(default, alias = "worker_ids", skip_serializing_if = "Option::is_none")]
    pub engine_ids: Option<Vec<String>>,
    /// The group's policy; absent = the default policy for the role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyConfig>,
    /// A policy that picks beside the group's on a share of its picks, as a dry run,
    /// to count how often they agree and the cached tokens each finds; absent = none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowConfig>,
}

/// The engines a model's configuration declares, by id and (when known) role;
/// membership is validated against it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelRoster {
    engines: BTreeMap<EngineId, Option<Role>>,
}

impl ModelRoster {
    /// A roster of `(id, role)` pairs.
    pub fn new(engines: impl IntoIterator<Item = (EngineId, Role)>) -> Self {
        Self {
            engines: engines
                .into_iter()
                .map(|(id, role)| (id, Some(role)))
                .collect(),
        }
    }

    /// Adds engines whose role is not known yet (it will be read from the engine);
    /// membership naming them is accepted for any role.
    pub fn with_unknown_roles(mut self, ids: impl IntoIterator<Item = EngineId>) -> Self {
        self.engines.extend(ids.into_iter().map(|id| (id, None)));
        self
    }

    /// Whether the roster declares this engine.
    pub fn contains(&self, id: &str) -> bool {
        self.engines.contains_key(id)
    }

    /// The role of the engine with this id, when declared and known.
    pub fn role_of(&self, id: &str) -> Option<Role> {
        self.engines.get(id).copied().flatten()
    }

    /// Plain or PD, from the engines whose role is known; `None` when no role is.
    pub fn mode(&self) -> Option<ModelMode> {
        self.engines
            .values()
            .flatten()
            .next()
            .map(|role| ModelMode::of(*role))
    }
}

/// The policy a group gets when it names none, per role. The default is the
/// built-in one: `round_robin` for plain groups, `power_of_two` for prefill and
/// decode groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultPolicies {
    /// For plain groups.
    pub plain: PolicyConfig,
    /// For prefill groups.
    pub prefill: PolicyConfig,
    /// For decode groups.
    pub decode: PolicyConfig,
}

impl Default for DefaultPolicies {
    fn default() -> Self {
        Self {
            plain: PolicyConfig::RoundRobin(Default::default()),
            prefill: PolicyConfig::PowerOfTwo(Default::default()),
            decode: PolicyConfig::PowerOfTwo(Default::default()),
        }
    }
}

impl DefaultPolicies {
    /// The policy of groups of `role`.
    pub fn for_role(&self, role: Role) -> &PolicyConfig {
        match role {
            Role::Plain => &self.plain,
            Role::Prefill => &self.prefill,
            Role::Decode => &self.decode,
        }
    }

    /// The same policy for every role.
    pub fn uniform(policy: PolicyConfig) -> Self {
        Self {
            plain: policy.clone(),
            prefill: policy.clone(),
            decode: policy,
        }
    }
}

/// The policy every group of a model runs, with the group's role: each configured
/// group's own policy or its role's default, and its shadow policy; without buckets, the default of every
/// role (the catch-all bucket's kind follows the engines). The application reads it
/// to provide what the policies need (token ids, a prefix index, affinity headers).
pub fn group_policies<'a>(
    buckets: Option<&'a [BucketConfig]>,
    defaults: &'a DefaultPolicies,
) -> Vec<(Role, &'a PolicyConfig)> {
    let Some(buckets) = buckets else {
        return [Role::Plain, Role::Prefill, Role::Decode]
            .into_iter()
            .map(|role| (role, defaults.for_role(role)))
            .collect();
    };
    let mut policies = Vec::new();
    for bucket in buckets {
        let mut group = |role: Role, config: &'a GroupConfig| {
            policies.push((
                role,
                config
                    .policy
                    .as_ref()
                    .unwrap_or_else(|| defaults.for_role(role)),
            ));
            if let Some(shadow) = &config.shadow {
                policies.push((role, &shadow.policy));
            }
        };
        if let Some(plain) = &bucket.groups.plain {
            group(Role::Plain, plain);
        }
        if let Some(pd) = &bucket.groups.pd {
            group(Role::Prefill, &pd.prefill);
            group(Role::Decode, &pd.decode);
        }
    }
    policies
}

/// Id of the bucket built when a model configures none.
pub const CATCH_ALL_BUCKET: &str = "default";

/// Validates a model's bucket configuration and builds its resolver. `buckets: None`
/// builds one catch-all bucket (every length, every engine, default policies) of the
/// roster's mode.
///
/// # Errors
/// The first invalid field, with its path.
pub fn build_resolver(
    buckets: Option<&[BucketConfig]>,
    roster: &ModelRoster,
    defaults: &DefaultPolicies,
    handles: &PolicyHandles,
) -> Result<BucketResolver, ConfigError> {
    let catch_all;
    let configs = match buckets {
        Some([]) => {
            return Err(ConfigError::at(
                "buckets",
                "must list at least one bucket; omit it for one catch-all bucket",
            ));
        }
        Some(configs) => configs,
        None => {
            catch_all = [catch_all_config(roster.mode().unwrap_or(ModelMode::Plain))];
            &catch_all
        }
    };
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut built = Vec::with_capacity(configs.len());
    for (i, config) in configs.iter().enumerate() {
        let path = format!("buckets[{i}]");
        if let Some(first) = seen.insert(&config.id, i) {
            return Err(ConfigError::at(
                format!("{path}.id"),
                format_args!(
                    "duplicate bucket id {:?} (also buckets[{first}])",
                    config.id
                ),
            ));
        }
        built.push(build_bucket(&path, config, roster, defaults, handles)?);
    }
    BucketResolver::new(built).map_err(|e| ConfigError::at("buckets", e))
}

fn catch_all_config(mode: ModelMode) -> BucketConfig {
    BucketConfig {
        id: CATCH_ALL_BUCKET.to_owned(),
        rank: 0,
        limits: TokenLimits::default(),
        max_context_tokens: None,
        groups: match mode {
            ModelMode::Plain => GroupsConfig {
                plain: Some(GroupConfig::default()),
                pd: None,
            },
            ModelMode::Pd => GroupsConfig {
                plain: None,
                pd: Some(PdGroupsConfig {
                    prefill: GroupConfig::default(),
                    decode: GroupConfig::default(),
                }),
            },
        },
        slo: None,
    }
}

/// Validates one bucket's configuration at `path` and builds the bucket.
fn build_bucket(
    path: &str,
    config: &BucketConfig,
    roster: &ModelRoster,
    defaults: &DefaultPolicies,
    handles: &PolicyHandles,
) -> Result<Bucket, ConfigError> {
    let groups = build_groups(path, &config.groups, roster, defaults, handles)?;
    let bucket = Bucket::new(
        config.id.as_str(),
        config.rank,
        config.limits,
        config.max_context_tokens,
        groups,
    )
    .map_err(|e| bucket_error(path, e))?
    .with_load(std::sync::Arc::clone(&handles.load));
    match config.slo {
        None => Ok(bucket),
        Some(targets) => match targets.problem() {
            Some(problem) => Err(ConfigError::at(format!("{path}.slo"), problem)),
            None => Ok(bucket.with_slo(targets)),
        },
    }
}

/// Validates the groups of the bucket at `path` against the model's mode and builds
/// them.
fn build_groups(
    path: &str,
    config: &GroupsConfig,
    roster: &ModelRoster,
    defaults: &DefaultPolicies,
    handles: &PolicyHandles,
) -> Result<BucketGroups, ConfigError> {
    match (&config.plain, &config.pd, roster.mode()) {
        (Some(_), Some(_), _) => Err(ConfigError::at(
            format!("{path}.groups"),
            "set either plain or pd, not both: a bucket is plain or prefill/decode",
        )),
        (None, None, _) => Err(ConfigError::at(format!("{path}.groups"), "set plain or pd")),
        (Some(group), None, Some(ModelMode::Plain) | None) => {
            let path = format!("{path}.groups.plain");
            let group = build_group(&path, group, Role::Plain, roster, defaults, handles)?;
            Ok(BucketGroups::Plain(group))
        }
        (None, Some(pd), Some(ModelMode::Pd) | None) => {
            build_pd_groups(&format!("{path}.groups.pd"), pd, roster, defaults, handles)
        }
        (Some(_), None, Some(ModelMode::Pd)) => Err(ConfigError::at(
            format!("{path}.groups.plain"),
            "the model is served by prefill/decode engines; use groups.pd with prefill and decode groups",
        )),
        (None, Some(_), Some(ModelMode::Plain)) => Err(ConfigError::at(
            format!("{path}.groups.pd"),
            "the model is served by plain engines; use groups.plain",
        )),
    }
}

/// Builds the prefill group, then the decode group, of the `pd` groups at `path`.
fn build_pd_groups(
    path: &str,
    pd: &PdGroupsConfig,
    roster: &ModelRoster,
    defaults: &DefaultPolicies,
    handles: &PolicyHandles,
) -> Result<BucketGroups, ConfigError> {
    Ok(BucketGroups::Pd {
        prefill: build_group(
            &format!("{path}.prefill"),
            &pd.prefill,
            Role::Prefill,
            roster,
            defaults,
            handles,
        )?,
        decode: build_group(
            &format!("{path}.decode"),
            &pd.decode,
            Role::Decode,
            roster,
            defaults,
            handles,
        )?,
    })
}

/// The configuration error, with its field's path, of a bucket at `path` that
/// [`Bucket::new`] refused.
fn bucket_error(path: &str, error: BucketError) -> ConfigError {
    match error {
        BucketError::EmptyId => ConfigError::at(format!("{path}.id"), "must not be empty"),
        BucketError::EmptyRange { min, max, .. } => ConfigError::at(
            format!("{path}.limits"),
            format_args!("min ({min}) is above max ({max})"),
        ),
        BucketError::ContextBelowRange { context, min, .. } => ConfigError::at(
            format!("{path}.max_context_tokens"),
            format_args!("{context} is below limits.min ({min}), so no request fits"),
        ),
        other => ConfigError::at(path, other),
    }
}

fn build_group(
    path: &str,
    config: &GroupConfig,
    role: Role,
    roster: &ModelRoster,
    defaults: &DefaultPolicies,
    handles: &PolicyHandles,
) -> Result<EngineGroup, ConfigError> {
    let policy_config = config
        .policy
        .as_ref()
        .unwrap_or_else(|| defaults.for_role(role));
    let policy = policy_config
        .build(role, handles)
        .map_err(|e| ConfigError::at(format!("{path}.policy"), e))?;
    let shadowed = |group: EngineGroup| match &config.shadow {
        Some(shadow) => {
            Ok(group.with_shadow(shadow.build(&format!("{path}.shadow"), role, handles)?))
        }
        None => Ok(group),
    };
    let Some(ids) = &config.engine_ids else {
        return shadowed(EngineGroup::new(policy));
    };
    let mut members = BTreeSet::new();
    for (k, id) in ids.iter().enumerate() {
        let at = format!("{path}.engine_ids[{k}]");
        match roster.role_of(id) {
            _ if id.is_empty() => {
                return Err(ConfigError::at(at, "engine id must not be empty"));
            }
            None if !roster.contains(id) => {
                return Err(ConfigError::at(at, format_args!("unknown engine {id:?}")));
            }
            Some(actual) if actual != role => {
                return Err(ConfigError::at(
                    at,
                    format_args!(
                        "engine {id:?} is a {actual} engine, but this group picks {role} engines"
                    ),
                ));
            }
            _ => {}
        }
        if !members.insert(EngineId::from(id.as_str())) {
            return Err(ConfigError::at(
                at,
                format_args!("engine {id:?} is listed twice"),
            ));
        }
    }
    shadowed(EngineGroup::with_members(policy, members))
}
