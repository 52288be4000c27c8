//! Where cache-aware policies learn which engines hold a prompt's prefix: a
//! [`CacheSource`] (the local index, or a remote indexer shared by several routers,
//! either with the pages the router routed counted too: `routed`) and a per-request
//! [`PrefixMemo`] so a request looks its prefix up once however many buckets it
//! tries.

mod hits;
mod routed;

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use router_state::EngineId;
use router_state::kv_events::PrefixIndex;

use crate::future::BoxFuture;

pub(crate) use hits::Held;
pub use hits::PrefixHits;
pub use routed::{
    Estimated, EventSource, MAX_PENDING_MS, MAX_ROUTED_AGE_MS, MAX_ROUTED_PAGES, RoutedCacheSource,
    RoutedPagesSettings,
};

/// What a lookup found out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheLookup {
    /// The source answered; an empty [`PrefixHits::engines`] is a confirmed miss.
    Answered(PrefixHits),
    /// The source could not answer (remote indexer down, timed out, overloaded): the
    /// policy falls back as on a miss, but the pick says so.
    Unavailable(String),
}

/// A lookup that must not be answered with a fallback: the query itself is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("prefix lookup refused: {0}")]
pub struct CacheQueryError(pub String);

/// A prefix-ownership source: the router's own index, or a remote indexer.
///
/// Implementations answer for one model; the same `Arc` is shared by every policy
/// that reads it (the [`PrefixMemo`] key).
pub trait CacheSource: Send + Sync + fmt::Debug {
    /// Which engines hold how much of the prefix of `token_ids` in `namespace` (the
    /// LoRA adapter the request is for; `None` for the base model). A `dry_run`
    /// lookup (an explanation's) leaves the source's recency as it was.
    fn lookup<'a>(
        &'a self,
        namespace: Option<&'a str>,
        token_ids: &'a [u32],
        dry_run: bool,
    ) -> BoxFuture<'a, Result<CacheLookup, CacheQueryError>>;

    /// Tells the source that the router sent a prompt (`token_ids` in `namespace`)
    /// to `engine`, whose lookup found its first `held_blocks` blocks there. Sources
    /// that learn from routing record it ([`RoutedCacheSource`]); the others ignore
    /// it.
    fn routed(
        &self,
        namespace: Option<&str>,
        token_ids: &[u32],
        engine: &EngineId,
        held_blocks: usize,
    ) {
        let _ = (namespace, token_ids, engine, held_blocks);
    }
}

/// A [`CacheSource`] over the router's own [`PrefixIndex`], fed by engine KV events.
#[derive(Debug, Clone)]
pub struct LocalCacheSource {
    index: Arc<PrefixIndex>,
}

impl LocalCacheSource {
    /// A source reading `index`.
    pub fn new(index: Arc<PrefixIndex>) -> Self {
        Self { index }
    }

    fn answer(&self, namespace: Option<&str>, token_ids: &[u32], dry_run: bool) -> PrefixHits {
        PrefixHits::of_chain(
            &self.index,
            &self.index.request_hashes(namespace, token_ids),
            dry_run,
        )
    }
}

impl CacheSource for LocalCacheSource {
    fn lookup<'a>(
        &'a self,
        namespace: Option<&'a str>,
        token_ids: &'a [u32],
        dry_run: bool,
    ) -> BoxFuture<'a, Result<CacheLookup, CacheQueryError>> {
        let hits = self.answer(namespace, token_ids, dry_run);
        Box::pin(std::future::ready(Ok(CacheLookup::Answered(hits))))
    }
}

/// A source, its answer, and whether that answer came from a dry-run lookup.
type Entry = (
    Arc<dyn CacheSource>,
    Arc<Result<CacheLookup, CacheQueryError>>,
    bool,
);

/// One request's prefix lookups, one per source, shared by every bucket attempt of
/// that request (misses and unavailable sources included). A memo belongs to one
/// request: its token ids and namespace are not part of the key.
#[derive(Default)]
pub struct PrefixMemo {
    entries: Mutex<Vec<Entry>>,
}

impl PrefixMemo {
    /// An empty memo.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lookup of `token_ids` in `namespace` of `source`, asking the source only
    /// the first time (a `dry_run` one: see [`CacheSource::lookup`]); a lookup that is
    /// no dry run after a dry one (a shadow policy's) asks again, so the source's
    /// recency is kept as the request's real picks leave it.
    pub async fn lookup(
        &self,
        source: &Arc<dyn CacheSource>,
        namespace: Option<&str>,
        token_ids: &[u32],
        dry_run: bool,
    ) -> Arc<Result<CacheLookup, CacheQueryError>> {
        let usable = |entry: &Entry| Arc::ptr_eq(&entry.0, source) && (dry_run || !entry.2);
        if let Some((_, found, _)) = self.entries.lock().iter().find(|e| usable(e)) {
            return Arc::clone(found);
        }
        let answer = Arc::new(source.lookup(namespace, token_ids, dry_run).await);
        let mut entries = self.entries.lock();
        if let Some((_, found, _)) = entries.iter().find(|e| usable(e)) {
            return Arc::clone(found);
        }
        let entry = (Arc::clone(source), Arc::clone(&answer), dry_run);
        // A dry answer replaced keeps its place: `first` stays the first source asked.
        match entries.iter_mut().find(|(s, _, _)| Arc::ptr_eq(s, source)) {
            Some(replaced) => *replaced = entry,
            None => entries.push(entry),
        }
        answer
    }

    /// The answer of the first source asked, if any was.
    pub fn first(&self) -> Option<Arc<Result<CacheLookup, CacheQueryError>>> {
        self.entries
            .lock()
            .first()
            .map(|(_, answer, _)| Arc::clone(answer))
    }

    /// How many sources were asked.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether no source was asked yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for PrefixMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefixMemo")
            .field("sources", &self.len())
            .finish()
    }
}

/// Memos compare by identity: two memos are equal only when they are the same memo.
impl PartialEq for PrefixMemo {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for PrefixMemo {}
