//! What a serving router builds its selection with: the state it shares with a
//! running router on reload, its tokenizers (each file loaded once), the affinity
//! store of the `affinity` section, and the shared prefix indexer's client.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use router_config::{
    AffinityBackendKind, AffinitySettings, ModelConfig, PrefixIndexerConfig, Resources,
    RouterConfig, SelectionState, ServingEngine,
};
use router_policy::{AffinityBackend, CacheSource, ConfigError};
use router_state::affinity::{AffinityStore, LocalAffinityStore, RedisAffinityStore};
use router_tokenize::{ChatTokenizer, Dialect, TokenizerError};
use router_upstream::{EngineTls, Origin, Upstream, UpstreamTimeouts};

use crate::access::TokenSetting;
use crate::indexer::{IndexerLink, RemoteCacheSource};
use crate::metrics::IndexerMetrics;

/// The state a configuration's policies are built around: made anew for a router
/// that starts, the running router's own for a reload, so load reports, bindings,
/// prefix-index entries and tokenizers survive it.
#[derive(Debug, Clone)]
pub(crate) struct SharedState {
    /// The load table, the affinity backend and the prefix indexes.
    pub(crate) selection: SelectionState,
    /// The bindings the router holds; `None` for rendezvous, which binds nothing.
    pub(crate) affinity: Option<Arc<dyn AffinityStore>>,
    /// The tokenizers loaded, by model and file: a model that names the same file
    /// again keeps its tokenizer (and the prefixes it keeps) instead of loading it
    /// again. Each model has its own, as its prefix cache is the model's.
    pub(crate) tokenizers: HashMap<ModelTokenizer, Arc<ChatTokenizer>>,
    /// What the links to the shared prefix indexers count in.
    pub(crate) indexer_metrics: IndexerMetrics,
}

impl SharedState {
    /// Fresh state for `config`; no affinity backend when the affinity section is
    /// invalid (its field check reports why).
    pub(crate) fn new(config: &RouterConfig) -> Self {
        let (backend, affinity) = match affinity_backend(&config.affinity) {
            Ok((backend, store)) => (Some(backend), store),
            Err(_) => (None, None),
        };
        Self {
            selection: SelectionState::new(config, backend),
            affinity,
            tokenizers: HashMap::new(),
            indexer_metrics: IndexerMetrics::default(),
        }
    }
}

/// Where affinity policies keep keys' engines, and the store the router holds
/// (none for `rendezvous`). Nothing is connected yet.
///
/// # Errors
/// The Redis settings cannot be used (the field checks report why, with paths).
fn affinity_backend(
    settings: &AffinitySettings,
) -> Result<(AffinityBackend, Option<Arc<dyn AffinityStore>>), ConfigError> {
    let store: Arc<dyn AffinityStore> = match (settings.backend, &settings.redis) {
        (AffinityBackendKind::Rendezvous, _) => return Ok((AffinityBackend::Rendezvous, None)),
        (AffinityBackendKind::Redis, Some(redis)) => Arc::new(
            RedisAffinityStore::new(settings.store_config(), redis.settings())
                .map_err(|e| ConfigError::at("affinity.redis.url", e))?,
        ),
        (AffinityBackendKind::Redis, None) => {
            return Err(ConfigError::at(
                "affinity.redis",
                "is required by backend redis",
            ));
        }
        (AffinityBackendKind::Local, _) => {
            Arc::new(LocalAffinityStore::new(settings.store_config()))
        }
    };
    Ok((AffinityBackend::Store(Arc::clone(&store)), Some(store)))
}

/// A model and its tokenizer's file.
pub(crate) type ModelTokenizer = (String, PathBuf);

/// The serving router's [`Resources`]: each model's tokenizer loaded from its file
/// (keeping `prefix_cache_bytes` of its prompts' prefixes), or kept from the running
/// router, and the shared prefix indexer asked over HTTP (over TLS, with `engine_tls`,
/// at an `https://` URL).
pub(super) struct Serving {
    kept: HashMap<ModelTokenizer, Arc<ChatTokenizer>>,
    prefix_cache_bytes: usize,
    engine_tls: Option<EngineTls>,
    /// What lookups of the shared indexer carry: `Bearer <token>`.
    indexer_authorization: Option<HeaderValue>,
    /// Every model's lookups of the shared indexers, once one asks.
    indexer: Option<Arc<IndexerLink>>,
    /// What those lookups count in.
    indexer_metrics: IndexerMetrics,
}

impl Serving {
    /// Loading what `kept` does not hold already; lookups of the shared indexers
    /// counted in `indexer_metrics`.
    pub(super) fn new(
        kept: HashMap<ModelTokenizer, Arc<ChatTokenizer>>,
        prefix_cache_bytes: usize,
        engine_tls: Option<EngineTls>,
        indexer_metrics: IndexerMetrics,
    ) -> Self {
        Self {
            kept,
            prefix_cache_bytes,
            engine_tls,
            indexer_authorization: None,
            indexer: None,
            indexer_metrics,
        }
    }

    /// Lookups of the shared indexer carry the token of `config`'s `prefix_indexer`
    /// section, if it names one (read here: a problem goes to `errors`).
    pub(super) fn with_indexer_token(
        mut self,
        config: &RouterConfig,
        errors: &mut Vec<ConfigError>,
    ) -> Self {
        let token = config
            .prefix_indexer
            .as_ref()
            .and_then(|section| TokenSetting::prefix_indexer(section).read(errors));
        self.indexer_authorization = token.map(|token| {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                .expect("a usable token is visible ASCII");
            value.set_sensitive(true);
            value
        });
        self
    }
}

impl Resources for Serving {
    type Tokenizer = Arc<ChatTokenizer>;
    type Error = TokenizerError;

    fn tokenizer(
        &mut self,
        model: &ModelConfig,
        path: &Path,
    ) -> Result<Arc<ChatTokenizer>, TokenizerError> {
        let dialect = match model.serving_engine() {
            ServingEngine::Sglang => Dialect::Sglang,
            ServingEngine::Vllm => Dialect::Vllm,
        };
        let key = (model.id.clone(), path.to_path_buf());
        if let Some(kept) = self
            .kept
            .get(&key)
            .filter(|t| t.dialect() == dialect && t.media_part_tokens() == model.media_part_tokens)
        {
            return Ok(Arc::clone(kept));
        }
        let mut tokenizer = ChatTokenizer::load(path)?
            .with_prefix_cache(self.prefix_cache_bytes)
            .with_dialect(dialect);
        if let Some(tokens) = model.media_part_tokens {
            tokenizer = tokenizer.with_media_part_tokens(tokens);
        }
        Ok(Arc::new(tokenizer))
    }

    fn shared_prefix_source(
        &mut self,
        model: &ModelConfig,
        indexer: &PrefixIndexerConfig,
    ) -> Option<Arc<dyn CacheSource>> {
        if self.indexer.is_none() {
            let origins = indexer
                .indexer_urls()
                .into_iter()
                .map(Origin::of)
                .collect::<Option<Vec<_>>>()
                .filter(|origins| !origins.is_empty())?;
            let timeout = Duration::from_millis(indexer.timeout_ms);
            let mut upstream = Upstream::new(UpstreamTimeouts {
                connect: timeout,
                first_byte: timeout,
                pool_idle: Duration::from_secs(4),
            });
            if let Some(tls) = &self.engine_tls {
                upstream = upstream.with_tls(tls.clone());
            }
            let most = usize::try_from(indexer.max_lookups_in_flight).unwrap_or(usize::MAX);
            self.indexer = Some(Arc::new(
                IndexerLink::new(origins, upstream, timeout, most, &self.indexer_metrics)
                    .with_authorization(self.indexer_authorization.clone()),
            ));
        }
        let link = Arc::clone(self.indexer.as_ref()?);
        Some(Arc::new(RemoteCacheSource::new(
            &model.id,
            model.block_size,
            link,
        )))
    }
}

/// What the fleet discovers pods with: the selectors' and the InferencePools'.
#[cfg(feature = "kubernetes")]
pub(super) fn kubernetes(
    discovery: &router_config::DiscoveryConfig,
) -> Option<router_fleet::kubernetes::KubernetesSettings> {
    let kubernetes = discovery.kubernetes.as_ref()?;
    Some(router_fleet::kubernetes::KubernetesSettings {
        api_url: kubernetes.api_url.clone(),
        namespace: kubernetes.namespace.clone(),
        selectors: kubernetes
            .models
            .iter()
            .map(|m| router_fleet::kubernetes::PodSelector {
                model: m.model.clone(),
                labels: m.selector.clone(),
                role: m.role.map(Into::into),
                port: m.port,
                bootstrap_port: m.bootstrap_port,
            })
            .collect(),
        pools: kubernetes
            .pools
            .iter()
            .map(|p| router_fleet::kubernetes::InferencePoolRef {
                model: p.model.clone(),
                name: p.name.clone(),
            })
            .collect(),
        relist_interval: std::time::Duration::from_millis(kubernetes.relist_interval_ms),
        debounce: std::time::Duration::from_millis(kubernetes.debounce_ms),
        objectives: None,
    })
}
