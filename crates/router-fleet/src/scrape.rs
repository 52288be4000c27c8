//! The load of an engine without a `LoadStat` feed (vLLM), read from its Prometheus
//! `/metrics` on an interval into the load table as basic reports, one per rank,
//! under the same freshness rules as fed reports.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use router_state::{EngineReportedLoadTable, FeedHandle, FeedStats, LoadReport};
use router_upstream::{ScrapedRank, Upstream};
use tokio::time::{Instant, sleep};

use crate::spec::EngineSpec;

/// How often an engine's `/metrics` is read by default.
pub const DEFAULT_METRICS_INTERVAL: Duration = Duration::from_secs(1);

/// The longest wait between reads of an engine whose `/metrics` keeps failing.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Reads `spec`'s `/metrics` every `interval` (longer, up to 30 s, while reads fail)
/// and applies each rank's load to `load`.
pub(crate) fn metrics_scraper(
    spec: &EngineSpec,
    dp_size: NonZeroU32,
    upstream: Upstream,
    load: Arc<EngineReportedLoadTable>,
    stats: Arc<FeedStats>,
    interval: Duration,
) -> FeedHandle {
    let (id, url) = (spec.id.clone(), spec.url.clone());
    let timeout = interval.clamp(Duration::from_millis(100), Duration::from_secs(2));
    FeedHandle::spawn(async move {
        let mut wait = interval;
        loop {
            match upstream.scrape_load(&url, dp_size.get(), timeout).await {
                Ok(ranks) => {
                    wait = interval;
                    let now = Instant::now();
                    for (rank, scraped) in (0_u32..).zip(ranks) {
                        if scraped.seen
                            && load.ingest(&id, rank, report(scraped, rank), now).is_ok()
                        {
                            stats.scraped();
                        }
                    }
                }
                Err(e) => {
                    stats.scrape_failed();
                    tracing::debug!(engine = %id, error = %e, "reading the engine's /metrics failed");
                    wait = (wait * 2).min(MAX_BACKOFF.max(interval));
                }
            }
            sleep(wait).await;
        }
    })
}

/// A basic report of what a rank's metrics state: KV tokens in use from the usage
/// fraction and the capacity, when the engine states its capacity.
fn report(scraped: ScrapedRank, rank: u32) -> LoadReport {
    let capacity = scraped.kv_capacity_tokens.filter(|c| *c > 0);
    let used = match (scraped.kv_usage, capacity) {
        (Some(usage), Some(capacity)) => (usage * capacity as f64).round() as u64,
        _ => 0,
    };
    LoadReport {
        running_requests: scraped.running_requests,
        waiting_requests: scraped.waiting_requests,
        used_kv_tokens: used,
        max_kv_tokens: capacity,
        dp_rank: Some(i64::from(rank)),
        native: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_becomes_tokens_only_with_a_stated_capacity() {
        let scraped = ScrapedRank {
            running_requests: 2,
            waiting_requests: 1,
            kv_usage: Some(0.25),
            kv_capacity_tokens: Some(1_000),
            seen: true,
        };
        let full = report(scraped, 1);
        assert_eq!(
            (
                full.running_requests,
                full.waiting_requests,
                full.used_kv_tokens,
                full.max_kv_tokens,
                full.dp_rank
            ),
            (2, 1, 250, Some(1_000), Some(1))
        );
        let unknown = report(
            ScrapedRank {
                kv_capacity_tokens: None,
                ..scraped
            },
            0,
        );
        assert_eq!((unknown.used_kv_tokens, unknown.max_kv_tokens), (0, None));
    }
}
