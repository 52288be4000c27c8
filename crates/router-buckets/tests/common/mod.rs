//! Fixtures shared by the bucket tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use router_buckets::{Bucket, BucketGroups, EngineGroup, TokenLimits};
use router_policy::{
    AdmissionLimits, BoxFuture, Pick, PickError, PickReason, PickRequest, Policy, RoundRobinPolicy,
};
use router_state::{Engine, EngineRegistry, EngineReportedLoadTable, Role};

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
}

/// A registry holding `(id, role)` engines of model `m`.
pub(crate) fn registry(engines: &[(&str, Role)]) -> EngineRegistry {
    let registry = EngineRegistry::new();
    for (id, role) in engines {
        registry
            .add(Engine::new(*id, format!("http://{id}.test"), "m", *role))
            .expect("valid engine");
    }
    registry
}

/// Round-robin with an in-flight cap, so tests can fill engines by holding guards.
pub(crate) fn capped(
    load: &Arc<EngineReportedLoadTable>,
    max_inflight: Option<u64>,
) -> Arc<dyn Policy> {
    let limits = AdmissionLimits {
        max_inflight_requests: max_inflight,
        ..Default::default()
    };
    Arc::new(RoundRobinPolicy::new(Arc::clone(load), Arc::new(limits)))
}

pub(crate) fn members(policy: Arc<dyn Policy>, ids: &[&str]) -> EngineGroup {
    EngineGroup::with_members(policy, ids.iter().map(|id| (*id).into()))
}

pub(crate) fn limits(min: u64, max: Option<u64>) -> TokenLimits {
    TokenLimits { min, max }
}

pub(crate) fn pd_bucket(
    id: &str,
    max: Option<u64>,
    prefill: EngineGroup,
    decode: EngineGroup,
) -> Bucket {
    Bucket::new(
        id,
        0,
        limits(0, max),
        None,
        BucketGroups::Pd { prefill, decode },
    )
    .expect("valid bucket")
}

pub(crate) fn plain_bucket(id: &str, max: Option<u64>, group: EngineGroup) -> Bucket {
    Bucket::new(id, 0, limits(0, max), None, BucketGroups::Plain(group)).expect("valid bucket")
}

/// Returns a new `Arc` with the id of the first candidate: a foreign engine.
#[derive(Debug)]
pub(crate) struct ImpostorPolicy;

impl Policy for ImpostorPolicy {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Engine>],
        _: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        let engine = Arc::new(Engine::clone(&engines[0]));
        Box::pin(std::future::ready(Ok(Pick::new(
            engine,
            PickReason::RoundRobin,
        ))))
    }
}

/// Counts its calls and picks the first candidate.
#[derive(Debug, Default)]
pub(crate) struct CountingPolicy(pub(crate) AtomicUsize);

impl Policy for CountingPolicy {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Engine>],
        _: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let engine = Arc::clone(&engines[0]);
        Box::pin(std::future::ready(Ok(Pick::new(
            engine,
            PickReason::RoundRobin,
        ))))
    }

    fn reads_prompt(&self) -> bool {
        false
    }
}

/// Records the candidate ids it was offered, then picks the first.
#[derive(Debug, Default)]
pub(crate) struct RecordingPolicy(pub(crate) std::sync::Mutex<Vec<String>>);

impl Policy for RecordingPolicy {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Engine>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        *self.0.lock().expect("not poisoned") =
            engines.iter().map(|e| e.id().to_string()).collect();
        let result = engines
            .first()
            .map(|e| Pick::new(Arc::clone(e), PickReason::RoundRobin))
            .ok_or(PickError::NoCandidates {
                stage: request.stage,
            });
        Box::pin(std::future::ready(result))
    }
}
