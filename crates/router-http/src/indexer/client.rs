//! A model's prefix-ownership source when a shared indexer keeps the index: each
//! lookup is one HTTP exchange with the indexer, within a timeout after which the
//! lookup is unavailable and the cache-aware policy falls back as on a miss (its
//! pick says `cache_unavailable`), so routing never waits longer than the timeout.
//! With a token configured, each lookup carries it as a bearer token.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use parking_lot::Mutex;
use router_policy::{BoxFuture, CacheLookup, CacheQueryError, CacheSource, PrefixHits};
use router_state::kv_events::{chain_hashes, namespace_seed};
use router_upstream::{Origin, Upstream};
use tokio::time::Instant;

use super::wire::{Answer, LOOKUP_PATH, Lookup, MAX_ANSWER_BYTES, MAX_HASHES};

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct RemoteCacheSource {
    model: String,
    block_size: u32,
    origin: Origin,
    upstream: Upstream,
    timeout: Duration,
    /// `Bearer <token>`, marked sensitive (its `Debug` hides it), when configured.
    authorization: Option<HeaderValue>,
    /// When an unavailable lookup was last logged.
    logged: Mutex<Option<Instant>>,
}

/// How often an unavailable lookup is logged, at most.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

impl RemoteCacheSource {
    /// A source asking the indexer at `origin` about `model`, whose
    /// prompts are hashed in blocks of `block_size` tokens.
    pub(crate) fn new(
        model: &str,
        block_size: u32,
        origin: Origin,
        upstream: Upstream,
        timeout: Duration,
    ) -> Self {
        Self {
            model: model.to_owned(),
            block_size,
            origin,
            upstream,
            timeout,
            authorization: None,
            logged: Mutex::new(None),
        }
    }

    /// Lookups carrying `authorization` (`Bearer <token>`), if any.
    pub(crate) fn with_authorization(mut self, authorization: Option<HeaderValue>) -> Self {
        self.authorization = authorization;
        self
    }

    /// Logs why lookups fail, at most every [`LOG_INTERVAL`] (each is also a
    /// `cache_unavailable` pick).
    fn unavailable(&self, reason: String) -> CacheLookup {
        let now = Instant::now();
        let mut logged = self.logged.lock();
        if logged.is_none_or(|at| now.saturating_duration_since(at) >= LOG_INTERVAL) {
            *logged = Some(now);
            tracing::warn!(model = %self.model, %reason, "prefix indexer lookups are unavailable: cache-aware picks fall back");
        }
        CacheLookup::Unavailable(reason)
    }

    async fn ask(&self, hashes: Vec<u64>, dry_run: bool) -> Result<PrefixHits, String> {
        let body = serde_json::to_vec(&Lookup {
            model: self.model.as_str().into(),
            hashes,
            dry_run,
        })
        .map_err(|e| e.to_string())?;
        let json = HeaderValue::from_static("application/json");
        let mut headers = vec![(header::CONTENT_TYPE, &json)];
        if let Some(authorization) = &self.authorization {
            headers.push((header::AUTHORIZATION, authorization));
        }
        let response = self
            .upstream
            .post(&self.origin, LOOKUP_PATH, &headers, &Bytes::from(body))
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let bytes = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        if status == StatusCode::UNAUTHORIZED {
            return Err(format!(
                "the indexer answered {status}: prefix_indexer.token (or token_file) is not the indexer's"
            ));
        }
        if status != StatusCode::OK {
            return Err(format!("the indexer answered {status}"));
        }
        let answer: Answer =
            serde_json::from_slice(&bytes).map_err(|e| format!("an unreadable answer: {e}"))?;
        let hits = answer.into_hits()?;
        if hits.block_size != self.block_size {
            return Err(format!(
                "the indexer hashes blocks of {} tokens, this router {}",
                hits.block_size, self.block_size
            ));
        }
        Ok(hits)
    }
}

impl CacheSource for RemoteCacheSource {
    fn lookup<'a>(
        &'a self,
        namespace: Option<&'a str>,
        token_ids: &'a [u32],
        dry_run: bool,
    ) -> BoxFuture<'a, Result<CacheLookup, CacheQueryError>> {
        Box::pin(async move {
            let mut hashes = chain_hashes(
                token_ids,
                self.block_size as usize,
                namespace_seed(namespace),
            );
            // Past the bound, the prompt's first blocks decide (they are what is shared).
            hashes.truncate(MAX_HASHES);
            if hashes.is_empty() {
                return Ok(CacheLookup::Answered(PrefixHits {
                    block_size: self.block_size,
                    ..PrefixHits::default()
                }));
            }
            let sent = hashes.len();
            let answer = match tokio::time::timeout(self.timeout, self.ask(hashes, dry_run)).await {
                Ok(Ok(hits)) if hits.query_blocks == sent => CacheLookup::Answered(hits),
                Ok(Ok(hits)) => self.unavailable(format!(
                    "prefix indexer: an answer for {} blocks to a lookup of {sent}",
                    hits.query_blocks
                )),
                Ok(Err(reason)) => self.unavailable(format!("prefix indexer: {reason}")),
                Err(_) => self.unavailable(format!(
                    "prefix indexer: no answer within {} ms",
                    self.timeout.as_millis()
                )),
            };
            Ok(answer)
        })
    }
}
