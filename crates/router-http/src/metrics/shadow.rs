//! The groups' shadow policies, read at scrape time: shadowed picks by whether the
//! shadow agreed with the group's pick, and the cached prompt tokens each side's
//! engines held. A configuration reload builds the groups anew, and their sums start
//! again from zero.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

use crate::routing::{Routing, ShadowSeries};

/// See the module documentation.
#[derive(Debug)]
pub(super) struct ShadowCollector(pub(super) Arc<Routing>);

/// One counter family with a sample per group and value of `label`.
fn family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[ShadowSeries],
    label: &str,
    values: impl Fn(&ShadowSeries) -> Vec<(&'static str, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for s in series {
        for (value, n) in values(s) {
            let labels = [
                ("model", &*s.model),
                ("bucket", s.bucket.as_str()),
                ("stage", s.stage.as_str()),
                ("policy", s.policy),
                (label, value),
            ];
            ConstCounter::new(n).encode(metric.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

impl Collector for ShadowCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let series = self.0.shadows();
        if series.is_empty() {
            return Ok(());
        }
        family(
            &mut encoder,
            "shadow_picks",
            "Picks a group's shadow policy made beside the group's, by model, bucket, stage, shadow policy and outcome: agreed (the same engine), disagreed, or none (the shadow picked nothing)",
            &series,
            "outcome",
            |s| {
                let t = s.totals;
                vec![
                    ("agreed", t.agreed),
                    ("disagreed", t.disagreed),
                    ("none", t.none),
                ]
            },
        )?;
        family(
            &mut encoder,
            "shadow_cached_tokens",
            "Prompt tokens the engines of shadowed picks held by the request's prefix lookup, by model, bucket, stage, shadow policy and side: shadow (the shadow policy's engine) or live (the group's engine)",
            &series,
            "side",
            |s| {
                vec![
                    ("shadow", s.totals.cached_tokens),
                    ("live", s.totals.live_cached_tokens),
                ]
            },
        )
    }
}
