//! A [`CacheSource`] that also counts what the router itself routed: pages pending on
//! the engine a prompt was just sent to, until its KV events announce them, and an
//! estimate of the caches of engines that publish no KV events at all.
//!
//! A lookup asks the engines' events (the local index, or a shared indexer), then
//! carries each engine further along the prompt while it holds marks of pages routed
//! to it ([`RoutedPages::extend`]): for an engine whose events have reached the index,
//! marks younger than `pending_ms` (none by default); for one whose events never
//! have, marks younger than `max_age_ms`, at most its cache's pages. A shared
//! indexer's engines are all taken to publish. Pages the events show are confirmed:
//! their marks go.

use std::sync::Arc;
use std::time::Duration;

use router_state::kv_events::{PrefixIndex, RoutedPages, chain_hashes, namespace_seed};
use router_state::{EngineId, EngineReportedLoadTable};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{CacheLookup, CacheQueryError, CacheSource, PrefixHits};
use crate::future::BoxFuture;

/// Whose caches the router estimates from its own routing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Estimated {
    /// Engines whose KV events have never reached the router; the others are known
    /// from their events.
    #[default]
    Auto,
    /// Every engine: KV events are not read (a fleet that publishes none).
    All,
    /// None: an engine without events is always a miss.
    None,
}

/// How a model's cache-aware groups count the pages the router routed.
///
/// ```yaml
/// routed_pages: {estimate: auto, pending_ms: 0, max_age_ms: 600000}
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoutedPagesSettings {
    /// Whose caches are estimated from routing.
    #[serde(default)]
    pub estimate: Estimated,
    /// How long a routed prompt's pages count on an engine that publishes KV events
    /// before its events announce them, in milliseconds (0, the default, to 60,000;
    /// 0 = not at all).
    #[serde(default)]
    pub pending_ms: u64,
    /// How long a routed page counts on an engine that publishes no KV events, in
    /// milliseconds (1 to 86,400,000).
    #[serde(default = "default_max_age_ms")]
    pub max_age_ms: u64,
    /// The cache of an engine whose load reports say nothing of its size, in tokens
    /// (the oldest routed pages past it are taken to be evicted).
    #[serde(default = "default_capacity_tokens")]
    pub capacity_tokens: u64,
    /// Routed pages kept for the model, across engines (1 to 16,777,216).
    #[serde(default = "default_max_pages")]
    pub max_pages: usize,
}

fn default_max_age_ms() -> u64 {
    600_000
}

fn default_capacity_tokens() -> u64 {
    262_144
}

fn default_max_pages() -> usize {
    1 << 20
}

/// The longest `pending_ms`.
pub const MAX_PENDING_MS: u64 = 60_000;
/// The longest `max_age_ms`.
pub const MAX_ROUTED_AGE_MS: u64 = 86_400_000;
/// The most `max_pages`.
pub const MAX_ROUTED_PAGES: usize = 1 << 24;

impl Default for RoutedPagesSettings {
    fn default() -> Self {
        Self {
            estimate: Estimated::default(),
            pending_ms: 0,
            max_age_ms: default_max_age_ms(),
            capacity_tokens: default_capacity_tokens(),
            max_pages: default_max_pages(),
        }
    }
}

impl RoutedPagesSettings {
    /// Whether routing counts for anything, pending pages or an estimate, over a
    /// source of events that `knows_publishers` (the router's own index) or takes
    /// every engine to publish (a shared indexer: `auto` then estimates none).
    pub fn counts_routing(&self, knows_publishers: bool) -> bool {
        self.pending_ms > 0
            || match self.estimate {
                Estimated::All => true,
                Estimated::Auto => knows_publishers,
                Estimated::None => false,
            }
    }

    /// The settings' problems, as `(field, problem)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.pending_ms > MAX_PENDING_MS {
            problems.push((
                "pending_ms",
                format!("must be 0 to {MAX_PENDING_MS}, not {}", self.pending_ms),
            ));
        }
        if !(1..=MAX_ROUTED_AGE_MS).contains(&self.max_age_ms) {
            problems.push((
                "max_age_ms",
                format!("must be 1 to {MAX_ROUTED_AGE_MS}, not {}", self.max_age_ms),
            ));
        }
        if self.capacity_tokens == 0 {
            problems.push(("capacity_tokens", "must be at least 1".to_owned()));
        }
        if !(1..=MAX_ROUTED_PAGES).contains(&self.max_pages) {
            problems.push((
                "max_pages",
                format!("must be 1 to {MAX_ROUTED_PAGES}, not {}", self.max_pages),
            ));
        }
        problems
    }
}

/// Where engines' KV events are read.
#[derive(Debug, Clone)]
pub enum EventSource {
    /// The router's own index: it knows which engines publish.
    Local(Arc<PrefixIndex>),
    /// Another source (a shared indexer): every engine is taken to publish.
    Other(Arc<dyn CacheSource>),
}

/// A [`CacheSource`] over engines' KV events and the pages the router routed; see
/// the module documentation.
#[derive(Debug)]
pub struct RoutedCacheSource {
    events: EventSource,
    block_size: u32,
    load: Arc<EngineReportedLoadTable>,
    settings: RoutedPagesSettings,
    pages: RoutedPages,
}

impl RoutedCacheSource {
    /// A source over `events` for a model of `block_size`-token pages, reading cache
    /// sizes from `load`'s reports.
    pub fn new(
        events: EventSource,
        block_size: u32,
        load: Arc<EngineReportedLoadTable>,
        settings: RoutedPagesSettings,
    ) -> Self {
        let pages = RoutedPages::new(router_state::kv_events::RoutedPagesConfig {
            pages_per_engine: pages(settings.capacity_tokens, block_size),
            max_pages: settings.max_pages,
            ..Default::default()
        });
        Self {
            events,
            block_size,
            load,
            settings,
            pages,
        }
    }

    /// The pages it keeps.
    pub fn routed_pages(&self) -> &RoutedPages {
        &self.pages
    }

    fn chain(&self, namespace: Option<&str>, token_ids: &[u32]) -> Vec<u64> {
        chain_hashes(
            token_ids,
            self.block_size as usize,
            namespace_seed(namespace),
        )
    }

    /// Whether `engine`'s events reach the router, and if so how long ago its
    /// current cache began, as far as its events say (`Duration::MAX` when they
    /// have not been cleared or the source cannot say).
    fn events_for(&self, engine: &EngineId) -> Option<Duration> {
        match (&self.events, self.settings.estimate) {
            (_, Estimated::All) => None,
            (EventSource::Local(index), _) => index.publisher(engine).map(|publisher| {
                publisher
                    .cleared_at
                    .map_or(Duration::MAX, |at| at.elapsed())
            }),
            (EventSource::Other(_), _) => Some(Duration::MAX),
        }
    }

    /// How old a mark of `engine`'s may be and count, if its marks count at all: for
    /// an engine that publishes, younger than `pending_ms` and made no earlier than
    /// its cache was last cleared (a restart or a flush voids what was routed before
    /// it); for one estimated, younger than `max_age_ms`.
    fn max_age(&self, engine: &EngineId) -> Option<Duration> {
        match self.events_for(engine) {
            Some(_) if self.settings.pending_ms == 0 => None,
            Some(current) => Some(
                Duration::from_millis(self.settings.pending_ms)
                    .min(current.saturating_add(Duration::from_millis(1))),
            ),
            None if self.settings.estimate == Estimated::None => None,
            None => Some(Duration::from_millis(self.settings.max_age_ms)),
        }
    }

    async fn answer(
        &self,
        namespace: Option<&str>,
        token_ids: &[u32],
        dry_run: bool,
    ) -> Result<CacheLookup, CacheQueryError> {
        let chain = self.chain(namespace, token_ids);
        let mut hits = match (&self.events, self.settings.estimate) {
            (_, Estimated::All) => PrefixHits::new(chain.len(), self.block_size, Vec::new()),
            (EventSource::Local(index), _) => PrefixHits::of_chain(index, &chain, dry_run),
            (EventSource::Other(source), _) => {
                match source.lookup(namespace, token_ids, dry_run).await? {
                    CacheLookup::Answered(hits) => hits,
                    unavailable @ CacheLookup::Unavailable(_) => return Ok(unavailable),
                }
            }
        };
        if !dry_run && self.settings.pending_ms > 0 {
            for (engine, blocks) in hits.engines() {
                self.pages
                    .confirm(engine, &chain[..(*blocks).min(chain.len())]);
            }
        }
        // With nothing routed kept (no pending pages, every engine publishing), the
        // events' answer stands: no lock of the index is taken per engine.
        if self.pages.is_empty() {
            return Ok(CacheLookup::Answered(hits));
        }
        let extended = self
            .pages
            .extend(&chain, hits.engines(), |engine| self.max_age(engine));
        hits.deepen(extended);
        Ok(CacheLookup::Answered(hits))
    }
}

/// Whole pages of `block_size` tokens in `tokens`, at least one.
fn pages(tokens: u64, block_size: u32) -> usize {
    usize::try_from(tokens / u64::from(block_size.max(1)))
        .unwrap_or(usize::MAX)
        .max(1)
}

impl CacheSource for RoutedCacheSource {
    fn lookup<'a>(
        &'a self,
        namespace: Option<&'a str>,
        token_ids: &'a [u32],
        dry_run: bool,
    ) -> BoxFuture<'a, Result<CacheLookup, CacheQueryError>> {
        Box::pin(self.answer(namespace, token_ids, dry_run))
    }

    /// Records the prompt's pages on `engine`: on one that publishes, those past the
    /// `held_blocks` its lookup found (the rest are announced or pending already); on
    /// one estimated, all of them, each now its most recently used.
    fn routed(
        &self,
        namespace: Option<&str>,
        token_ids: &[u32],
        engine: &EngineId,
        held_blocks: usize,
    ) {
        let publishes = self.events_for(engine).is_some();
        let counts = if publishes {
            self.settings.pending_ms > 0
        } else {
            self.settings.estimate != Estimated::None
        };
        if !counts {
            return;
        }
        let chain = self.chain(namespace, token_ids);
        let new = if publishes {
            chain.get(held_blocks..).unwrap_or_default()
        } else {
            &chain
        };
        let reported = self
            .load
            .snapshot()
            .observe(engine)
            .reported
            .and_then(|r| r.max_kv_tokens);
        let capacity = reported.map(|tokens| pages(tokens, self.block_size));
        let max_age = if publishes {
            self.settings.pending_ms
        } else {
            self.settings.max_age_ms
        };
        self.pages
            .record(engine, new, capacity, Duration::from_millis(max_age));
    }
}

#[cfg(test)]
mod tests;
