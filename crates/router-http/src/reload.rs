//! Reloading the configuration file while the router serves.
//!
//! A new file is checked as startup checks one, around the running router's own
//! state (its load table, affinity store and each model's prefix index whose
//! settings are unchanged), so nothing it shares with the running configuration is
//! lost. It is refused whole, with the old configuration still serving, when any
//! check fails or it changes a section only a restart can change. Otherwise:
//! 1. the new engines join and changed ones are replaced (an unchanged engine is
//!    left as it is: its load reports, feeds, bindings and cache entries stay);
//! 2. every model's buckets and policies are built with the roles the engines have;
//! 3. the routes are swapped in one step, so a request sees the old configuration
//!    or the new one, never a mix;
//! 4. engines the file no longer names leave (their in-flight requests finish).
//!
//! An engine that cannot join (unreachable without a configured role, say) fails the
//! reload: the engines added are removed and the replaced ones restored. Engines
//! and models the admin API added are neither replaced nor removed.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use router_fleet::{Change, EngineSpec};
use router_policy::ConfigError;
use router_state::EngineId;

use crate::app::{AppContext, Configured, register, route};
use crate::config::{RestartOnly, RouterConfig, SharedState};
use crate::metrics::OutcomeLabels;

/// A reload that was refused or rolled back; the running configuration is
/// unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReloadError {
    /// The file has problems, each named with its path.
    Invalid(Vec<ConfigError>),
    /// Engines could not join, each named with its path; what had changed was undone.
    Failed(Vec<ConfigError>),
}

impl fmt::Display for ReloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, errors) = match self {
            Self::Invalid(errors) => ("the configuration was refused", errors),
            Self::Failed(errors) => ("the reload was rolled back", errors),
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
    /// could not be read or parsed), and returns it.
    pub fn refuse_reload(&self, errors: Vec<ConfigError>) -> ReloadError {
        let refused = ReloadError::Invalid(errors);
        self.record(Err(&refused));
        refused
    }

    fn record(&self, outcome: Result<&ReloadSummary, &ReloadError>) {
        let label = match outcome {
            Ok(_) => "applied",
            Err(ReloadError::Invalid(_)) => "invalid",
            Err(ReloadError::Failed(_)) => "failed",
        };
        self.metrics
            .config_reloads
            .get_or_create(&OutcomeLabels { outcome: label })
            .inc();
        match outcome {
            Ok(summary) => tracing::info!(%summary, "configuration reloaded"),
            Err(error) => tracing::warn!(%error, "configuration reload"),
        }
    }

    async fn apply(
        &self,
        configured: &mut Configured,
        config: RouterConfig,
    ) -> Result<ReloadSummary, ReloadError> {
        let mut errors = configured.restart_only.changes(&RestartOnly::of(&config));
        let shared = SharedState {
            load: Arc::clone(self.fleet.load()),
            backend: self.routing.handles().affinity.clone(),
            affinity: self.affinity.clone(),
            prefix_indexes: self.fleet.prefix_indexes().into_iter().collect(),
        };
        let validated = config.validate_with(shared);
        let validated = match validated {
            Ok(validated) if errors.is_empty() => validated,
            Ok(_) => return Err(ReloadError::Invalid(errors)),
            Err(problems) => {
                errors.extend(problems);
                return Err(ReloadError::Invalid(errors));
            }
        };
        let next = Configured::of(&validated);
        let mut summary = ReloadSummary {
            models: validated.models.len(),
            ..ReloadSummary::default()
        };
        for (id, spec) in &next.engines {
            match configured.engines.get(id) {
                None => summary.added += 1,
                Some(old) if old != spec => summary.replaced += 1,
                Some(_) => {}
            }
        }
        let leaving: Vec<EngineId> = configured
            .engines
            .keys()
            .filter(|id| !next.engines.contains_key(*id))
            .cloned()
            .collect();
        summary.removed = leaving.len();

        let previous_indexes: HashMap<String, _> =
            self.fleet.prefix_indexes().into_iter().collect();
        let mut routes = HashMap::new();
        let mut errors = Vec::new();
        for (m, model) in validated.models.into_iter().enumerate() {
            let registered = register(&self.fleet, &model).await;
            let id = model.id.clone();
            match route(model, &registered) {
                Ok(route) => drop(routes.insert(id, Arc::new(route))),
                Err(problems) => {
                    let at = format!("models[{m}]");
                    errors.extend(problems.into_iter().map(|e| e.within(&at)));
                }
            }
        }
        if !errors.is_empty() {
            self.restore(configured, &next, previous_indexes).await;
            return Err(ReloadError::Failed(errors));
        }

        let runtime_models: HashSet<String> = self
            .routing
            .model_ids()
            .into_iter()
            .filter(|model| !configured.models.contains(model))
            .collect();
        self.routing.replace(routes, validated.defaults, |model| {
            runtime_models.contains(model)
        });
        for id in leaving {
            // Gone already when the admin API removed it.
            drop(self.fleet.apply(Change::Remove(id)).await);
        }
        for model in configured.models.difference(&next.models) {
            if !runtime_models.contains(model) {
                self.fleet.keep_prefix_index(model, None);
            }
        }
        *configured = next;
        Ok(summary)
    }

    /// Undoes a reload that could not finish: engines that joined leave, replaced
    /// ones take their old settings again, and each model's prefix index is the one
    /// it had.
    async fn restore(
        &self,
        configured: &Configured,
        next: &Configured,
        indexes: HashMap<String, Arc<router_state::kv_events::PrefixIndex>>,
    ) {
        for (id, spec) in &next.engines {
            let undo = match configured.engines.get(id) {
                None => Change::Remove(id.clone()),
                Some(old) if old != spec => Change::Upsert(EngineSpec::clone(old)),
                Some(_) => continue,
            };
            if let Err(e) = self.fleet.apply(undo).await {
                tracing::warn!(engine = %id, error = %e, "undoing a failed reload");
            }
        }
        for model in next.models.union(&configured.models) {
            self.fleet
                .keep_prefix_index(model, indexes.get(model).cloned());
        }
    }
}
