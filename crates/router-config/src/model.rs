//! The `models` section: each model, its engines, and the default policies per role
//! that the router and each model may set.

use std::collections::BTreeMap;
use std::path::PathBuf;

use router_buckets::{BucketConfig, DefaultPolicies};
use router_policy::{ConfigError, PolicyConfig, RoutedPagesSettings};
use router_state::kv_events::IndexConfig;
use router_state::{MAX_DP_SIZE, ModelMode, Role, check_name};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::flow::FlowConfig;

/// One model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The `model` field clients send.
    pub id: String,
    /// Path to the model's `tokenizer.json`; the chat template comes from the
    /// `tokenizer_config.json` beside it, used when a bucket bounds prompt length or
    /// a policy reads prompts. Absent (or unused) = prompt length estimated from size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PathBuf>,
    /// KV page size in tokens, for prefix hashing.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// Most KV pages the model's prefix index keeps (`cache_aware` groups); past it
    /// the least recently matched pages are forgotten. About 130 bytes per page with
    /// up to 64 engine ranks, up to about 425 with 1,024 (see docs/configuration.md).
    #[serde(default = "default_prefix_index_pages")]
    pub prefix_index_pages: usize,
    /// Most (page, engine rank) entries the model's prefix index keeps, all ranks
    /// together: a page eight ranks hold is eight entries. Past it the least recently
    /// matched pages are forgotten, as past `prefix_index_pages`; with many ranks
    /// sharing prefixes it is the bound that holds first. About 40 bytes per entry.
    #[serde(default = "default_prefix_index_entries")]
    pub prefix_index_entries: usize,
    /// How `cache_aware` groups count the pages the router itself routed: pending on
    /// an engine until its KV events announce them, and an estimate of the caches of
    /// engines that publish no KV events.
    #[serde(default)]
    pub routed_pages: RoutedPagesSettings,
    /// Flow control: a queue for requests that find every fitting engine full,
    /// priority bands and tenants (`flow`); by default none of it.
    #[serde(default)]
    pub flow: FlowConfig,
    /// The model's engines.
    #[serde(default)]
    pub engines: Vec<EngineConfig>,
    /// Buckets; absent = one catch-all bucket over every engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<Vec<BucketConfig>>,
    /// Default policies of this model's groups, overriding the router-wide ones.
    #[serde(default)]
    pub policies: RolePolicies,
    /// How the model's prefill and decode engines hand a request over.
    #[serde(default)]
    pub pd_protocol: PdProtocol,
    /// The engine serving the model, whose way of making a chat request into a
    /// prompt the router follows (SGLang and vLLM differ: docs/configuration.md);
    /// absent = the engine `pd_protocol` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<ServingEngine>,
    /// The tokens each image, audio or video part of a chat is counted as: at least
    /// what the model's processor makes of one, so a bucket never counts a
    /// multimodal prompt short; absent = the bound the `preprocessor_config.json`
    /// beside the tokenizer gives (Qwen2-VL's kind), else 16,384.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub media_part_tokens: Option<u32>,
}

/// An engine whose request handling the router reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServingEngine {
    /// SGLang.
    Sglang,
    /// vLLM.
    Vllm,
}

impl ModelConfig {
    /// The engine serving the model: `served_by`, else the one `pd_protocol` names.
    pub fn serving_engine(&self) -> ServingEngine {
        self.served_by.unwrap_or(match self.pd_protocol {
            PdProtocol::Sglang => ServingEngine::Sglang,
            PdProtocol::Vllm => ServingEngine::Vllm,
        })
    }
}

/// How a model's prefill and decode engines hand a request over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PdProtocol {
    /// SGLang's bootstrap rendezvous: both legs sent at once, with the prefill
    /// engine's bootstrap address and one fresh bootstrap room.
    #[default]
    Sglang,
    /// vLLM's `kv_transfer_params` (its NIXL connector, as vLLM's own proxy drives
    /// it): the prefill leg first, for one token and not streamed; the
    /// `kv_transfer_params` of its answer then go with the decode leg, whose answer
    /// the client gets.
    Vllm,
}

impl ModelConfig {
    /// The page size of a model that names none, in tokens.
    pub const DEFAULT_BLOCK_SIZE: u32 = 16;

    /// A model of `engines` with one catch-all bucket and default settings.
    pub fn new(id: impl Into<String>, engines: Vec<EngineConfig>) -> Self {
        Self {
            id: id.into(),
            tokenizer: None,
            block_size: default_block_size(),
            prefix_index_pages: default_prefix_index_pages(),
            prefix_index_entries: default_prefix_index_entries(),
            routed_pages: RoutedPagesSettings::default(),
            flow: FlowConfig::default(),
            engines,
            buckets: None,
            policies: RolePolicies::default(),
            pd_protocol: PdProtocol::default(),
            served_by: None,
            media_part_tokens: None,
        }
    }
}

fn default_block_size() -> u32 {
    ModelConfig::DEFAULT_BLOCK_SIZE
}

/// The smallest prefix index accepted: below it eviction would run on every batch.
const MIN_PREFIX_INDEX_PAGES: usize = 1024;

fn default_prefix_index_pages() -> usize {
    IndexConfig::default().max_nodes
}

fn default_prefix_index_entries() -> usize {
    IndexConfig::default().max_entries
}

/// One engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Unique id across the router; appears in headers, metrics and errors.
    pub id: String,
    /// Base URL, e.g. `http://10.0.0.7:30000`, or `https://engine-1.example:8443`
    /// for TLS (see `engine_tls`).
    pub url: String,
    /// Plain, prefill or decode; absent = read from the engine's `/server_info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<EngineRole>,
    /// A prefill engine's bootstrap port; absent = from `/server_info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
    /// Data-parallel ranks; absent = from `/server_info`, else 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_size: Option<u32>,
    /// Base port of the engine's `LoadStat` feed (rank r = base + r); absent = from
    /// `/server_info`'s `kv_events` block, else no feed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_port: Option<u16>,
    /// Base port of the engine's KV-event publisher (rank r = base + r), for
    /// cache-aware routing; absent = from `/server_info`'s `kv_events` block (vLLM,
    /// which has no `/server_info`, needs it set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_port: Option<u16>,
    /// Base port of the engine's KV-event replay socket; absent = from
    /// `/server_info`, else gaps cannot be repaired and clear the engine's entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_replay_port: Option<u16>,
}

impl EngineConfig {
    /// An engine at `url` whose role, ports and ranks come from its `/server_info`.
    pub fn new(id: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            url: url.into(),
            role: None,
            bootstrap_port: None,
            dp_size: None,
            load_port: None,
            kv_port: None,
            kv_replay_port: None,
        }
    }
}

/// An engine role in configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EngineRole {
    /// Serves whole requests.
    Plain,
    /// The prefill side of a PD pair.
    Prefill,
    /// The decode side of a PD pair.
    Decode,
}

impl From<EngineRole> for Role {
    fn from(role: EngineRole) -> Self {
        match role {
            EngineRole::Plain => Role::Plain,
            EngineRole::Prefill => Role::Prefill,
            EngineRole::Decode => Role::Decode,
        }
    }
}

/// Default policies per role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RolePolicies {
    /// For plain groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain: Option<PolicyConfig>,
    /// For prefill groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<PolicyConfig>,
    /// For decode groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<PolicyConfig>,
}

impl RolePolicies {
    /// These defaults over `fallback`.
    pub fn over(&self, fallback: &DefaultPolicies) -> DefaultPolicies {
        DefaultPolicies {
            plain: self.plain.clone().unwrap_or_else(|| fallback.plain.clone()),
            prefill: self
                .prefill
                .clone()
                .unwrap_or_else(|| fallback.prefill.clone()),
            decode: self
                .decode
                .clone()
                .unwrap_or_else(|| fallback.decode.clone()),
        }
    }
}

impl RolePolicies {
    /// Each policy set is one the router can build; paths under `at`
    /// (`policies`, `models[0].policies`).
    pub(crate) fn validate(&self, at: &str, errors: &mut Vec<ConfigError>) {
        let Self {
            plain,
            prefill,
            decode,
        } = self;
        for (role, policy) in [("plain", plain), ("prefill", prefill), ("decode", decode)] {
            if let Some(Err(e)) = policy.as_ref().map(PolicyConfig::validate) {
                errors.push(ConfigError::at(format!("{at}.{role}"), e.to_string()));
            }
        }
    }
}

/// Every model's fields: names, ids unique across models (engines too), page sizes
/// and index budgets, engine URLs and ranks, one mode per model, policies.
pub(crate) fn validate_models(models: &[ModelConfig], errors: &mut Vec<ConfigError>) {
    let mut model_ids: BTreeMap<&str, usize> = BTreeMap::new();
    let mut engine_ids: BTreeMap<&str, String> = BTreeMap::new();
    for (m, model) in models.iter().enumerate() {
        let at = |field: &str| format!("models[{m}].{field}");
        if let Err(e) = check_name(&model.id) {
            errors.push(ConfigError::at(at("id"), e));
        } else if let Some(first) = model_ids.insert(&model.id, m) {
            errors.push(ConfigError::at(
                at("id"),
                format!("duplicate model id {:?} (also models[{first}])", model.id),
            ));
        }
        model.validate(m, &mut engine_ids, errors);
    }
}

impl ModelConfig {
    /// The model's own fields and its engines', as `models[m]`; `engine_ids` holds
    /// the engine ids of the models before it.
    fn validate<'a>(
        &'a self,
        m: usize,
        engine_ids: &mut BTreeMap<&'a str, String>,
        errors: &mut Vec<ConfigError>,
    ) {
        let Self {
            id: _,
            tokenizer: _,
            block_size,
            prefix_index_pages,
            prefix_index_entries,
            routed_pages,
            flow,
            engines,
            buckets,
            policies,
            pd_protocol: _,
            served_by: _,
            media_part_tokens,
        } = self;
        let at = |field: &str| format!("models[{m}].{field}");
        for (b, bucket) in buckets.iter().flatten().enumerate() {
            // Bucket ids reach metric labels too; an empty one is the bucket checks'
            // to report.
            if !bucket.id.is_empty()
                && let Err(e) = check_name(&bucket.id)
            {
                errors.push(ConfigError::at(at(&format!("buckets[{b}].id")), e));
            }
        }
        if *block_size == 0 {
            errors.push(ConfigError::at(at("block_size"), "must be at least 1"));
        }
        if *media_part_tokens == Some(0) {
            errors.push(ConfigError::at(
                at("media_part_tokens"),
                "must be at least 1",
            ));
        }
        if *prefix_index_pages < MIN_PREFIX_INDEX_PAGES {
            errors.push(ConfigError::at(
                at("prefix_index_pages"),
                format!("must be at least {MIN_PREFIX_INDEX_PAGES}"),
            ));
        }
        if *prefix_index_entries < MIN_PREFIX_INDEX_PAGES {
            errors.push(ConfigError::at(
                at("prefix_index_entries"),
                format!("must be at least {MIN_PREFIX_INDEX_PAGES}"),
            ));
        }
        for (field, problem) in flow.problems() {
            errors.push(ConfigError::at(at(&format!("flow.{field}")), problem));
        }
        for (field, problem) in routed_pages.problems() {
            errors.push(ConfigError::at(
                at(&format!("routed_pages.{field}")),
                problem,
            ));
        }
        let mut mode: Option<(ModelMode, usize)> = None;
        for (e, engine) in engines.iter().enumerate() {
            let at = |field: &str| format!("models[{m}].engines[{e}].{field}");
            if let Err(e) = check_name(&engine.id) {
                errors.push(ConfigError::at(at("id"), e));
            } else if let Some(first) = engine_ids.insert(&engine.id, at("id")) {
                errors.push(ConfigError::at(
                    at("id"),
                    format!("duplicate engine id {:?} (also {first})", engine.id),
                ));
            }
            engine.validate(&at, errors);
            let Some(role) = engine.role else { continue };
            let this = ModelMode::of(role.into());
            match mode {
                Some((existing, first)) if existing != this => errors.push(ConfigError::at(
                    at("role"),
                    format!(
                        "a {} engine cannot join a model served by {} engines (models[{m}].engines[{first}]); \
                         a model is either all plain or all prefill/decode",
                        Role::from(role),
                        existing.as_str()
                    ),
                )),
                Some(_) => {}
                None => mode = Some((this, e)),
            }
        }
        policies.validate(&at("policies"), errors);
    }
}

impl EngineConfig {
    /// The URL and the ranks; `at` names a field of this engine.
    fn validate(&self, at: &dyn Fn(&str) -> String, errors: &mut Vec<ConfigError>) {
        let Self {
            id: _,
            url,
            role: _,
            bootstrap_port: _,
            dp_size,
            load_port: _,
            kv_port: _,
            kv_replay_port: _,
        } = self;
        if let Err(message) = router_upstream::check_engine_url(url) {
            errors.push(ConfigError::at(at("url"), message.to_string()));
        }
        match *dp_size {
            Some(0) => errors.push(ConfigError::at(at("dp_size"), "must be at least 1")),
            Some(n) if n > MAX_DP_SIZE => errors.push(ConfigError::at(
                at("dp_size"),
                format_args!("must be at most {MAX_DP_SIZE}"),
            )),
            _ => {}
        }
    }
}
