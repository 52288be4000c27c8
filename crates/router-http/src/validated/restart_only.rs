//! The sections of a configuration a reload cannot change: they shape the listeners,
//! the upstream client, the fleet's probes and feeds, or the state every policy
//! holds. A reload changes models and policies; every other section is taken here,
//! so a section added to the file does not compile until it is either kept for a
//! restart or named as one a reload applies.

use std::net::SocketAddr;

use router_config::{
    AdminConfig, AffinitySettings, DecisionsConfig, DiscoveryConfig, HealthConfig, LimitsConfig,
    LoadConfig, PrefixIndexerConfig, RetryConfig, RouterConfig, RoutingHeaders, TimeoutConfig,
    TracesConfig,
};
use router_policy::ConfigError;

use crate::access::AdminAccess;

/// See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RestartOnly {
    listen: SocketAddr,
    timeouts: TimeoutConfig,
    health: HealthConfig,
    load: LoadConfig,
    admin: AdminConfig,
    /// The token in force, so a token file whose token changed is a change.
    admin_access: AdminAccess,
    affinity: AffinitySettings,
    limits: LimitsConfig,
    retries: RetryConfig,
    prefix_indexer: Option<PrefixIndexerConfig>,
    decisions: Option<DecisionsConfig>,
    traces: Option<TracesConfig>,
    routing_headers: RoutingHeaders,
    discovery: DiscoveryConfig,
    shutdown_grace_ms: u64,
}

impl RestartOnly {
    /// The sections of `config` only a restart changes, with the admin token in
    /// force.
    pub(crate) fn of(config: &RouterConfig, admin_access: AdminAccess) -> Self {
        let RouterConfig {
            listen,
            // What a reload applies.
            models: _,
            policies: _,
            timeouts,
            health,
            load,
            admin,
            affinity,
            limits,
            retries,
            discovery,
            prefix_indexer,
            decisions,
            traces,
            routing_headers,
            shutdown_grace_ms,
        } = config;
        Self {
            listen: *listen,
            timeouts: *timeouts,
            health: *health,
            load: *load,
            admin: admin.clone(),
            admin_access,
            affinity: affinity.clone(),
            limits: *limits,
            retries: *retries,
            prefix_indexer: prefix_indexer.clone(),
            decisions: decisions.clone(),
            traces: traces.clone(),
            routing_headers: *routing_headers,
            discovery: discovery.clone(),
            shutdown_grace_ms: *shutdown_grace_ms,
        }
    }

    /// One error for each section `next` changes.
    pub(crate) fn changes(&self, next: &Self) -> Vec<ConfigError> {
        let Self {
            listen,
            timeouts,
            health,
            load,
            admin,
            admin_access,
            affinity,
            limits,
            retries,
            prefix_indexer,
            decisions,
            traces,
            routing_headers,
            discovery,
            shutdown_grace_ms,
        } = self;
        let changed = [
            ("listen", *listen != next.listen),
            ("timeouts", *timeouts != next.timeouts),
            ("health", *health != next.health),
            ("load", *load != next.load),
            (
                "admin",
                *admin != next.admin || *admin_access != next.admin_access,
            ),
            ("affinity", *affinity != next.affinity),
            ("limits", *limits != next.limits),
            ("retries", *retries != next.retries),
            ("prefix_indexer", *prefix_indexer != next.prefix_indexer),
            ("decisions", *decisions != next.decisions),
            ("traces", *traces != next.traces),
            ("routing_headers", *routing_headers != next.routing_headers),
            ("discovery", *discovery != next.discovery),
            (
                "shutdown_grace_ms",
                *shutdown_grace_ms != next.shutdown_grace_ms,
            ),
        ];
        changed
            .into_iter()
            .filter(|(_, changed)| *changed)
            .map(|(section, _)| {
                ConfigError::at(
                    section,
                    "changed: it takes effect only at a restart (a reload changes models and policies)",
                )
            })
            .collect()
    }
}
