//! Prometheus metrics: counters and histograms recorded on the request path, and
//! per-engine gauges read from shared state at scrape time.

use std::fmt::Write as _;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub(crate) model: Arc<str>,
    pub(crate) outcome: &'static str,
    pub(crate) code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PickLabels {
    pub(crate) model: Arc<str>,
    pub(crate) bucket: Arc<str>,
    pub(crate) stage: &'static str,
    pub(crate) engine: Arc<str>,
    pub(crate) reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StageLabels {
    pub(crate) stage: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ModelStageLabels {
    pub(crate) model: Arc<str>,
    pub(crate) stage: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ModelLabels {
    pub(crate) model: Arc<str>,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric recorded while serving.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// Chat requests by model, outcome (`ok`, `client_error`, `server_error`,
    /// `cancelled`) and error code.
    pub(crate) requests: Family<RequestLabels, Counter>,
    /// Engine picks by model, bucket, stage, engine and reason.
    pub(crate) picks: Family<PickLabels, Counter>,
    /// Time from dispatch to an engine's response head, by stage.
    pub(crate) upstream_latency: Histograms<StageLabels>,
    /// Time from a request's arrival to the first response byte sent to the client.
    pub(crate) time_to_first_token: Histograms<ModelLabels>,
    /// Prompt tokens cache-aware picks expected their engines to find cached.
    pub(crate) predicted_cached_tokens: Family<ModelStageLabels, Counter>,
    /// Prompt tokens of the picks that made such a prediction (the denominator).
    pub(crate) predicted_prompt_tokens: Family<ModelStageLabels, Counter>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("switchyard");
        let requests = Family::default();
        registry.register(
            "requests",
            "Chat requests by model, outcome and error code",
            requests.clone(),
        );
        let picks = Family::default();
        registry.register(
            "picks",
            "Engine picks by model, bucket, stage, engine and reason",
            picks.clone(),
        );
        let upstream_latency: Histograms<StageLabels> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "upstream_latency_seconds",
            "Time from dispatch to the engine's response head, by stage",
            upstream_latency.clone(),
        );
        let time_to_first_token: Histograms<ModelLabels> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "time_to_first_token_seconds",
            "Time from a request's arrival to its first response byte",
            time_to_first_token.clone(),
        );
        let predicted_cached_tokens = Family::default();
        registry.register(
            "predicted_cached_tokens",
            "Prompt tokens cache-aware picks expected their engines to find cached, by model and stage",
            predicted_cached_tokens.clone(),
        );
        let predicted_prompt_tokens = Family::default();
        registry.register(
            "predicted_prompt_tokens",
            "Prompt tokens of the picks that predicted cached tokens, by model and stage",
            predicted_prompt_tokens.clone(),
        );
        Self {
            registry,
            requests,
            picks,
            upstream_latency,
            time_to_first_token,
            predicted_cached_tokens,
            predicted_prompt_tokens,
        }
    }

    /// The exposition text: the registry, then `gauges`, then the end marker.
    pub(crate) fn encode(&self, gauges: &[Gauge]) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        if let Some(stripped) = text.strip_suffix("# EOF\n") {
            text.truncate(stripped.len());
        }
        for gauge in gauges {
            let (kind, suffix) = if gauge.counter {
                ("counter", "_total")
            } else {
                ("gauge", "")
            };
            let _ = writeln!(text, "# HELP switchyard_{} {}", gauge.name, gauge.help);
            let _ = writeln!(text, "# TYPE switchyard_{} {kind}", gauge.name);
            for (labels, value) in &gauge.samples {
                let labels = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect::<Vec<_>>()
                    .join(",");
                let _ = writeln!(
                    text,
                    "switchyard_{}{suffix}{{{labels}}} {value}",
                    gauge.name
                );
            }
        }
        text.push_str("# EOF\n");
        text
    }
}

/// A gauge (or, with `counter`, a counter kept elsewhere) read at scrape time.
#[derive(Debug)]
pub(crate) struct Gauge {
    pub(crate) name: &'static str,
    pub(crate) help: &'static str,
    pub(crate) counter: bool,
    pub(crate) samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counters_histograms_and_scrape_time_gauges() {
        let metrics = Metrics::new();
        metrics
            .requests
            .get_or_create(&RequestLabels {
                model: Arc::from("m"),
                outcome: "ok",
                code: "ok",
            })
            .inc();
        metrics
            .upstream_latency
            .get_or_create(&StageLabels { stage: "plain" })
            .observe(0.004);
        let gauges = [Gauge {
            name: "engine_in_flight",
            help: "Requests in flight per engine",
            counter: false,
            samples: vec![(vec![("engine", "A\"1".into())], 2.0)],
        }];
        let text = metrics.encode(&gauges);
        assert!(
            text.contains("switchyard_requests_total{model=\"m\",outcome=\"ok\",code=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "switchyard_upstream_latency_seconds_bucket{le=\"0.004\",stage=\"plain\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("switchyard_engine_in_flight{engine=\"A\\\"1\"} 2"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n") && text.matches("# EOF").count() == 1);
    }
}
