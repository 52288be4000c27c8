//! Switchyard's engine lifecycle: engines join and leave a router through one seam,
//! [`Fleet::apply`], and the fleet keeps what the router knows about them current.
//!
//! The set of engines is an input, not a side effect: static configuration, a
//! reloaded file, the admin API and Kubernetes pods (`kubernetes`, feature
//! `kubernetes`) are sources of [`Change`]s, without touching the HTTP crate. Applying an upsert reads the
//! engine's `/server_info`, registers it, and starts its `LoadStat` and KV-event feeds
//! (one ZeroMQ subscriber per data-parallel rank); removal stops them and drops the
//! engine's load reports and cache entries while requests already sent finish.
//! Health probes and a circuit breaker fed by dispatch outcomes decide whether an
//! engine is routable. Observers hear of every change before `apply` returns, so the
//! routing tables above never miss an engine. This crate knows nothing of policies,
//! buckets or HTTP handlers.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use router_fleet::{Change, EngineSpec, Fleet, FleetEvent, HealthPolicy, Source};
//! use router_state::Role;
//! use router_upstream::{Upstream, UpstreamTimeouts};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let upstream = Upstream::new(UpstreamTimeouts {
//!     connect: Duration::from_secs(2),
//!     first_byte: Duration::from_secs(300),
//!     pool_idle: Duration::from_secs(4),
//! });
//! let fleet = Arc::new(Fleet::new(upstream, Arc::default(), HealthPolicy::default()));
//! fleet.on_change(|event| {
//!     if let FleetEvent::Added(engine) = event {
//!         println!("{} serves {}", engine.id(), engine.model());
//!     }
//! });
//! let spec = EngineSpec::new("A1", "http://10.0.0.7:30000", "chat").with_role(Some(Role::Plain));
//! fleet.apply(Change::Upsert(spec)).await?;
//! let _checks = fleet.spawn_health_checks();
//! fleet.apply(Change::Remove("A1".into(), Source::Config)).await?;
//! # Ok(()) }
//! ```

mod error;
mod feeds;
mod fleet;
mod health;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
mod metrics;
mod probes;
mod role;
mod scrape;
mod spec;

pub use error::FleetError;
pub use fleet::{Fleet, FleetEvent, HealthChecks};
pub use health::{Breaker, Dispatched, HealthPolicy};
pub use metrics::register_metrics;
pub use probes::{MIN_PROBES_AT_ONCE, probes_at_once};
pub use role::{pd_profile_of, role_of};
pub use scrape::DEFAULT_METRICS_INTERVAL;
pub use spec::{Change, EngineSpec, MAX_DP_SIZE, Source};
