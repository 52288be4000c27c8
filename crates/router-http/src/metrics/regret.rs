//! The regret of cache-aware picks, per engine: for each answered request whose pick
//! predicted the cached prompt tokens its engine holds, the prediction beside what the
//! engine's answer reported. Both are counted on the same requests, so their ratio
//! says how far the router's view of an engine's cache is from the engine's own: a
//! chat template or tokenizer unlike the engine's, a KV-event feed that lags or
//! stopped, a page size that changed. Read at scrape time; an engine's series go when
//! it leaves the fleet ([`Regret::forget`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

/// One answer compared with its pick's prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compared {
    /// The prompt tokens the answer reported.
    pub(crate) prompt_tokens: u64,
    /// The cached prompt tokens the pick predicted.
    pub(crate) predicted_cached_tokens: u64,
    /// The cached prompt tokens the answer reported.
    pub(crate) reported_cached_tokens: u64,
}

/// One engine's sums.
#[derive(Debug, Default)]
struct Tally {
    answers: AtomicU64,
    prompt_tokens: AtomicU64,
    predicted_cached_tokens: AtomicU64,
    reported_cached_tokens: AtomicU64,
    /// How far each prediction was from its report, either way: over- and
    /// under-predictions of different answers do not cancel out here.
    mispredicted_cached_tokens: AtomicU64,
}

impl Tally {
    fn add(&self, compared: Compared) {
        let Compared {
            prompt_tokens,
            predicted_cached_tokens: predicted,
            reported_cached_tokens: reported,
        } = compared;
        self.answers.fetch_add(1, Ordering::Relaxed);
        for (sum, n) in [
            (&self.prompt_tokens, prompt_tokens),
            (&self.predicted_cached_tokens, predicted),
            (&self.reported_cached_tokens, reported),
            (
                &self.mispredicted_cached_tokens,
                predicted.abs_diff(reported),
            ),
        ] {
            sum.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub(crate) struct Regret {
    /// Each engine's sums, by engine id.
    engines: Arc<RwLock<HashMap<Arc<str>, Tally>>>,
}

impl Regret {
    /// Counts an answer of `engine` compared with its pick's prediction. An engine not
    /// seen yet is counted only while `registered()` says it is in the fleet: an answer
    /// that ends after its engine left does not bring the engine's series back.
    pub(crate) fn count(
        &self,
        engine: &Arc<str>,
        compared: Compared,
        registered: impl FnOnce() -> bool,
    ) {
        if let Some(tally) = self.engines.read().get(engine) {
            tally.add(compared);
            return;
        }
        // The engine leaves the registry before it is forgotten, which waits for this
        // lock: a tally made here is in the map when it is forgotten.
        let mut engines = self.engines.write();
        if !registered() {
            return;
        }
        engines.entry(Arc::clone(engine)).or_default().add(compared);
    }

    /// Drops the series of `engine`, which left the fleet.
    pub(crate) fn forget(&self, engine: &str) {
        self.engines.write().remove(engine);
    }
}

/// A family: its name, its help, and the sum of a tally it reads.
type FamilyOf = (&'static str, &'static str, fn(&Tally) -> &AtomicU64);

/// The families, each with a sample per engine that has one.
const FAMILIES: [FamilyOf; 5] = [
    (
        "engine_compared_answers",
        "Answers whose usage was compared with their cache-aware pick's prediction, by the engine predicted about",
        |t| &t.answers,
    ),
    (
        "engine_compared_prompt_tokens",
        "Prompt tokens those answers reported, by the engine predicted about",
        |t| &t.prompt_tokens,
    ),
    (
        "engine_predicted_cached_tokens",
        "Prompt tokens the picks of those answers predicted their engine to find cached, by engine",
        |t| &t.predicted_cached_tokens,
    ),
    (
        "engine_reported_cached_tokens",
        "Prompt tokens those answers reported cached, by the engine predicted about",
        |t| &t.reported_cached_tokens,
    ),
    (
        "engine_mispredicted_cached_tokens",
        "The difference between predicted and reported cached tokens of each of those answers, either way, summed by the engine predicted about",
        |t| &t.mispredicted_cached_tokens,
    ),
];

impl Collector for Regret {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let engines = self.engines.read();
        if engines.is_empty() {
            return Ok(());
        }
        let mut sorted: Vec<(&Arc<str>, &Tally)> = engines.iter().collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (name, help, sum) in FAMILIES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (engine, tally) in &sorted {
                // Engine ids follow the name rule: nothing to escape.
                let counter = ConstCounter::new(sum(tally).load(Ordering::Relaxed));
                counter.encode(family.encode_family(&[("engine", &***engine)])?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    fn exposition(regret: &Regret) -> String {
        let mut registry = Registry::with_prefix("switchyard");
        registry.register_collector(Box::new(regret.clone()));
        crate::metrics::encode_registry(&registry, crate::metrics::Format::Prometheus, 0)
    }

    fn compared(prompt: u64, predicted: u64, reported: u64) -> Compared {
        Compared {
            prompt_tokens: prompt,
            predicted_cached_tokens: predicted,
            reported_cached_tokens: reported,
        }
    }

    #[test]
    fn each_engine_sums_its_answers_predictions_and_reports() {
        let regret = Regret::default();
        assert_eq!(exposition(&regret), "", "no family before an answer");
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("A"), Arc::from("B"));
        regret.count(&a, compared(100, 64, 64), || true);
        regret.count(&a, compared(50, 0, 32), || true);
        regret.count(&b, compared(10, 16, 0), || true);
        let text = exposition(&regret);
        for expected in [
            "# TYPE switchyard_engine_compared_answers_total counter",
            "switchyard_engine_compared_answers_total{engine=\"A\"} 2",
            "switchyard_engine_compared_answers_total{engine=\"B\"} 1",
            "switchyard_engine_compared_prompt_tokens_total{engine=\"A\"} 150",
            "switchyard_engine_predicted_cached_tokens_total{engine=\"A\"} 64",
            "switchyard_engine_reported_cached_tokens_total{engine=\"A\"} 96",
            "switchyard_engine_predicted_cached_tokens_total{engine=\"B\"} 16",
            "switchyard_engine_reported_cached_tokens_total{engine=\"B\"} 0",
            "switchyard_engine_mispredicted_cached_tokens_total{engine=\"A\"} 32",
            "switchyard_engine_mispredicted_cached_tokens_total{engine=\"B\"} 16",
        ] {
            assert!(text.contains(expected), "{expected} in:\n{text}");
        }
    }

    #[test]
    fn a_forgotten_engines_series_go_and_stay_gone() {
        let regret = Regret::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("A"), Arc::from("B"));
        regret.count(&a, compared(100, 64, 64), || true);
        regret.count(&b, compared(100, 64, 64), || true);
        regret.forget("A");
        let lines = |engine: &str| {
            let label = format!("engine=\"{engine}\"");
            exposition(&regret)
                .lines()
                .filter(|l| l.contains(&label))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert!(lines("A").is_empty());
        assert_eq!(lines("B").len(), 5, "other engines keep theirs");
        // An answer that ends after its engine left does not bring the series back.
        regret.count(&a, compared(100, 64, 64), || false);
        assert!(lines("A").is_empty());
        // An engine that joins again under the id counts from zero.
        regret.count(&a, compared(7, 0, 5), || true);
        assert!(
            lines("A")
                .contains(&"switchyard_engine_compared_answers_total{engine=\"A\"} 1".to_owned()),
            "{:?}",
            lines("A")
        );
    }
}
