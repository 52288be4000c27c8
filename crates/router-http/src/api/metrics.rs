//! `GET /metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::header;

use crate::app::AppContext;
use crate::metrics::Gauge;

pub(super) async fn scrape(State(ctx): State<Arc<AppContext>>) -> Response {
    let snapshot = ctx.fleet.registry().snapshot();
    let load = ctx.fleet.load().snapshot();
    let mut in_flight = Vec::new();
    let mut healthy = Vec::new();
    let mut breaker = Vec::new();
    let mut report_age = Vec::new();
    for worker in snapshot.engines() {
        let engine = || vec![("engine", worker.id().to_string())];
        let seen = load.observe(worker.id());
        in_flight.push((engine(), seen.in_flight as f64));
        healthy.push((engine(), if worker.is_healthy() { 1.0 } else { 0.0 }));
        if let Some(state) = ctx.fleet.breaker(worker.id()) {
            breaker.push((engine(), if state.is_open() { 1.0 } else { 0.0 }));
        }
        if let Some(reported) = seen.reported {
            report_age.push((
                engine(),
                load.captured_at()
                    .saturating_duration_since(reported.received_at)
                    .as_secs_f64(),
            ));
        }
    }
    let feed = ctx
        .fleet
        .feed_stats()
        .counts()
        .iter()
        .map(|(outcome, n)| (vec![("outcome", (*outcome).to_owned())], *n as f64))
        .collect();
    let mut gauges = vec![
        Gauge {
            name: "engine_in_flight",
            help: "Requests this router has in flight per engine",
            counter: false,
            samples: in_flight,
        },
        Gauge {
            name: "engine_healthy",
            help: "Whether an engine is routable (probes pass, breaker closed)",
            counter: false,
            samples: healthy,
        },
        Gauge {
            name: "engine_breaker_open",
            help: "Whether an engine's circuit breaker is open",
            counter: false,
            samples: breaker,
        },
        Gauge {
            name: "engine_load_report_age_seconds",
            help: "Age of an engine's freshest complete load report (absent when none is fresh)",
            counter: false,
            samples: report_age,
        },
        Gauge {
            name: "load_feed_messages",
            help: "Load-feed messages by outcome since start",
            counter: true,
            samples: feed,
        },
    ];
    gauges.extend(crate::scrape::prefix_cache_gauges(&ctx));
    let text = ctx.metrics.encode(&gauges);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
