//! Scrape-time metrics of prefix-cache awareness (the KV-event subscribers' counters
//! and each model's prefix-index size) and of affinity (bindings held).

use crate::app::AppContext;
use crate::metrics::Gauge;

/// KV-feed counters (by event and by drop reason) and per-model index gauges.
pub(crate) fn prefix_cache_gauges(ctx: &AppContext) -> Vec<Gauge> {
    let stats = ctx.fleet.kv_stats();
    let mut events = vec![(
        vec![("event", "applied".to_owned())],
        stats.applied() as f64,
    )];
    let mut degraded = Vec::new();
    for (name, value) in stats.counters() {
        if name == "degraded_sources" {
            degraded.push((Vec::new(), value as f64));
        } else {
            events.push((vec![("event", name.to_owned())], value as f64));
        }
    }
    let dropped = stats
        .dropped()
        .into_iter()
        .map(|(reason, n)| (vec![("reason", reason.to_owned())], n as f64))
        .collect();
    let mut nodes = Vec::new();
    let mut entries = Vec::new();
    let mut bytes = Vec::new();
    let mut evicted = Vec::new();
    for (model, index) in ctx.fleet.prefix_indexes() {
        let size = index.size();
        let label = || vec![("model", model.clone())];
        nodes.push((label(), size.nodes as f64));
        entries.push((label(), size.entries as f64));
        bytes.push((label(), size.bytes as f64));
        evicted.push((label(), index.evicted() as f64));
    }
    vec![
        Gauge {
            name: "kv_feed_events",
            help: "KV-event subscriber events: batches applied, gaps, catch-ups, replays, replay failures, restarts, clears, disconnects",
            counter: true,
            samples: events,
        },
        Gauge {
            name: "kv_events_dropped",
            help: "KV events and batches not applied, by reason",
            counter: true,
            samples: dropped,
        },
        Gauge {
            name: "kv_degraded_sources",
            help: "Engine ranks whose KV history is being repaired (their matches are ignored)",
            counter: false,
            samples: degraded,
        },
        Gauge {
            name: "prefix_index_nodes",
            help: "Blocks in the model's prefix index",
            counter: false,
            samples: nodes,
        },
        Gauge {
            name: "prefix_index_entries",
            help: "(block, engine) ownership entries in the model's prefix index",
            counter: false,
            samples: entries,
        },
        Gauge {
            name: "prefix_index_bytes",
            help: "Estimated memory of the model's prefix index",
            counter: false,
            samples: bytes,
        },
        Gauge {
            name: "affinity_bindings",
            help: "Session and routing-key bindings held (live or awaiting the sweeper)",
            counter: false,
            samples: vec![(Vec::new(), ctx.affinity.len() as f64)],
        },
        Gauge {
            name: "prefix_index_evicted",
            help: "Blocks evicted from the model's prefix index to stay within its node budget",
            counter: true,
            samples: evicted,
        },
    ]
}
