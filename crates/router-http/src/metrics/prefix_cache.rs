//! The tokenizers' prefix caches, read at scrape time: lookups by result, the token
//! ids reused, and what each cache holds, by model.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::routing::Routing;
use router_tokenize::PrefixCacheStats;

/// See the module documentation.
#[derive(Debug)]
pub(super) struct PrefixCacheCollector(pub(super) Arc<Routing>);

/// A sample: its model, a second label if any, and its value.
type Sample<'a, M> = (&'a str, Option<(&'static str, &'static str)>, M);

/// One family with a sample per model (model ids follow the name rule: nothing to
/// escape), and optionally a second label.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: Vec<Sample<'_, M>>,
) -> Result<(), std::fmt::Error> {
    let Some((_, _, first)) = samples.first() else {
        return Ok(());
    };
    let mut metric = encoder.encode_descriptor(name, help, None, first.metric_type())?;
    for (model, extra, sample) in samples {
        let mut labels = vec![("model", model)];
        labels.extend(extra);
        sample.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge(n: u64) -> ConstGauge {
    ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX))
}

impl Collector for PrefixCacheCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats: Vec<(Arc<str>, PrefixCacheStats)> = self
            .0
            .tokenizers()
            .into_iter()
            .map(|(model, tokenizer)| (model, tokenizer.prefix_cache_stats()))
            .collect();
        let each = |f: fn(&PrefixCacheStats) -> u64| {
            stats
                .iter()
                .map(move |(model, s)| (&**model, f(s)))
                .collect::<Vec<_>>()
        };
        let lookups = stats
            .iter()
            .flat_map(|(model, s)| {
                [("hit", s.hits), ("miss", s.misses)]
                    .map(|(result, n)| (&**model, Some(("result", result)), ConstCounter::new(n)))
            })
            .collect();
        family(
            &mut encoder,
            "prompt_prefix_cache_lookups",
            "Long prompts looked up in the tokenizer's prefix cache, by model and result",
            lookups,
        )?;
        let counters = |f| {
            each(f)
                .into_iter()
                .map(|(m, n)| (m, None, ConstCounter::new(n)))
                .collect()
        };
        let gauges = |f| {
            each(f)
                .into_iter()
                .map(|(m, n)| (m, None, gauge(n)))
                .collect()
        };
        family(
            &mut encoder,
            "prompt_prefix_cache_reused_tokens",
            "Prompt token ids taken from the prefix cache instead of tokenized, by model",
            counters(|s| s.reused_tokens),
        )?;
        family(
            &mut encoder,
            "prompt_prefix_cache_bytes",
            "Bytes the tokenizer's prefix cache holds, by model",
            gauges(|s| s.bytes),
        )?;
        family(
            &mut encoder,
            "prompt_prefix_cache_entries",
            "Prompt prefixes the tokenizer's prefix cache holds, by model",
            gauges(|s| s.entries),
        )
    }
}
