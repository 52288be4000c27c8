//! Reloading the configuration file while the router serves.
//!
//! A new file is checked as startup checks one, around the running router's own
//! state (its load table, affinity store and each model's prefix index whose
//! settings are unchanged), so nothing it shares with the running configuration is
//! lost. It is refused whole, with the old configuration (and admin token) still
//! serving, when any check fails (an admin token file that cannot be read is one) or
//! it changes a section only a restart can change. Otherwise:
//! 1. every model's buckets and policies are built with its engines' roles (an
//!    engine whose role is not configured is asked for it first); an engine whose
//!    role cannot be known, or buckets its role does not fit, fail the reload before
//!    anything changed;
//! 2. the new engines join and changed ones are replaced (an unchanged engine is
//!    left as it is: its load reports, feeds, bindings and cache entries stay); a
//!    model new to the router gets no route of its own until the swap;
//! 3. the routes are swapped in one step, so a request sees the old configuration
//!    or the new one, never a mix, and the admin token (the file `admin.token_file`
//!    names is read again) takes the old one's place;
//! 4. engines the file no longer names leave (their in-flight requests finish).
//!
//! An engine that still fails to join in step 2 (it went away since step 1, or its
//! id is an engine's the admin API or Kubernetes discovery brought) fails the
//! reload: the engines that joined leave and replaced ones are registered from their
//! old settings again. Engines and models the admin API added are neither replaced
//! nor removed; a model the file drops keeps serving the engines the admin API added
//! to it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use router_config::{RouterConfig, SelectionState};
use router_fleet::{Change, EngineSpec, FleetError, Source};
use router_policy::ConfigError;
use router_state::EngineId;
use router_state::kv_events::PrefixIndex;

use crate::access::AdminAccess;
use crate::app::{AppContext, Configured, Registered, route};
use crate::metrics::OutcomeLabels;
use crate::routing::ModelRoute;
use crate::validated::{ModelPlan, SharedState, ValidatedConfig};

/// A reload that was refused or rolled back; the running configuration is
/// unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReloadError {
    /// The file has problems, each named with its path.
    Invalid(Vec<ConfigError>),
    /// Engines could not join, each named with its path; what had changed was undone.
    Failed(Vec<ConfigError>),
    /// The file could not be read whole: missing, not a regular file, too large, or
    /// still changing.
    Unreadable(ConfigError),
}

impl fmt::Display for ReloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, errors) = match self {
            Self::Invalid(errors) => ("the configuration was refused", errors.as_slice()),
            Self::Failed(errors) => ("the reload was rolled back", errors.as_slice()),
            Self::Unreadable(error) => (
                "the configuration file was not read",
                std::slice::from_ref(error),
            ),
        };
        write!(f, "{what}; the running configuration is unchanged:")?;
        for error in errors {
            write!(f, "\n  {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ReloadError {}

/// What an applied reload changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadSummary {
    /// Engines that joined.
    pub added: usize,
    /// Engines replaced because their settings changed.
    pub replaced: usize,
    /// Engines that left.
    pub removed: usize,
    /// Models served from the file.
    pub models: usize,
}

impl fmt::Display for ReloadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} models; engines: {} added, {} replaced, {} removed",
            self.models, self.added, self.replaced, self.removed
        )
    }
}

/// What a model's engines join with: its id, its engines, its prefix index.
type Joining = (String, Vec<EngineSpec>, Option<Arc<PrefixIndex>>);

/// What a reload changes of the engines the file brought.
struct Changes {
    /// The engines that join or are replaced, with their spec before (none for a
    /// new one).
    before: HashMap<EngineId, Option<EngineSpec>>,
    /// The engines the file no longer names.
    leaving: Vec<EngineId>,
    /// Their counts.
    summary: ReloadSummary,
}

impl Changes {
    fn between(ctx: &AppContext, configured: &Configured, next: &Configured) -> Self {
        let mut summary = ReloadSummary::default();
        let mut before = HashMap::new();
        for (id, spec) in &next.engines {
            let current = ctx.fleet.spec(id);
            if current.as_ref() != Some(spec) {
                if current.is_some() {
                    summary.replaced += 1;
                } else {
                    summary.added += 1;
                }
                before.insert(id.clone(), current);
            }
        }
        let leaving: Vec<EngineId> = configured
            .engines
            .keys()
            .filter(|id| !next.engines.contains_key(*id))
            .cloned()
            .collect();
        summary.removed = leaving.len();
        Self {
            before,
            leaving,
            summary,
        }
    }
}

/// Counts a reload's outcome in `reloads` and logs it.
pub(crate) fn record(
    reloads: &Family<OutcomeLabels, Counter>,
    outcome: Result<&ReloadSummary, &ReloadError>,
) {
    let label = match outcome {
        Ok(_) => "applied",
        Err(ReloadError::Invalid(_)) => "invalid",
        Err(ReloadError::Failed(_)) => "failed",
        Err(ReloadError::Unreadable(_)) => "unreadable",
    };
    reloads
        .get_or_create(&OutcomeLabels { outcome: label })
        .inc();
    match outcome {
        Ok(summary) => tracing::info!(%summary, "configuration reloaded"),
        Err(error) => tracing::warn!(%error, "configuration reload"),
    }
}

impl AppContext {
    /// Replaces the models, engines, buckets and policies the configuration file
    /// brought with those of `config`. Reloads run one at a time. See the module
    /// documentation.
    ///
    /// # Errors
    /// See [`ReloadError`]; nothing changed.
    pub async fn reload(&self, config: RouterConfig) -> Result<ReloadSummary, ReloadError> {
        let mut configured = self.configured.lock().await;
        let outcome = self.apply(&mut configured, config).await;
        self.record(outcome.as_ref());
        outcome
    }

    /// Counts and logs a reload refused before it reached the router (the file
    /// could not be read, [`ReloadError::Unreadable`], or parsed,
    /// [`ReloadError::Invalid`]), and returns it.
    pub fn refuse_reload(&self, refused: ReloadError) -> ReloadError {
        self.record(Err(&refused));
        refused
    }

    fn record(&self, outcome: Result<&ReloadSummary, &ReloadError>) {
        record(&self.metrics.config_reloads, outcome);
    }

    async fn apply(
        &self,
        configured: &mut Configured,
        config: RouterConfig,
    ) -> Result<ReloadSummary, ReloadError> {
        let validated = self.check(configured, config).await?;
        let next = Configured::of(&validated);
        // Nothing changes until every engine's role is known and every route built.
        let changes = Changes::between(self, configured, &next);
        let (routes, joining) = self.routes(validated.models, &changes.before).await?;
        self.join(&next, &joining, &changes.before).await?;
        // One step from the old routes to the new; then the engines left behind go.
        let file_models = configured.models.clone();
        self.routing.replace(routes, validated.defaults, |model| {
            !file_models.contains(model)
        });
        self.fleet.set_breaker_groups(self.routing.listed_groups());
        self.replace_admin(validated.admin);
        for id in &changes.leaving {
            if let Err(e) = self
                .fleet
                .apply(Change::Remove(id.clone(), Source::Config))
                .await
            {
                tracing::warn!(engine = %id, error = %e, "an engine the file no longer names");
            }
        }
        self.keep_dropped_models(configured, &next);
        *configured = next;
        Ok(ReloadSummary {
            models: joining.len(),
            ..changes.summary
        })
    }

    /// Puts `admin` in force: requests from now on need its token.
    fn replace_admin(&self, admin: AdminAccess) {
        let admin = Arc::new(admin);
        let before = self.admin.swap(Arc::clone(&admin));
        if before != admin {
            let on = *admin != AdminAccess::Off;
            tracing::info!(on, "the admin API's token changed");
        }
    }

    /// `config` checked around the running router's state; refused when it changes
    /// a section only a restart can change.
    async fn check(
        &self,
        configured: &Configured,
        config: RouterConfig,
    ) -> Result<ValidatedConfig, ReloadError> {
        let shared = SharedState {
            selection: SelectionState {
                load: Arc::clone(self.fleet.load()),
                affinity: self.routing.handles().affinity.clone(),
                prefix_indexes: self.fleet.prefix_indexes().into_iter().collect(),
            },
            affinity: self.affinity.clone(),
            tokenizers: configured.tokenizers.clone(),
            indexer_metrics: self.metrics.indexers.clone(),
        };
        // Loading a new tokenizer reads and parses a file: off the serving threads.
        let validated =
            tokio::task::spawn_blocking(move || ValidatedConfig::around(config, shared))
                .await
                .map_err(|e| ReloadError::Invalid(vec![ConfigError::at("(root)", e)]))?
                .map_err(ReloadError::Invalid)?;
        let changes = configured.restart_only.changes(&validated.restart_only);
        if !changes.is_empty() {
            return Err(ReloadError::Invalid(changes));
        }
        Ok(validated)
    }

    /// Every model's route, built with its engines' roles, and what its engines join
    /// with.
    async fn routes(
        &self,
        models: Vec<ModelPlan>,
        before: &HashMap<EngineId, Option<EngineSpec>>,
    ) -> Result<(HashMap<String, Arc<ModelRoute>>, Vec<Joining>), ReloadError> {
        let mut routes = HashMap::new();
        let mut joining = Vec::new();
        let mut errors = Vec::new();
        for (m, model) in models.into_iter().enumerate() {
            let roles = self.roles(&model.engines, before).await;
            let id = model.selection.id.clone();
            let (engines, index) = (model.engines.clone(), model.selection.prefix_index.clone());
            let previous = self.routing.get(&id).and_then(|r| r.flow.clone());
            match route(model, &roles, previous) {
                Ok(route) => drop(routes.insert(id.clone(), Arc::new(route))),
                Err(problems) => {
                    let at = format!("models[{m}]");
                    errors.extend(problems.into_iter().map(|e| e.within(&at)));
                }
            }
            joining.push((id, engines, index));
        }
        if !errors.is_empty() {
            return Err(ReloadError::Failed(errors));
        }
        Ok((routes, joining))
    }

    /// The new and changed engines join; routes of models new to the router wait for
    /// the swap. When one cannot, what joined is undone.
    async fn join(
        &self,
        next: &Configured,
        joining: &[Joining],
        before: &HashMap<EngineId, Option<EngineSpec>>,
    ) -> Result<(), ReloadError> {
        let routed: HashSet<String> = self.routing.model_ids().into_iter().collect();
        self.routing
            .set_pending(next.models.difference(&routed).cloned().collect());
        let indexes: HashMap<String, _> = self.fleet.prefix_indexes().into_iter().collect();
        let mut joined = Vec::new();
        let mut errors = Vec::new();
        for (m, (model, engines, index)) in joining.iter().enumerate() {
            self.fleet.keep_prefix_index(model, index.clone());
            let changed = engines
                .iter()
                .enumerate()
                .filter(|(_, e)| before.contains_key(&e.id));
            let applied = futures_util::future::join_all(changed.map(|(e, spec)| async move {
                (
                    e,
                    spec,
                    self.fleet.apply(Change::Upsert(spec.clone())).await,
                )
            }))
            .await;
            for (e, spec, applied) in applied {
                match applied {
                    Ok(_) => joined.push(spec.id.clone()),
                    Err(error) => {
                        errors.push(ConfigError::at(format!("models[{m}].engines[{e}]"), error))
                    }
                }
            }
        }
        if errors.is_empty() {
            return Ok(());
        }
        self.undo(&joined, before, joining, indexes).await;
        self.routing.set_pending(HashSet::new());
        Err(ReloadError::Failed(errors))
    }

    /// A model the file dropped keeps serving the engines the admin API added to it;
    /// without any, it lets go of its prefix index.
    fn keep_dropped_models(&self, configured: &Configured, next: &Configured) {
        let snapshot = self.fleet.snapshot();
        for model in configured.models.difference(&next.models) {
            match snapshot.model_engines(model).first() {
                Some(engine) => {
                    if let Err(e) = self.routing.serve_new_model(engine) {
                        tracing::warn!(model, error = %e, "the model's engines added at runtime cannot be routed");
                    }
                }
                None => self.fleet.keep_prefix_index(model, None),
            }
        }
    }

    /// Each engine's role: configured, or the registered engine's when its spec is
    /// unchanged, or what its `/server_info` says (an engine that does not answer
    /// has none, and cannot join).
    async fn roles(
        &self,
        engines: &[EngineSpec],
        before: &HashMap<EngineId, Option<EngineSpec>>,
    ) -> Registered {
        let snapshot = self.fleet.snapshot();
        futures_util::future::join_all(engines.iter().enumerate().map(|(e, spec)| {
            let registered = snapshot.get(spec.id.as_str()).cloned();
            async move {
                if let Some(role) = spec.role {
                    return Ok(role);
                }
                if let Some(engine) = registered.filter(|_| !before.contains_key(&spec.id)) {
                    return Ok(engine.role());
                }
                let info = self.upstream.server_info(&spec.url).await;
                let reachable = info.is_some();
                info.and_then(|info| info.disaggregation_mode.map(router_fleet::role_of))
                    .ok_or_else(|| {
                        ConfigError::at(
                            format!("engines[{e}]"),
                            FleetError::UnknownRole { reachable },
                        )
                    })
            }
        }))
        .await
    }

    /// Undoes the joins of a reload that could not finish: engines that joined leave
    /// again, replaced ones are registered from their old specs (what was known of
    /// them is gone), and each model's prefix index is the one it had.
    async fn undo(
        &self,
        joined: &[EngineId],
        before: &HashMap<EngineId, Option<EngineSpec>>,
        plans: &[Joining],
        indexes: HashMap<String, Arc<PrefixIndex>>,
    ) {
        for id in joined {
            let undo = match before.get(id).cloned().flatten() {
                None => Change::Remove(id.clone(), Source::Config),
                Some(old) => Change::Upsert(old),
            };
            if let Err(e) = self.fleet.apply(undo).await {
                tracing::warn!(engine = %id, error = %e, "undoing a failed reload");
            }
        }
        for (model, _, _) in plans {
            self.fleet
                .keep_prefix_index(model, indexes.get(model).cloned());
        }
    }
}
