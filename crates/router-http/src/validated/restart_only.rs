//! The sections of a configuration a reload cannot change: they shape the listeners,
//! the upstream client, the fleet's probes and feeds, or the state every policy
//! holds. A reload changes models, policies and the admin token; every other section
//! is taken here, so a section added to the file does not compile until it is either
//! kept for a restart or named as one a reload applies.

use std::net::SocketAddr;

use router_config::{
    AdminConfig, AffinitySettings, DecisionsConfig, DiscoveryConfig, EngineTlsConfig, HealthConfig,
    LimitsConfig, LoadConfig, PickerConfig, PrefixIndexerConfig, RetryConfig, RouterConfig,
    RoutingHeaders, TimeoutConfig, TracesConfig,
};
use router_policy::ConfigError;

/// See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RestartOnly {
    listen: SocketAddr,
    timeouts: TimeoutConfig,
    engine_tls: Option<EngineTlsConfig>,
    health: HealthConfig,
    load: LoadConfig,
    /// The admin API's own address; its token is the reload's to change.
    admin_listen: Option<SocketAddr>,
    affinity: AffinitySettings,
    limits: LimitsConfig,
    retries: RetryConfig,
    prefix_indexer: Option<PrefixIndexerConfig>,
    decisions: Option<DecisionsConfig>,
    picker: Option<PickerConfig>,
    traces: Option<TracesConfig>,
    routing_headers: RoutingHeaders,
    discovery: DiscoveryConfig,
    shutdown_grace_ms: u64,
}

impl RestartOnly {
    /// The sections of `config` only a restart changes.
    pub(crate) fn of(config: &RouterConfig) -> Self {
        let RouterConfig {
            listen,
            // What a reload applies.
            models: _,
            policies: _,
            timeouts,
            engine_tls,
            health,
            load,
            admin:
                AdminConfig {
                    // What a reload applies.
                    token: _,
                    token_file: _,
                    listen: admin_listen,
                },
            affinity,
            limits,
            retries,
            discovery,
            prefix_indexer,
            decisions,
            picker,
            traces,
            routing_headers,
            shutdown_grace_ms,
        } = config;
        Self {
            listen: *listen,
            timeouts: *timeouts,
            engine_tls: engine_tls.clone(),
            health: *health,
            load: *load,
            admin_listen: *admin_listen,
            affinity: affinity.clone(),
            limits: *limits,
            retries: *retries,
            prefix_indexer: prefix_indexer.clone(),
            decisions: decisions.clone(),
            picker: picker.clone(),
            traces: traces.clone(),
            routing_headers: *routing_headers,
            discovery: discovery.clone(),
            shutdown_grace_ms: *shutdown_grace_ms,
        }
    }

    /// One error for each section `next` changes.
    pub(crate) fn changes(&self, next: &Self) -> Vec<ConfigError> {
        self.changes_among(next, |_| true)
    }

    /// One error for each section `next` changes that `switchyard indexer` reads:
    /// the others are the routers' own (their addresses, affinity, retries, their
    /// indexer client, records, traces, headers), which the indexer's reload leaves
    /// to them.
    pub(crate) fn indexer_changes(&self, next: &Self) -> Vec<ConfigError> {
        const READ: [&str; 7] = [
            "timeouts",
            "engine_tls",
            "health",
            "load",
            "limits",
            "discovery",
            "shutdown_grace_ms",
        ];
        self.changes_among(next, |section| READ.contains(&section))
    }

    fn changes_among(&self, next: &Self, read: impl Fn(&str) -> bool) -> Vec<ConfigError> {
        let Self {
            listen,
            timeouts,
            engine_tls,
            health,
            load,
            admin_listen,
            affinity,
            limits,
            retries,
            prefix_indexer,
            decisions,
            picker,
            traces,
            routing_headers,
            discovery,
            shutdown_grace_ms,
        } = self;
        let changed = [
            ("listen", *listen != next.listen),
            ("timeouts", *timeouts != next.timeouts),
            ("engine_tls", *engine_tls != next.engine_tls),
            ("health", *health != next.health),
            ("load", *load != next.load),
            ("admin.listen", *admin_listen != next.admin_listen),
            ("affinity", *affinity != next.affinity),
            ("limits", *limits != next.limits),
            ("retries", *retries != next.retries),
            ("prefix_indexer", *prefix_indexer != next.prefix_indexer),
            ("decisions", *decisions != next.decisions),
            ("picker", *picker != next.picker),
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
            .filter(|(section, changed)| *changed && read(section))
            .map(|(section, _)| {
                ConfigError::at(
                    section,
                    "changed: it takes effect only at a restart (a reload changes models, policies and the admin token)",
                )
            })
            .collect()
    }
}
