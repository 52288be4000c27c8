//! Affinity policies: keep a session (`session_aware`) or a routing key (`sticky`) on
//! the engine it was bound to, so its context stays in that engine's cache.
//!
//! Both follow one algorithm, differing only in the key they read and their fallback:
//! - A live binding to an engine among the candidates is reused if admission admits
//!   it; a rejection fails the pick (the bucket loop moves on) and keeps the binding.
//! - Otherwise (no binding, or one to an engine outside the candidates) the fallback
//!   picks with default admission, this policy checks its own admission on that
//!   engine, and only then binds it. When a concurrent request bound the key first,
//!   its engine wins if it is a candidate and passes admission; a winner outside the
//!   candidates is replaced, a bounded number of times.
//! - A request without a key (or an empty one) uses the fallback and binds nothing.
//! - A pick's lookup and binds share one store deadline, taken when the pick starts,
//!   so a shared store that does not answer costs a pick its timeout once.
//!
//! With the [`AffinityBackend::Rendezvous`] backend nothing is bound: a keyed
//! request goes to the first engine of the key's rendezvous order among the
//! candidates that admission admits, so every router replica picks alike with no
//! store between them.

use std::sync::Arc;

use router_state::affinity::{AffinityScope, rendezvous};
use router_state::{Engine, EngineId, EngineReportedLoadTable, Reservation};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::admission::{AdmissionLimits, EngineAdmission};
use crate::config_error::PolicyConfigError;
use crate::error::{PickError, Rejection};
use crate::future::BoxFuture;
use crate::least_load::LeastLoadPolicy;
use crate::pick::{Pick, PickReason};
use crate::policy::{PickRequest, Policy};
use crate::power_of_two::PowerOfTwoPolicy;
use crate::random::RandomPolicy;
use crate::round_robin::RoundRobinPolicy;
use crate::settings::{AffinityBackend, PolicyHandles, PolicySettings, admission_field};
use crate::walk::{admit, reserve};

/// How often a conflicting concurrent binding is reconciled before the request is
/// served unbound.
const RECONCILE_ATTEMPTS: usize = 4;

/// Which request key a policy binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Session,
    Routing,
}

#[derive(Debug)]
struct Affinity {
    key: Key,
    backend: AffinityBackend,
    load: Arc<EngineReportedLoadTable>,
    admission: Arc<dyn EngineAdmission>,
    fallback: Arc<dyn Policy>,
}

/// Reuses admitted session bindings (`x-session-id`); new and keyless sessions go to
/// power-of-two. See the module documentation.
#[derive(Debug)]
pub struct SessionAwarePolicy(Affinity);

/// Reuses admitted routing-key bindings (`x-switchyard-routing-key`); new and keyless
/// requests go to the configured fallback. See the module documentation.
#[derive(Debug)]
pub struct StickyPolicy(Affinity);

impl SessionAwarePolicy {
    /// A policy keeping sessions in `backend`, checking `admission`, with `fallback`
    /// (a power-of-two policy with default admission) for new and keyless sessions.
    pub fn new(
        backend: AffinityBackend,
        load: Arc<EngineReportedLoadTable>,
        admission: Arc<dyn EngineAdmission>,
        fallback: Arc<dyn Policy>,
    ) -> Self {
        Self(Affinity {
            key: Key::Session,
            backend,
            load,
            admission,
            fallback,
        })
    }
}

impl StickyPolicy {
    /// A policy keeping routing keys in `backend`, checking `admission`, with
    /// `fallback` (built with default admission) for new and keyless routing keys.
    pub fn new(
        backend: AffinityBackend,
        load: Arc<EngineReportedLoadTable>,
        admission: Arc<dyn EngineAdmission>,
        fallback: Arc<dyn Policy>,
    ) -> Self {
        Self(Affinity {
            key: Key::Routing,
            backend,
            load,
            admission,
            fallback,
        })
    }
}

impl Policy for SessionAwarePolicy {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Engine>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        Box::pin(self.0.pick(engines, request))
    }

    fn reads_prompt(&self) -> bool {
        self.0.fallback.reads_prompt()
    }
    fn reserve(&self, pick: &Pick) -> Result<Option<Reservation>, Rejection> {
        reserve(&self.0.load, self.0.admission.as_ref(), pick)
    }
}

impl Policy for StickyPolicy {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Engine>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        Box::pin(self.0.pick(engines, request))
    }

    fn reads_prompt(&self) -> bool {
        self.0.fallback.reads_prompt()
    }
    fn reserve(&self, pick: &Pick) -> Result<Option<Reservation>, Rejection> {
        reserve(&self.0.load, self.0.admission.as_ref(), pick)
    }
}

impl Affinity {
    async fn pick(
        &self,
        engines: &[Arc<Engine>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        if engines.is_empty() {
            return Err(PickError::NoCandidates {
                stage: request.stage,
            });
        }
        let key = match self.key {
            Key::Session => request.facts.session_key,
            Key::Routing => request.facts.routing_key,
        };
        // Keyless and empty keys bind nothing.
        let Some(key) = key.filter(|k| !k.is_empty()) else {
            return self.fallback(engines, request).await;
        };
        let store = match &self.backend {
            AffinityBackend::Store(store) => store.as_ref(),
            AffinityBackend::Rendezvous => return self.rendezvous(engines, request, key),
        };
        let scope = AffinityScope {
            model: request.facts.model,
            bucket: request.bucket_id,
            stage: request.stage,
        };
        // The lookup and the binds below share one deadline.
        let deadline = store.deadline();
        // A dry run reads the binding without refreshing it.
        let bound = if request.is_dry_run() {
            store.peek(scope, key, deadline).await
        } else {
            store.get(scope, key, deadline).await
        };
        // Over-long keys bind nothing either.
        let Ok(bound) = bound else {
            return self.fallback(engines, request).await;
        };
        if let Some(engine) = bound.as_ref().and_then(|b| candidate(engines, b)) {
            return self.checked(engine, request, PickReason::AffinityBound);
        }
        let chosen = self.fallback(engines, request).await?;
        // A dry run names the engine the key would be bound to, unbound.
        if request.is_dry_run() {
            return Ok(Pick::new(chosen.engine, PickReason::AffinityAssigned));
        }
        let mut expected = bound;
        for _ in 0..RECONCILE_ATTEMPTS {
            let bound = match &expected {
                None => {
                    store
                        .bind_if_absent(scope, key, chosen.engine.id(), deadline)
                        .await
                }
                Some(old) => {
                    store
                        .replace(scope, key, old, chosen.engine.id(), deadline)
                        .await
                }
            };
            let Ok(bound) = bound else {
                break;
            };
            if &bound == chosen.engine.id() {
                return Ok(Pick::new(chosen.engine, PickReason::AffinityAssigned));
            }
            // A concurrent request bound the key first.
            match candidate(engines, &bound) {
                Some(winner) => return self.checked(winner, request, PickReason::AffinityBound),
                None => expected = Some(bound),
            }
        }
        Ok(chosen)
    }

    /// The first engine of `key`'s rendezvous order that admission admits; when
    /// every candidate is rejected, the first one's rejection. The first engine is
    /// found in one pass; the rest of the order is computed only when it is refused.
    fn rendezvous(
        &self,
        engines: &[Arc<Engine>],
        request: &PickRequest<'_>,
        key: &str,
    ) -> Result<Pick, PickError> {
        let Some(head) = rendezvous::first(key, engines, |e| e.rendezvous_seed(), |e| e.id())
        else {
            return Err(PickError::NoCandidates {
                stage: request.stage,
            });
        };
        let first_rejection = match self.checked(head, request, PickReason::AffinityRendezvous) {
            Ok(pick) => return Ok(pick),
            Err(rejected) => rejected,
        };
        for engine in rendezvous::order(key, engines, |e| e.id())
            .into_iter()
            .skip(1)
        {
            if let Ok(pick) = self.checked(engine, request, PickReason::AffinityRendezvous) {
                return Ok(pick);
            }
        }
        Err(first_rejection)
    }

    /// The fallback's pick, checked against this policy's admission.
    async fn fallback(
        &self,
        engines: &[Arc<Engine>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        let pick = self.fallback.pick(engines, request).await?;
        self.checked(&pick.engine, request, pick.reason)
    }

    fn checked(
        &self,
        engine: &Arc<Engine>,
        request: &PickRequest<'_>,
        reason: PickReason,
    ) -> Result<Pick, PickError> {
        let metrics = self.load.snapshot().observe(engine.id()).metrics();
        match admit(self.admission.as_ref(), engine, &metrics, request)? {
            None => Ok(Pick::new(Arc::clone(engine), reason)),
            Some(rejection) => Err(PickError::AdmissionRejected {
                stage: request.stage,
                rejection,
            }),
        }
    }
}

/// The candidate with id `id`, if it is one: found by halving when the candidates
/// are in id order, as groups give them, else by a scan.
fn candidate<'e>(engines: &'e [Arc<Engine>], id: &EngineId) -> Option<&'e Arc<Engine>> {
    match engines.binary_search_by(|e| e.id().cmp(id)) {
        Ok(at) => Some(&engines[at]),
        Err(_) => engines.iter().find(|e| e.id() == id),
    }
}

/// Settings of `session_aware`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionAwareConfig {
    /// Per-engine caps, checked on the bound engine and on the fallback's engine
    /// before binding.
    #[serde(default)]
    pub admission: AdmissionLimits,
    /// Fixed seed of the power-of-two fallback; absent = seeded per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// Settings of `sticky`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StickyConfig {
    /// Per-engine caps, checked on the bound engine and on the fallback's engine
    /// before binding.
    #[serde(default)]
    pub admission: AdmissionLimits,
    /// The policy for new and keyless routing keys (run with default admission).
    #[serde(default)]
    pub fallback: StickyFallback,
    /// Fixed seed of a sampling fallback; absent = seeded per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// The fallback of `sticky`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StickyFallback {
    /// The next engine in rotation.
    #[default]
    RoundRobin,
    /// A uniformly random engine.
    Random,
    /// The less pressured of two samples.
    PowerOfTwo,
    /// The least loaded engine.
    LoadBased,
}

impl PolicySettings for SessionAwareConfig {
    admission_field!();

    fn needs_affinity(&self) -> bool {
        true
    }

    fn build(
        &self,
        admission: Arc<dyn EngineAdmission>,
        handles: &PolicyHandles,
    ) -> Result<Arc<dyn Policy>, PolicyConfigError> {
        let backend = affinity_backend(handles, "session_aware")?;
        let fallback = fallback(StickyFallback::PowerOfTwo, self.seed, &handles.load);
        Ok(Arc::new(SessionAwarePolicy::new(
            backend,
            Arc::clone(&handles.load),
            admission,
            fallback,
        )))
    }
}

impl PolicySettings for StickyConfig {
    admission_field!();

    fn needs_affinity(&self) -> bool {
        true
    }

    fn build(
        &self,
        admission: Arc<dyn EngineAdmission>,
        handles: &PolicyHandles,
    ) -> Result<Arc<dyn Policy>, PolicyConfigError> {
        let backend = affinity_backend(handles, "sticky")?;
        let fallback = fallback(self.fallback, self.seed, &handles.load);
        Ok(Arc::new(StickyPolicy::new(
            backend,
            Arc::clone(&handles.load),
            admission,
            fallback,
        )))
    }
}

fn affinity_backend(
    handles: &PolicyHandles,
    policy: &'static str,
) -> Result<AffinityBackend, PolicyConfigError> {
    handles
        .affinity
        .clone()
        .ok_or(PolicyConfigError::MissingState {
            policy,
            needs: "the router's affinity backend",
        })
}

/// A nested fallback policy: default admission (the owning policy checks the engine
/// it returns).
fn fallback(
    kind: StickyFallback,
    seed: Option<u64>,
    load: &Arc<EngineReportedLoadTable>,
) -> Arc<dyn Policy> {
    let load = Arc::clone(load);
    let admission: Arc<dyn EngineAdmission> = Arc::new(AdmissionLimits::default());
    match (kind, seed) {
        (StickyFallback::RoundRobin, _) => Arc::new(RoundRobinPolicy::new(load, admission)),
        (StickyFallback::Random, Some(seed)) => {
            Arc::new(RandomPolicy::with_seed(load, admission, seed))
        }
        (StickyFallback::Random, None) => Arc::new(RandomPolicy::new(load, admission)),
        (StickyFallback::PowerOfTwo, Some(seed)) => {
            Arc::new(PowerOfTwoPolicy::with_seed(load, admission, seed))
        }
        (StickyFallback::PowerOfTwo, None) => Arc::new(PowerOfTwoPolicy::new(load, admission)),
        (StickyFallback::LoadBased, _) => Arc::new(LeastLoadPolicy::new(load, admission)),
    }
}
