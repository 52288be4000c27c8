//! Bucket-first engine selection: choose length-compatible buckets in capacity order,
//! then let the bucket's engine groups pick a plain engine or a complete
//! prefill/decode pair.
//!
//! A [`BucketResolver`] orders a model's buckets once (ascending input capacity,
//! unbounded last, then rank, then id) and filters them per request without looking at
//! engines. A [`Bucket`] owns plain-versus-PD selection, so both engines of a pair
//! always come from one bucket and a failed decode pick discards its prefill pick. An
//! [`EngineGroup`] owns membership and one policy, and checks that the policy's answer
//! is one of its exact candidates. [`BucketResolver::select`] runs the bucket loop:
//! missing candidates or admission rejection advance to the next bucket; a defect stops.
//! Nothing here does I/O or knows about HTTP.
//!
//! ```
//! use std::sync::Arc;
//! use router_buckets::{Bucket, BucketGroups, BucketResolver, EngineGroup, TokenLimits};
//! use router_policy::{AdmissionLimits, RequestFacts, RoundRobinPolicy};
//! use router_state::{EngineReportedLoadTable, Role, Engine, EngineRegistry};
//!
//! let registry = EngineRegistry::new();
//! for (id, role) in [("P1", Role::Prefill), ("D1", Role::Decode), ("P2", Role::Prefill), ("D2", Role::Decode)] {
//!     registry.add(Engine::new(id, format!("http://{id}:8000"), "m", role))?;
//! }
//! let load = Arc::new(EngineReportedLoadTable::default());
//! let group = |ids: &[&str]| {
//!     let policy = Arc::new(RoundRobinPolicy::new(Arc::clone(&load), Arc::new(AdmissionLimits::default())));
//!     EngineGroup::with_members(policy, ids.iter().map(|id| (*id).into()))
//! };
//! let short = Bucket::new("short", 0, TokenLimits { min: 0, max: Some(4096) }, Some(8192),
//!     BucketGroups::Pd { prefill: group(&["P1"]), decode: group(&["D1"]) })?;
//! let long = Bucket::new("long", 0, TokenLimits::default(), None,
//!     BucketGroups::Pd { prefill: group(&["P2"]), decode: group(&["D2"]) })?;
//! let resolver = BucketResolver::new(vec![long, short])?;
//!
//! // 4k input with a 16k peak does not fit the short bucket's context: both engines
//! // come from the long bucket.
//! let request = RequestFacts::new("m", 4096).with_max_output_tokens(Some(12_288))?;
//! # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
//! let selection = resolver.select(&registry.snapshot(), &request).await?;
//! assert_eq!(&*selection.pick.bucket, "long");
//! let ids: Vec<_> = selection.pick.engines.iter().map(|p| p.engine.id().as_str()).collect();
//! assert_eq!(ids, ["P2", "D2"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bucket;
mod config;
mod group;
mod pair;
mod pick;
mod resolver;
mod select;
mod shadow;
mod slo;

pub use bucket::{Bucket, BucketError, BucketGroups, TokenLimits};
pub use config::{
    BucketConfig, CATCH_ALL_BUCKET, DefaultPolicies, GroupConfig, GroupsConfig, ModelRoster,
    PdGroupsConfig, build_resolver, group_policies,
};
pub use group::{Candidates, EngineGroup, Membership, RESERVE_TRIES};
pub use pick::{BucketPick, EnginePicks};
pub use resolver::BucketResolver;
pub use select::{BucketAttempt, SelectError, Selection};
pub use shadow::{Shadow, ShadowConfig, ShadowStats, ShadowTotals};
pub use slo::{MAX_SLO_MS, SloPrediction, SloTargets};
