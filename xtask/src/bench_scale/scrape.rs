//! Reading the router's `/metrics` and the simulated engines' probe counts: one
//! scrape timed and sized, samples by name and label, and histogram quantiles.

#![allow(
    clippy::disallowed_methods,
    reason = "a bench tool times scrapes on the wall clock"
)]

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::soak::http;

/// One `/metrics` answer: its text, its size and how long it took.
pub(crate) struct Scrape {
    pub(crate) text: String,
    pub(crate) took: Duration,
}

impl Scrape {
    /// `GET /metrics` on `addr` (`host:port`), on a fresh connection.
    pub(crate) async fn take(addr: &str) -> anyhow::Result<Self> {
        let started = Instant::now();
        let (status, body) = http::call(addr, "GET", "/metrics", &[], b"")
            .await
            .context("scraping /metrics")?;
        let took = started.elapsed();
        if status != 200 {
            bail!("/metrics answered {status}");
        }
        Ok(Self {
            text: String::from_utf8(body).context("/metrics is not UTF-8")?,
            took,
        })
    }

    /// The samples of `name` (no labels after it, or `{...}`) whose labels contain
    /// every one of `labels` (`key="value"`): their labels and values.
    pub(crate) fn samples<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [&'a str],
    ) -> impl Iterator<Item = (&'a str, f64)> + 'a {
        self.text.lines().filter_map(move |line| {
            let rest = line.strip_prefix(name)?;
            let (labels_text, value) = match rest.strip_prefix('{') {
                Some(rest) => rest.rsplit_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            if !labels.iter().all(|l| labels_text.contains(l)) {
                return None;
            }
            Some((labels_text, value.trim().parse().ok()?))
        })
    }

    /// The sum of the samples of `name` with `labels`.
    pub(crate) fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.samples(name, labels).map(|(_, v)| v).sum()
    }

    /// The cumulative buckets of histogram `name` with `labels`: (upper bound, count).
    pub(crate) fn buckets(&self, name: &str, labels: &[&str]) -> Vec<(f64, f64)> {
        let bucket = format!("{name}_bucket");
        let mut buckets: Vec<(f64, f64)> = self
            .samples(&bucket, labels)
            .filter_map(|(labels, count)| {
                let le = labels.split("le=\"").nth(1)?.split('"').next()?;
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((bound, count))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        buckets
    }
}

/// The upper bound of the bucket holding quantile `q` of the observations between
/// two scrapes' cumulative buckets of one histogram (`None` when there were none).
pub(crate) fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let earlier = |bound: f64| {
        before
            .iter()
            .find(|(b, _)| *b == bound)
            .map_or(0.0, |(_, c)| *c)
    };
    let delta: Vec<(f64, f64)> = after.iter().map(|&(b, c)| (b, c - earlier(b))).collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    delta
        .iter()
        .find(|(_, c)| *c >= q * total)
        .map(|(bound, _)| *bound)
}

/// The `q` quantile of `values` (nearest rank), `NaN` for none.
pub(crate) fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// `GET /health` requests every engine has answered so far, summed over each
/// engine's `GET /admin/visits`.
pub(crate) async fn health_probes(engines: &[String]) -> anyhow::Result<u64> {
    let mut total = 0;
    for addr in engines {
        let (status, body) = http::call(addr, "GET", "/admin/visits", &[], b"").await?;
        anyhow::ensure!(status == 200, "{addr}/admin/visits answered {status}");
        let visits: serde_json::Value = serde_json::from_slice(&body)?;
        total += visits["health_probes"]
            .as_u64()
            .with_context(|| format!("no health_probes from {addr}"))?;
    }
    Ok(total)
}
