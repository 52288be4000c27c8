//! A model's prefix-ownership source when shared indexers keep the index: each
//! lookup is an HTTP exchange with an indexer, within a timeout after which the
//! lookup is unavailable and the cache-aware policy falls back as on a miss (its
//! pick says `cache_unavailable`), so routing never waits longer than the timeout.
//! With a token configured, each lookup carries it as a bearer token.
//!
//! Every model's lookups share one [`IndexerLink`]: at most `max_lookups_in_flight`
//! at once (one more is unavailable at once), and one [breaker](super::breaker) per
//! indexer: after a failed lookup none is sent to that indexer for a cooldown, so a
//! silent indexer costs one timeout per cooldown rather than one per request.
//!
//! With several indexers (of the same fleet, in order of preference) a lookup goes
//! to the first whose breaker lets it, and when that one fails (no answer, refused,
//! 5xx, an answer that does not check), the same lookup goes to the next within what
//! remains of its timeout. An indexer that dies so costs no lookup beyond those it
//! leaves silent; once its breaker's trial is answered, lookups go back to it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use parking_lot::Mutex;
use router_policy::{BoxFuture, CacheLookup, CacheQueryError, CacheSource, PrefixHits};
use router_state::kv_events::{chain_hashes, namespace_seed};
use router_upstream::{Origin, Upstream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::breaker::{Breaker, Pass};
use super::wire::{Answer, BINARY_LOOKUP, LOOKUP_PATH, Lookup, MAX_ANSWER_BYTES, MAX_HASHES};
use crate::metrics::{IndexerCounts, IndexerMetrics};

/// What every model's lookups share about the indexers (see the module
/// documentation).
#[derive(Debug)]
pub(crate) struct IndexerLink {
    /// The indexers, in order of preference.
    peers: Vec<Peer>,
    upstream: Upstream,
    timeout: Duration,
    /// `Bearer <token>`, marked sensitive (its `Debug` hides it), when configured.
    authorization: Option<HeaderValue>,
    /// One permit a lookup in flight.
    slots: Semaphore,
    most_in_flight: usize,
    /// When an unavailable lookup was last logged.
    logged: Mutex<Option<Instant>>,
}

/// One indexer: where it is, its breaker and its series.
#[derive(Debug)]
struct Peer {
    origin: Origin,
    breaker: Mutex<Breaker>,
    counts: IndexerCounts,
}

/// How often an unavailable lookup is logged, at most.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

impl IndexerLink {
    /// Lookups of the indexers at `origins` (in order of preference) through
    /// `upstream`, each within `timeout` whichever indexers it tries, at most
    /// `most_in_flight` at once, counted in `metrics` by the indexer's position.
    pub(crate) fn new(
        origins: Vec<Origin>,
        upstream: Upstream,
        timeout: Duration,
        most_in_flight: usize,
        metrics: &IndexerMetrics,
    ) -> Self {
        let peers = origins
            .into_iter()
            .enumerate()
            .map(|(position, origin)| {
                let counts = metrics.of(position);
                // A new link's breakers are closed (a reload builds one).
                counts.breaker_open.set(0);
                Peer {
                    origin,
                    breaker: Mutex::new(Breaker::default()),
                    counts,
                }
            })
            .collect();
        Self {
            peers,
            upstream,
            timeout,
            authorization: None,
            slots: Semaphore::new(most_in_flight),
            most_in_flight,
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
    fn unavailable(&self, model: &str, reason: String) -> CacheLookup {
        let now = Instant::now();
        let mut logged = self.logged.lock();
        if logged.is_none_or(|at| now.saturating_duration_since(at) >= LOG_INTERVAL) {
            *logged = Some(now);
            tracing::warn!(%model, %reason, "prefix indexer lookups are unavailable: cache-aware picks fall back");
        }
        CacheLookup::Unavailable(reason)
    }

    /// Asks about `hashes` of `model` unless the lookups in flight or the breakers
    /// say not to: the first indexer whose breaker lets it, then the next while they
    /// fail, all within the timeout; `Err` with why the lookup is unavailable.
    async fn lookup(
        &self,
        model: &str,
        block_size: u32,
        hashes: Vec<u64>,
        dry_run: bool,
    ) -> Result<PrefixHits, String> {
        let Ok(_slot) = self.slots.try_acquire() else {
            return Err(format!(
                "prefix indexer: {} lookups in flight (max_lookups_in_flight)",
                self.most_in_flight
            ));
        };
        let sent = hashes.len();
        let body = Lookup {
            model: model.into(),
            hashes,
            dry_run,
        }
        .to_binary()
        .map(Bytes::from)
        .map_err(|e| format!("prefix indexer: {e}"))?;
        let deadline = Instant::now() + self.timeout;
        let mut failures = Vec::new();
        for peer in &self.peers {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let Some(pass) = peer.admit(now) else {
                continue;
            };
            let mut outcome = Outcome {
                peer,
                pass,
                settled: false,
            };
            let answer =
                match tokio::time::timeout_at(deadline, self.ask(peer, &body, block_size)).await {
                    Ok(Ok(hits)) if hits.query_blocks() == sent => Ok(hits),
                    Ok(Ok(hits)) => Err(Failed::answered(format!(
                        "an answer for {} blocks to a lookup of {sent}",
                        hits.query_blocks()
                    ))),
                    Ok(Err(failed)) => Err(failed),
                    Err(_) => Err(Failed::down(format!(
                        "no answer within {} ms",
                        self.timeout.as_millis()
                    ))),
                };
            match answer {
                Ok(hits) => {
                    outcome.settle(true);
                    return Ok(hits);
                }
                // About this model: another indexer of the fleet would say the same.
                Err(failed) if failed.answered => {
                    outcome.settle(true);
                    return Err(format!("prefix indexer: {}", failed.reason));
                }
                Err(failed) => {
                    outcome.settle(false);
                    failures.push(self.named(peer, &failed.reason));
                }
            }
        }
        if failures.is_empty() {
            return Err(
                "prefix indexer: lookups failed; one trial lookup after each cooldown".to_owned(),
            );
        }
        Err(format!("prefix indexer: {}", failures.join("; ")))
    }

    /// `reason`, naming the indexer when there are several.
    fn named(&self, peer: &Peer, reason: &str) -> String {
        if self.peers.len() == 1 {
            reason.to_owned()
        } else {
            format!("{}: {reason}", peer.origin)
        }
    }

    async fn ask(&self, peer: &Peer, body: &Bytes, block_size: u32) -> Result<PrefixHits, Failed> {
        let binary = HeaderValue::from_static(BINARY_LOOKUP);
        let mut headers = vec![(header::CONTENT_TYPE, &binary)];
        if let Some(authorization) = &self.authorization {
            headers.push((header::AUTHORIZATION, authorization));
        }
        let response = self
            .upstream
            .post(&peer.origin, LOOKUP_PATH, &headers, body)
            .await
            .map_err(|e| Failed::down(e.to_string()))?;
        let status = response.status();
        let bytes = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| Failed::down(format!("reading the answer: {e}")))?
            .to_bytes();
        if status == StatusCode::UNAUTHORIZED {
            return Err(Failed::down(format!(
                "the indexer answered {status}: prefix_indexer.token (or token_file) is not the indexer's"
            )));
        }
        if status.is_client_error() {
            // About this model (one the indexer does not index, say): the indexer is up.
            return Err(Failed::answered(format!(
                "the indexer answered {status}{}",
                why(&bytes)
            )));
        }
        if status != StatusCode::OK {
            return Err(Failed::down(format!("the indexer answered {status}")));
        }
        let answer: Answer = serde_json::from_slice(&bytes)
            .map_err(|e| Failed::down(format!("an unreadable answer: {e}")))?;
        let hits = answer.into_hits().map_err(|e| Failed::down(e.to_owned()))?;
        if hits.block_size() != block_size {
            return Err(Failed::answered(format!(
                "the indexer hashes blocks of {} tokens, this router {block_size}",
                hits.block_size()
            )));
        }
        Ok(hits)
    }
}

/// The indexer's reason for refusing a lookup (`{"error": {"message"}}`), as `": "`
/// and its first 200 characters without control characters, or nothing.
fn why(answer: &[u8]) -> String {
    let Ok(refusal) = serde_json::from_slice::<serde_json::Value>(answer) else {
        return String::new();
    };
    refusal["error"]["message"]
        .as_str()
        .map(|message| {
            let shown: String = message
                .chars()
                .filter(|c| !c.is_control())
                .take(200)
                .collect();
            format!(": {shown}")
        })
        .unwrap_or_default()
}

impl Peer {
    /// Whether a lookup may go to this indexer at `now`, and as what; counted.
    fn admit(&self, now: Instant) -> Option<Pass> {
        let pass = self.breaker.lock().admit(now)?;
        self.counts.lookups.inc();
        Some(pass)
    }

    /// Its breaker's state in its series.
    fn show(&self, breaker: &Breaker) {
        self.counts
            .breaker_open
            .set(i64::from(!breaker.is_closed()));
    }
}

/// Why a lookup failed, and whether the indexer answered it: an answer that does not
/// fit one model (a model the indexer does not index, another block size) says the
/// indexer is up, and leaves the breaker, which every model shares, closed.
struct Failed {
    reason: String,
    answered: bool,
}

impl Failed {
    /// No usable answer: the indexer is down, slow or broken.
    fn down(reason: String) -> Self {
        Self {
            reason,
            answered: false,
        }
    }

    /// An answer that does not fit the lookup's model.
    fn answered(reason: String) -> Self {
        Self {
            reason,
            answered: true,
        }
    }
}

/// A lookup the breaker let out, told its outcome once; dropped untold (its request
/// went away), it gives up a trial's place.
struct Outcome<'a> {
    peer: &'a Peer,
    pass: Pass,
    settled: bool,
}

impl Outcome<'_> {
    fn settle(&mut self, answered: bool) {
        self.settled = true;
        let peer = self.peer;
        let mut breaker = peer.breaker.lock();
        if answered {
            if breaker.answered() {
                tracing::info!(indexer = %peer.origin, "prefix indexer lookups answered again");
            }
        } else {
            peer.counts.failures.inc();
            if let Some(cooldown) = breaker.failed(self.pass, Instant::now()) {
                tracing::warn!(indexer = %peer.origin, cooldown_ms = cooldown.as_millis() as u64, "prefix indexer lookups failed: none sent to it until a trial after the cooldown");
            }
        }
        peer.show(&breaker);
    }
}

impl Drop for Outcome<'_> {
    fn drop(&mut self) {
        if !self.settled {
            let mut breaker = self.peer.breaker.lock();
            breaker.abandoned(self.pass, Instant::now());
            self.peer.show(&breaker);
        }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct RemoteCacheSource {
    model: String,
    block_size: u32,
    link: Arc<IndexerLink>,
}

impl RemoteCacheSource {
    /// A source asking the indexer `link` reaches about `model`, whose prompts are
    /// hashed in blocks of `block_size` tokens.
    pub(crate) fn new(model: &str, block_size: u32, link: Arc<IndexerLink>) -> Self {
        Self {
            model: model.to_owned(),
            block_size,
            link,
        }
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
                return Ok(CacheLookup::Answered(PrefixHits::new(
                    0,
                    self.block_size,
                    Vec::new(),
                )));
            }
            let answer = self
                .link
                .lookup(&self.model, self.block_size, hashes, dry_run)
                .await;
            Ok(match answer {
                Ok(hits) => CacheLookup::Answered(hits),
                Err(reason) => self.link.unavailable(&self.model, reason),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::response::IntoResponse;
    use router_upstream::UpstreamTimeouts;

    use super::*;

    /// A listener that accepts connections and never answers, counting them.
    async fn silent() -> (Origin, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = Origin::of(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                open.push(socket);
            }
        });
        (origin, accepted, task)
    }

    fn link(origin: Origin, most_in_flight: usize, timeout: Duration) -> Arc<IndexerLink> {
        let upstream = Upstream::new(UpstreamTimeouts {
            connect: timeout,
            first_byte: timeout,
            pool_idle: Duration::from_secs(4),
        });
        Arc::new(IndexerLink::new(
            vec![origin],
            upstream,
            timeout,
            most_in_flight,
            &IndexerMetrics::default(),
        ))
    }

    // Two lookups wait on a silent indexer: a third is unavailable at once rather than
    // waiting too; once the two time out, the breaker keeps the next from going out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lookups_past_the_cap_or_behind_an_open_breaker_are_unavailable_at_once() {
        let (origin, accepted, server) = silent().await;
        // Long enough that both lookups are still out when the third comes.
        let link = link(origin, 2, Duration::from_secs(2));
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let link = Arc::clone(&link);
                tokio::spawn(async move { link.lookup("m", 16, vec![1, 2], false).await })
            })
            .collect();
        tokio::time::timeout(Duration::from_secs(20), async {
            while accepted.load(Ordering::SeqCst) < 2 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("both lookups reach the indexer");
        let third = link.lookup("m", 16, vec![1, 2], false).await.unwrap_err();
        assert!(third.contains("2 lookups in flight"), "{third}");
        for lookup in waiting {
            let failed = lookup.await.unwrap().unwrap_err();
            assert!(
                failed.contains("no answer within 2000 ms")
                    || failed.contains("first-byte timeout"),
                "{failed}"
            );
        }
        let behind = link.lookup("m", 16, vec![1, 2], false).await.unwrap_err();
        assert!(
            behind.contains("one trial lookup after each cooldown"),
            "{behind}"
        );
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "nothing more reached the indexer"
        );
        server.abort();
    }

    // An indexer that answers 404 for a model it does not index is up: lookups of the
    // other models (here, the next lookups) still go out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_about_one_model_leaves_the_breaker_closed() {
        let asked = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&asked);
        let app = axum::Router::new().route(
            LOOKUP_PATH,
            axum::routing::post(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { StatusCode::NOT_FOUND }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = Origin::of(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let link = link(origin, 4, Duration::from_secs(5));
        for _ in 0..3 {
            let failed = link.lookup("m", 16, vec![1], false).await.unwrap_err();
            assert!(failed.contains("answered 404"), "{failed}");
        }
        assert_eq!(
            asked.load(Ordering::SeqCst),
            3,
            "every lookup reached the indexer"
        );
        server.abort();
    }

    // An indexer older than the router reads its binary lookup as JSON and refuses it:
    // the lookup's reason says what the indexer said, its control characters left
    // out and cut at 200 characters.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_lookup_says_why_the_indexer_refused_it() {
        let message = format!(
            "not a lookup:\nexpected value at line 1 column 1{}",
            "!".repeat(300)
        );
        let app = axum::Router::new().route(
            LOOKUP_PATH,
            axum::routing::post(move || async move {
                let refusal = serde_json::json!({"error": {"message": message}});
                (StatusCode::BAD_REQUEST, axum::Json(refusal))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = Origin::of(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let failed = link(origin, 4, Duration::from_secs(5))
            .lookup("m", 16, vec![1], false)
            .await
            .unwrap_err();
        let kept = "not a lookup:expected value at line 1 column 1";
        assert_eq!(
            failed,
            format!(
                "prefix indexer: the indexer answered 400 Bad Request: {kept}{}",
                "!".repeat(200 - kept.len())
            )
        );
        server.abort();
    }

    /// An indexer that answers every lookup with no engine holding anything, or 503
    /// while `down` is set; counting the lookups it answered.
    async fn answering(
        down: Arc<std::sync::atomic::AtomicBool>,
    ) -> (Origin, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
        let answered = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&answered);
        let app = axum::Router::new().route(
            LOOKUP_PATH,
            axum::routing::post(move |body: Bytes| {
                let (down, counter) = (Arc::clone(&down), Arc::clone(&counter));
                async move {
                    if down.load(Ordering::SeqCst) {
                        return StatusCode::SERVICE_UNAVAILABLE.into_response();
                    }
                    counter.fetch_add(1, Ordering::SeqCst);
                    let blocks = Lookup::from_binary(&body).map_or(0, |l| l.hashes.len());
                    axum::Json(serde_json::json!({
                        "query_blocks": blocks, "block_size": 16, "engines": [], "ranks": []
                    }))
                    .into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = Origin::of(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (origin, answered, server)
    }

    // The first indexer fails: the same lookup is answered by the second, the first's
    // breaker opens (its series say so), and once the first answers its trial,
    // lookups go back to it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_lookup_goes_to_the_next_indexer_and_back_once_the_first_answers_its_trial() {
        use std::sync::atomic::AtomicBool;

        let first_down = Arc::new(AtomicBool::new(true));
        let (first, first_answered, first_server) = answering(Arc::clone(&first_down)).await;
        let (second, second_answered, second_server) =
            answering(Arc::new(AtomicBool::new(false))).await;
        let timeout = Duration::from_secs(5);
        let metrics = IndexerMetrics::default();
        let link = two_indexers([first, second], timeout, &metrics);
        let (first_counts, second_counts) = (metrics.of(0), metrics.of(1));

        let hits = link.lookup("m", 16, vec![1, 2, 3], false).await.unwrap();
        assert_eq!(hits.query_blocks(), 3, "answered by the second indexer");
        assert_eq!(second_answered.load(Ordering::SeqCst), 1);
        assert_eq!(first_counts.lookups.get(), 1);
        assert_eq!(first_counts.failures.get(), 1);
        assert_eq!(
            first_counts.breaker_open.get(),
            1,
            "the first's breaker opened"
        );
        assert_eq!(second_counts.breaker_open.get(), 0);

        first_down.store(false, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(30), async {
            while first_answered.load(Ordering::SeqCst) == 0 {
                link.lookup("m", 16, vec![1], false)
                    .await
                    .expect("every lookup is answered, by one indexer or the other");
            }
        })
        .await
        .expect("the first indexer's trial comes after its cooldown");
        assert_eq!(first_counts.breaker_open.get(), 0, "its trial closed it");
        let by_second = second_answered.load(Ordering::SeqCst);
        link.lookup("m", 16, vec![1], false).await.unwrap();
        assert_eq!(
            first_answered.load(Ordering::SeqCst),
            2,
            "back to the first"
        );
        assert_eq!(second_answered.load(Ordering::SeqCst), by_second);
        first_server.abort();
        second_server.abort();
    }

    /// A link to `urls`, in order, whose lookups wait at most `timeout`.
    fn two_indexers(urls: [Origin; 2], timeout: Duration, metrics: &IndexerMetrics) -> IndexerLink {
        let upstream = Upstream::new(UpstreamTimeouts {
            connect: timeout,
            first_byte: timeout,
            pool_idle: Duration::from_secs(4),
        });
        IndexerLink::new(urls.into(), upstream, timeout, 8, metrics)
    }

    // A silent first indexer spends the whole lookup's timeout: that lookup is
    // unavailable, and its breaker sends the next ones to the second indexer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_first_indexer_costs_its_lookups_timeout_then_the_second_answers() {
        use std::sync::atomic::AtomicBool;

        let (first, accepted, first_server) = silent().await;
        let (second, second_answered, second_server) =
            answering(Arc::new(AtomicBool::new(false))).await;
        let timeout = Duration::from_millis(300);
        let metrics = IndexerMetrics::default();
        let link = two_indexers([first, second], timeout, &metrics);
        let failed = link.lookup("m", 16, vec![1, 2], false).await.unwrap_err();
        assert!(
            failed.contains("no answer within 300 ms") || failed.contains("first-byte timeout"),
            "{failed}"
        );
        assert_eq!(
            second_answered.load(Ordering::SeqCst),
            0,
            "no time was left for the second"
        );
        assert_eq!(metrics.of(0).breaker_open.get(), 1);
        // Past a cooldown the first's trial may take another lookup's timeout.
        let hits = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Ok(hits) = link.lookup("m", 16, vec![1, 2], false).await {
                    return hits;
                }
            }
        })
        .await
        .expect("the second indexer answers");
        assert_eq!(hits.query_blocks(), 2);
        assert_eq!(second_answered.load(Ordering::SeqCst), 1);
        assert_eq!(
            metrics.of(1).lookups.get(),
            1,
            "the second is asked only once the first's breaker is open"
        );
        assert!(accepted.load(Ordering::SeqCst) >= 1);
        first_server.abort();
        second_server.abort();
    }
}
