//! The live engine set: membership, model, role and health, read as immutable snapshots.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::engine::{Engine, EngineId, Health, Role};
use crate::pd::PdProfile;

/// Whether a model is served by plain engines or by prefill/decode pairs.
///
/// A model is never both: mixing would let a plain request land on half of a PD pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelMode {
    /// Every engine of the model has [`Role::Plain`].
    Plain,
    /// Every engine of the model is a prefill or a decode engine.
    Pd,
}

impl ModelMode {
    /// The mode an engine of `role` implies for its model.
    pub fn of(role: Role) -> Self {
        if role.is_pd() {
            ModelMode::Pd
        } else {
            ModelMode::Plain
        }
    }

    /// Lower-case name used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelMode::Plain => "plain",
            ModelMode::Pd => "prefill/decode",
        }
    }
}

/// Why the registry refused a change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// An engine id must be a non-empty string.
    #[error("engine id must not be empty")]
    EmptyId,
    /// An engine must name the model it serves.
    #[error("engine {id} must name the model it serves")]
    EmptyModel {
        /// The engine being added.
        id: EngineId,
    },
    /// Another engine already has this id.
    #[error("engine {id} is already registered")]
    DuplicateId {
        /// The id in use.
        id: EngineId,
    },
    /// No engine has this id.
    #[error("engine {id} is not registered")]
    UnknownEngine {
        /// The id looked up.
        id: EngineId,
    },
    /// Adding the engine would mix plain and prefill/decode engines in one model.
    #[error(
        "engine {id} is a {role} engine, but model {model:?} is served by {} engines; \
         a model is either all plain or all prefill/decode",
        existing.as_str()
    )]
    MixedModel {
        /// The engine being added.
        id: EngineId,
        /// Its model.
        model: String,
        /// Its role.
        role: Role,
        /// The mode the model already has.
        existing: ModelMode,
    },
}

/// One immutable view of the registry.
///
/// Readers hold an `Arc<RegistrySnapshot>` for as long as a request needs a stable view;
/// writers publish a new snapshot with a higher [`version`](Self::version).
#[derive(Debug, Default)]
pub struct RegistrySnapshot {
    version: u64,
    by_id: FxHashMap<EngineId, Arc<Engine>>,
    models: BTreeMap<Arc<str>, ModelEngines>,
}

#[derive(Debug, Clone)]
struct ModelEngines {
    mode: ModelMode,
    /// Sorted by id: the stable order candidate sets are built in.
    engines: Vec<Arc<Engine>>,
}

impl RegistrySnapshot {
    /// Increases by one with every change to the registry.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Number of engines.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no engine is registered.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The engine with this id.
    pub fn get(&self, id: &str) -> Option<&Arc<Engine>> {
        self.by_id.get(id)
    }

    /// The engines serving `model`, sorted by id; empty for an unknown model.
    pub fn model_engines(&self, model: &str) -> &[Arc<Engine>] {
        self.models.get(model).map_or(&[], |m| &m.engines)
    }

    /// Whether `model` is served by plain or PD engines, if it has any engine.
    pub fn model_mode(&self, model: &str) -> Option<ModelMode> {
        self.models.get(model).map(|m| m.mode)
    }

    /// Names of the models with at least one engine, in sorted order.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(|m| &**m)
    }

    /// Every engine, grouped by model and sorted by id within a model.
    pub fn engines(&self) -> impl Iterator<Item = &Arc<Engine>> {
        self.models.values().flat_map(|m| m.engines.iter())
    }

    /// Whether at least one healthy engine exists.
    pub fn any_healthy(&self) -> bool {
        self.by_id.values().any(|w| w.is_healthy())
    }

    fn with_engine(&self, engine: Arc<Engine>) -> Self {
        let mut next = self.clone_next();
        let entry = next
            .models
            .entry(Arc::from(engine.model()))
            .or_insert_with(|| ModelEngines {
                mode: ModelMode::of(engine.role()),
                engines: Vec::new(),
            });
        let at = entry
            .engines
            .binary_search_by(|w| w.id().cmp(engine.id()))
            .unwrap_or_else(|at| at);
        if entry.engines.get(at).is_some_and(|w| w.id() == engine.id()) {
            entry.engines[at] = Arc::clone(&engine);
        } else {
            entry.engines.insert(at, Arc::clone(&engine));
        }
        next.by_id.insert(engine.id().clone(), engine);
        next
    }

    fn without_engine(&self, engine: &Engine) -> Self {
        let mut next = self.clone_next();
        next.by_id.remove(engine.id());
        if let Some(entry) = next.models.get_mut(engine.model()) {
            entry.engines.retain(|w| w.id() != engine.id());
            if entry.engines.is_empty() {
                next.models.remove(engine.model());
            }
        }
        next
    }

    fn clone_next(&self) -> Self {
        Self {
            version: self.version + 1,
            by_id: self.by_id.clone(),
            models: self.models.clone(),
        }
    }
}

/// Live engines, their model membership, role and health.
///
/// Reads are lock-free ([`snapshot`](Self::snapshot) is one atomic load); writes are
/// serialised and publish a whole new snapshot, which suits a table that changes on
/// discovery and health transitions but is read on every request.
#[derive(Debug, Default)]
pub struct EngineRegistry {
    current: ArcSwap<RegistrySnapshot>,
    write: Mutex<()>,
}

impl EngineRegistry {
    /// An empty registry at version 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current view.
    pub fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.current.load_full()
    }

    /// Adds an engine and returns the new version.
    ///
    /// # Errors
    /// Empty id or model, a duplicate id, or a role that would mix plain and PD engines
    /// in the engine's model.
    pub fn add(&self, engine: Engine) -> Result<u64, RegistryError> {
        check_names(&engine)?;
        let _write = self.write.lock();
        let current = self.current.load();
        if current.get(engine.id().as_str()).is_some() {
            return Err(RegistryError::DuplicateId {
                id: engine.id().clone(),
            });
        }
        check_mode(&current, &engine)?;
        let next = current.with_engine(Arc::new(engine));
        Ok(self.publish(next))
    }

    /// Adds an engine, or replaces the one with its id in one step (no snapshot
    /// lacks it), and returns the engine it replaced.
    ///
    /// # Errors
    /// Empty id or model, or a role that would mix plain and PD engines in the
    /// engine's model (the engine it replaces does not count); nothing changes.
    pub fn replace(&self, engine: Engine) -> Result<Option<Arc<Engine>>, RegistryError> {
        check_names(&engine)?;
        let _write = self.write.lock();
        let current = self.current.load();
        let old = current.get(engine.id().as_str()).cloned();
        let base = match &old {
            Some(old) => current.without_engine(old),
            None => current.clone_next(),
        };
        check_mode(&base, &engine)?;
        let next = base.with_engine(Arc::new(engine));
        self.publish(next);
        Ok(old)
    }

    /// Removes an engine and returns it.
    ///
    /// # Errors
    /// [`RegistryError::UnknownEngine`] when no engine has this id.
    pub fn remove(&self, id: &str) -> Result<Arc<Engine>, RegistryError> {
        let _write = self.write.lock();
        let current = self.current.load();
        let engine = current
            .get(id)
            .cloned()
            .ok_or_else(|| RegistryError::UnknownEngine { id: id.into() })?;
        let next = current.without_engine(&engine);
        self.publish(next);
        Ok(engine)
    }

    /// Sets an engine's health. Returns whether it changed; an unchanged health
    /// publishes nothing and keeps the version.
    ///
    /// # Errors
    /// [`RegistryError::UnknownEngine`] when no engine has this id.
    pub fn set_health(&self, id: &str, health: Health) -> Result<bool, RegistryError> {
        let _write = self.write.lock();
        let current = self.current.load();
        let engine = current
            .get(id)
            .ok_or_else(|| RegistryError::UnknownEngine { id: id.into() })?;
        if engine.health() == health {
            return Ok(false);
        }
        let updated = Arc::new(Engine::clone(engine).with_health(health));
        let next = current.with_engine(updated);
        self.publish(next);
        Ok(true)
    }

    /// Sets the LoRA adapters an engine serves. Returns whether they changed; the
    /// same adapters publish nothing and keep the version.
    ///
    /// # Errors
    /// [`RegistryError::UnknownEngine`] when no engine has this id.
    pub fn set_adapters(
        &self,
        id: &str,
        adapters: impl IntoIterator<Item = impl Into<Arc<str>>>,
    ) -> Result<bool, RegistryError> {
        let _write = self.write.lock();
        let current = self.current.load();
        let engine = current
            .get(id)
            .ok_or_else(|| RegistryError::UnknownEngine { id: id.into() })?;
        let updated = Engine::clone(engine).with_adapters(adapters);
        if updated.adapters() == engine.adapters() {
            return Ok(false);
        }
        let next = current.with_engine(Arc::new(updated));
        self.publish(next);
        Ok(true)
    }

    /// Sets what engine `id` says about the KV hand-over of a prefill/decode pair,
    /// keeping its health; `false` when nothing changed (no new snapshot).
    ///
    /// # Errors
    /// [`RegistryError::UnknownEngine`].
    pub fn set_pd_profile(&self, id: &str, profile: PdProfile) -> Result<bool, RegistryError> {
        let _write = self.write.lock();
        let current = self.current.load();
        let engine = current
            .get(id)
            .ok_or_else(|| RegistryError::UnknownEngine { id: id.into() })?;
        if *engine.pd_profile() == profile {
            return Ok(false);
        }
        let updated = Engine::clone(engine).with_pd_profile(profile);
        self.publish(current.with_engine(Arc::new(updated)));
        Ok(true)
    }

    fn publish(&self, next: RegistrySnapshot) -> u64 {
        let version = next.version;
        self.current.store(Arc::new(next));
        version
    }
}

/// An engine must have an id and name its model.
fn check_names(engine: &Engine) -> Result<(), RegistryError> {
    if engine.id().as_str().is_empty() {
        return Err(RegistryError::EmptyId);
    }
    if engine.model().is_empty() {
        return Err(RegistryError::EmptyModel {
            id: engine.id().clone(),
        });
    }
    Ok(())
}

/// A model is served by plain engines or by prefill/decode engines, never both.
fn check_mode(snapshot: &RegistrySnapshot, engine: &Engine) -> Result<(), RegistryError> {
    match snapshot.model_mode(engine.model()) {
        Some(existing) if existing != ModelMode::of(engine.role()) => {
            Err(RegistryError::MixedModel {
                id: engine.id().clone(),
                model: engine.model().to_owned(),
                role: engine.role(),
                existing,
            })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(id: &str) -> Engine {
        Engine::new(id, format!("http://{id}"), "m", Role::Plain)
    }

    #[test]
    fn add_keeps_model_workers_sorted_and_bumps_version() {
        let registry = EngineRegistry::new();
        assert_eq!(registry.add(plain("b")).unwrap(), 1);
        assert_eq!(registry.add(plain("a")).unwrap(), 2);
        assert_eq!(registry.add(plain("c")).unwrap(), 3);
        let snap = registry.snapshot();
        let ids: Vec<_> = snap
            .model_engines("m")
            .iter()
            .map(|w| w.id().as_str())
            .collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(snap.model_mode("m"), Some(ModelMode::Plain));
        assert!(snap.model_engines("other").is_empty());
    }

    #[test]
    fn rejects_empty_id_empty_model_and_duplicates() {
        let registry = EngineRegistry::new();
        assert_eq!(registry.add(plain("")), Err(RegistryError::EmptyId));
        let err = registry
            .add(Engine::new("x", "http://x", "", Role::Plain))
            .unwrap_err();
        assert_eq!(err.to_string(), "engine x must name the model it serves");
        registry.add(plain("a")).unwrap();
        let err = registry.add(plain("a")).unwrap_err();
        assert_eq!(err.to_string(), "engine a is already registered");
    }

    #[test]
    fn a_model_never_mixes_plain_and_pd_engines() {
        let registry = EngineRegistry::new();
        registry.add(plain("a")).unwrap();
        let err = registry
            .add(Engine::new("p", "http://p", "m", Role::Prefill))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "engine p is a prefill engine, but model \"m\" is served by plain engines; \
             a model is either all plain or all prefill/decode"
        );
        registry
            .add(Engine::new("p", "http://p", "pd", Role::Prefill))
            .unwrap();
        registry
            .add(Engine::new("d", "http://d", "pd", Role::Decode))
            .unwrap();
        let err = registry
            .add(Engine::new("q", "http://q", "pd", Role::Plain))
            .unwrap_err();
        assert!(
            err.to_string().contains("served by prefill/decode engines"),
            "{err}"
        );
    }

    #[test]
    fn replace_swaps_an_engine_in_one_step_or_changes_nothing() {
        let registry = EngineRegistry::new();
        assert!(registry.replace(plain("a")).unwrap().is_none(), "an add");
        registry.add(plain("b")).unwrap();
        let before = registry.snapshot();
        let old = registry
            .replace(Engine::new("a", "http://a2", "m", Role::Plain))
            .unwrap()
            .unwrap();
        assert_eq!(old.url(), "http://a");
        let after = registry.snapshot();
        assert_eq!(after.get("a").unwrap().url(), "http://a2");
        assert_eq!(after.model_engines("m").len(), 2);
        assert!(after.version() > before.version());
        let err = registry
            .replace(Engine::new("a", "http://a3", "m", Role::Prefill))
            .unwrap_err();
        assert!(err.to_string().contains("served by plain engines"), "{err}");
        assert_eq!(
            registry.snapshot().version(),
            after.version(),
            "nothing changed"
        );
        registry.remove("b").unwrap();
        registry
            .replace(Engine::new("a", "http://a3", "m", Role::Prefill))
            .unwrap();
        assert_eq!(
            registry.snapshot().model_mode("m"),
            Some(ModelMode::Pd),
            "the engine it replaces does not count"
        );
    }

    #[test]
    fn removing_the_last_engine_forgets_the_model_mode() {
        let registry = EngineRegistry::new();
        registry.add(plain("a")).unwrap();
        assert_eq!(registry.remove("a").unwrap().id().as_str(), "a");
        assert_eq!(registry.snapshot().model_mode("m"), None);
        registry
            .add(Engine::new("p", "http://p", "m", Role::Prefill))
            .unwrap();
        let err = registry.remove("a").unwrap_err();
        assert_eq!(err.to_string(), "engine a is not registered");
    }

    #[test]
    fn health_updates_replace_the_engine_and_leave_old_snapshots_alone() {
        let registry = EngineRegistry::new();
        registry.add(plain("a")).unwrap();
        let before = registry.snapshot();
        assert!(registry.set_health("a", Health::Unhealthy).unwrap());
        assert!(!registry.set_health("a", Health::Unhealthy).unwrap());
        let after = registry.snapshot();
        assert_eq!(after.version(), before.version() + 1);
        assert!(before.get("a").unwrap().is_healthy());
        assert!(!after.get("a").unwrap().is_healthy());
        assert!(!Arc::ptr_eq(
            before.get("a").unwrap(),
            after.get("a").unwrap()
        ));
        assert!(!after.any_healthy());
        assert!(matches!(
            registry.set_health("zz", Health::Healthy),
            Err(RegistryError::UnknownEngine { .. })
        ));
    }

    #[test]
    fn adapter_updates_keep_the_engines_health_and_publish_only_a_change() {
        let registry = EngineRegistry::new();
        registry.add(plain("a")).unwrap();
        registry.set_health("a", Health::Unhealthy).unwrap();
        let before = registry.snapshot().version();
        assert!(registry.set_adapters("a", ["sql", "chat"]).unwrap());
        assert!(!registry.set_adapters("a", ["chat", "sql"]).unwrap());
        let after = registry.snapshot();
        assert_eq!(after.version(), before + 1);
        let engine = after.get("a").unwrap();
        assert!(engine.serves_adapter("sql") && !engine.is_healthy());
        assert!(registry.set_adapters("a", Vec::<&str>::new()).unwrap());
        assert!(!registry.snapshot().get("a").unwrap().serves_adapter("sql"));
        assert!(matches!(
            registry.set_adapters("zz", ["sql"]),
            Err(RegistryError::UnknownEngine { .. })
        ));
    }

    #[test]
    fn pd_profile_updates_keep_the_engines_health_and_publish_only_a_change() {
        let registry = EngineRegistry::new();
        registry.add(plain("a")).unwrap();
        registry.set_health("a", Health::Unhealthy).unwrap();
        let before = registry.snapshot().version();
        let profile = PdProfile {
            page_size: Some(32),
            ..PdProfile::default()
        };
        assert!(registry.set_pd_profile("a", profile.clone()).unwrap());
        assert!(!registry.set_pd_profile("a", profile.clone()).unwrap());
        let after = registry.snapshot();
        assert_eq!(after.version(), before + 1);
        let engine = after.get("a").unwrap();
        assert_eq!(
            (engine.pd_profile(), engine.is_healthy()),
            (&profile, false)
        );
        assert!(matches!(
            registry.set_pd_profile("zz", profile),
            Err(RegistryError::UnknownEngine { .. })
        ));
    }
}
