//! What the indexer follows, and reloading it: the engines of each model with a
//! cache-aware group and that model's index.
//!
//! A new file is checked as a router checks one (startup's checks, around the
//! indexer's load table and each model's index whose settings are unchanged, so its
//! pages stay; a section only a restart changes refused), and is refused whole, the
//! old one still followed, when a check fails or no model of it has a cache-aware
//! group. Otherwise each model that has one keeps its index (a new one for a model
//! new to cache-aware routing), the engines new or changed join, and once every one
//! did the engines the file no longer names leave (their pages are forgotten, their
//! series go) and the models left without a cache-aware group let go of their index;
//! then the admin token and the lookups' token (a `prefix_indexer.token_file` read
//! again) take the old ones' place. An engine that cannot join fails
//! the reload: those that joined leave, replaced ones are registered again from
//! their old settings and every index is the one it was. Engines the admin API or
//! Kubernetes discovery brought are neither replaced nor removed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use router_config::RouterConfig;
use router_fleet::{Change, EngineSpec, Fleet, Source};
use router_policy::ConfigError;
use router_state::EngineId;
use router_state::kv_events::PrefixIndex;

use super::lookup_access;
use crate::access::{AdminAccess, TokenDigest};
use crate::app::Configured;
use crate::metrics::OutcomeLabels;
use crate::reload::{ReloadError, ReloadSummary, record};
use crate::validated::{RestartOnly, SharedState, ValidatedConfig};

/// The engines and indexes a running indexer follows, and who may change them.
#[derive(Debug)]
pub struct IndexerContext {
    pub(crate) fleet: Arc<Fleet>,
    /// Who may use `/workers`; a reload replaces it.
    pub(crate) admin: ArcSwap<AdminAccess>,
    /// Who may look up: a caller with this token, anyone when `None`; a reload
    /// reads it again.
    pub(crate) lookups: ArcSwap<Option<TokenDigest>>,
    /// How long a request's body may take to arrive.
    pub(crate) body_timeout: Duration,
    /// What the file brought; a reload holds it while it runs.
    configured: tokio::sync::Mutex<Configured>,
    /// Reloads by outcome.
    pub(crate) config_reloads: Family<OutcomeLabels, Counter>,
}

/// A model the indexer keeps an index of: its id, index and engines, and where the
/// file names it.
struct Indexed {
    at: usize,
    model: String,
    index: Arc<PrefixIndex>,
    engines: Vec<EngineSpec>,
}

/// The models of `config` with a cache-aware group.
fn indexed(config: &ValidatedConfig) -> Vec<Indexed> {
    (config.models.iter().enumerate())
        .filter_map(|(at, model)| {
            Some(Indexed {
                at,
                model: model.selection.id.clone(),
                index: Arc::clone(model.selection.prefix_index.as_ref()?),
                engines: model.engines.clone(),
            })
        })
        .collect()
}

/// What of `config` the indexer follows: the models with a cache-aware group and
/// their engines; `restart_only` is the file's own (with its `prefix_indexer`).
fn followed(config: &ValidatedConfig, restart_only: RestartOnly) -> Configured {
    let mut followed = Configured::of(config);
    followed.restart_only = restart_only;
    let models: HashSet<String> = indexed(config).into_iter().map(|m| m.model).collect();
    followed
        .engines
        .retain(|_, spec| models.contains(&spec.model));
    followed.models = models;
    followed
}

/// The problem of a configuration without a cache-aware group.
pub(super) fn nothing_indexed() -> ConfigError {
    ConfigError::at(
        "models",
        "no model has a cache-aware group and a tokenizer: the indexer would index nothing",
    )
}

impl IndexerContext {
    /// The context of an indexer following what `config` names (its engines not yet
    /// joined); `restart_only` is the file's own.
    pub(super) fn new(
        fleet: Arc<Fleet>,
        config: &ValidatedConfig,
        restart_only: RestartOnly,
        admin: AdminAccess,
        lookups: Option<TokenDigest>,
    ) -> Self {
        Self {
            fleet,
            admin: ArcSwap::from_pointee(admin),
            lookups: ArcSwap::from_pointee(lookups),
            body_timeout: config.client.body,
            configured: tokio::sync::Mutex::new(followed(config, restart_only)),
            config_reloads: crate::metrics::config_reloads(),
        }
    }

    /// The engines it follows and the indexes it keeps.
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// Follows what `config` names from now on, in place of the file it followed.
    /// Reloads run one at a time. See the module documentation.
    ///
    /// # Errors
    /// See [`ReloadError`]; nothing changed.
    pub async fn reload(&self, config: RouterConfig) -> Result<ReloadSummary, ReloadError> {
        let mut configured = self.configured.lock().await;
        let outcome = self.apply(&mut configured, config).await;
        record(&self.config_reloads, outcome.as_ref());
        outcome
    }

    /// Counts and logs a reload refused before it reached the indexer (the file
    /// could not be read or parsed), and returns it.
    pub fn refuse_reload(&self, refused: ReloadError) -> ReloadError {
        record(&self.config_reloads, Err(&refused));
        refused
    }

    async fn apply(
        &self,
        configured: &mut Configured,
        config: RouterConfig,
    ) -> Result<ReloadSummary, ReloadError> {
        let (validated, restart_only, lookups) = self.check(configured, config).await?;
        let models = indexed(&validated);
        let next = followed(&validated, restart_only);
        let mut summary = ReloadSummary {
            models: models.len(),
            ..ReloadSummary::default()
        };
        let mut before = HashMap::new();
        for (id, spec) in &next.engines {
            let current = self.fleet.spec(id);
            if current.as_ref() != Some(spec) {
                match current {
                    Some(_) => summary.replaced += 1,
                    None => summary.added += 1,
                }
                before.insert(id.clone(), current);
            }
        }
        let leaving: Vec<EngineId> = (configured.engines.keys())
            .filter(|id| !next.engines.contains_key(*id))
            .cloned()
            .collect();
        summary.removed = leaving.len();
        self.join(&models, &before).await?;
        for id in leaving {
            let leave = Change::Remove(id.clone(), Source::Config);
            if let Err(e) = self.fleet.apply(leave).await {
                tracing::warn!(engine = %id, error = %e, "an engine the file no longer names");
            }
        }
        for model in configured.models.difference(&next.models) {
            self.fleet.keep_prefix_index(model, None);
        }
        let admin = Arc::new(validated.admin);
        if self.admin.swap(Arc::clone(&admin)) != admin {
            tracing::info!(
                on = *admin != AdminAccess::Off,
                "the admin API's token changed"
            );
        }
        let lookups = Arc::new(lookups);
        if self.lookups.swap(Arc::clone(&lookups)) != lookups {
            tracing::info!(on = lookups.is_some(), "the lookups' token changed");
        }
        *configured = next;
        Ok(summary)
    }

    /// `config` checked around the indexer's load table and indexes (without its
    /// `prefix_indexer` section, which is the routers' client: only its token is
    /// read), the sections only a restart changes and the lookups' token; refused
    /// when it changes one of those sections or indexes nothing.
    async fn check(
        &self,
        configured: &Configured,
        mut config: RouterConfig,
    ) -> Result<(ValidatedConfig, RestartOnly, Option<TokenDigest>), ReloadError> {
        let restart_only = RestartOnly::of(&config);
        let section = config.prefix_indexer.take();
        let mut shared = SharedState::new(&config);
        shared.selection.load = Arc::clone(self.fleet.load());
        shared.selection.prefix_indexes = self.fleet.prefix_indexes().into_iter().collect();
        shared.tokenizers = configured.tokenizers.clone();
        // Reading the token and tokenizer files: off the serving threads.
        let (validated, lookups, mut problems) = tokio::task::spawn_blocking(move || {
            let mut problems = Vec::new();
            let lookups = lookup_access(section.as_ref(), &mut problems);
            (ValidatedConfig::around(config, shared), lookups, problems)
        })
        .await
        .map_err(|e| ReloadError::Invalid(vec![ConfigError::at("(root)", e)]))?;
        let validated = validated.map_err(|mut errors| {
            errors.append(&mut problems);
            ReloadError::Invalid(errors)
        })?;
        if !problems.is_empty() {
            return Err(ReloadError::Invalid(problems));
        }
        let changes = configured.restart_only.indexer_changes(&restart_only);
        if !changes.is_empty() {
            return Err(ReloadError::Invalid(changes));
        }
        if validated
            .models
            .iter()
            .all(|m| m.selection.prefix_index.is_none())
        {
            return Err(ReloadError::Invalid(vec![nothing_indexed()]));
        }
        Ok((validated, restart_only, lookups))
    }

    /// Each model keeps its index and its new and changed engines join; when one
    /// cannot, what joined is undone.
    async fn join(
        &self,
        models: &[Indexed],
        before: &HashMap<EngineId, Option<EngineSpec>>,
    ) -> Result<(), ReloadError> {
        let indexes: HashMap<String, _> = self.fleet.prefix_indexes().into_iter().collect();
        let mut joined = Vec::new();
        let mut errors = Vec::new();
        for model in models {
            self.fleet
                .keep_prefix_index(&model.model, Some(Arc::clone(&model.index)));
            let changed = (model.engines.iter().enumerate())
                .filter(|(_, spec)| before.contains_key(&spec.id))
                .map(|(e, spec)| async move {
                    (
                        e,
                        spec,
                        self.fleet.apply(Change::Upsert(spec.clone())).await,
                    )
                });
            for (e, spec, applied) in futures_util::future::join_all(changed).await {
                match applied {
                    Ok(_) => joined.push(spec.id.clone()),
                    Err(error) => errors.push(ConfigError::at(
                        format!("models[{}].engines[{e}]", model.at),
                        error,
                    )),
                }
            }
        }
        if errors.is_empty() {
            return Ok(());
        }
        for id in &joined {
            let undo = match before.get(id).cloned().flatten() {
                None => Change::Remove(id.clone(), Source::Config),
                Some(old) => Change::Upsert(old),
            };
            if let Err(e) = self.fleet.apply(undo).await {
                tracing::warn!(engine = %id, error = %e, "undoing a failed reload");
            }
        }
        for model in models {
            (self.fleet).keep_prefix_index(&model.model, indexes.get(&model.model).cloned());
        }
        Err(ReloadError::Failed(errors))
    }
}
