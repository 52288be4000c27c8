//! The JSON of a selection's explanation: the request's facts, every bucket in the
//! order the bucket loop considers it (skipped and why, passed over, picked), each
//! tried stage's candidates with their load, matched prefix tokens and admission
//! verdicts, and the pick or why there is none. `/explain/...` answers it; decision
//! records carry it.

use std::collections::{HashMap, HashSet};

use router_buckets::{Bucket, BucketGroups, BucketResolver, EnginePicks, SelectError, Selection};
use router_policy::{Observation, Pick, RequestFacts};
use router_state::{EngineId, EngineMetrics, LoadSnapshot, Role};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::prepare::Prepared;

/// What a selection was given and what it saw.
pub(crate) struct Report<'a> {
    /// The routed endpoint's path.
    pub(crate) endpoint: &'static str,
    /// The model's id.
    pub(crate) model: &'a str,
    /// The model's buckets.
    pub(crate) resolver: &'a BucketResolver,
    /// The request as its endpoint read it.
    pub(crate) prepared: &'a Prepared,
    /// The facts selection ran on.
    pub(crate) request: &'a RequestFacts<'a>,
    /// What selection decided.
    pub(crate) selected: &'a Result<Selection, SelectError>,
    /// What it saw on the way.
    pub(crate) seen: &'a [Observation],
    /// The load table, for candidates admission never read.
    pub(crate) load: &'a LoadSnapshot,
}

impl Report<'_> {
    /// The JSON: the request's facts, every bucket in the order the loop considers
    /// them, and the pick or why there is none.
    pub(crate) fn to_json(&self) -> Value {
        let Self {
            request,
            selected,
            seen,
            load,
            ..
        } = *self;
        // The loop tries buckets predicted to miss their latency targets last.
        let demoted: Vec<&str> = seen
            .iter()
            .filter_map(|o| match o {
                Observation::Slo {
                    bucket,
                    demoted: true,
                    ..
                } => Some(bucket.as_str()),
                _ => None,
            })
            .collect();
        let mut ordered: Vec<&Bucket> = self.resolver.buckets().iter().collect();
        ordered.sort_by_key(|bucket| demoted.contains(&bucket.id()));
        let buckets: Vec<Value> = ordered
            .into_iter()
            .map(|bucket| explain_bucket(bucket, request, selected, seen, load))
            .collect();
        let mut answer = json!({
            "model": self.model,
            "endpoint": self.endpoint,
            "request": {
                "prompt_tokens": request.input_tokens,
                "tokenized": request.token_ids.is_some(),
                "max_output_tokens": self.prepared.max_output_tokens,
                "expected_peak_tokens": request.expected_peak_tokens,
                "stream": self.prepared.stream,
                "session_key": request.session_key,
                "routing_key": request.routing_key,
                "adapter": request.adapter,
            },
            "buckets": buckets,
        });
        answer_with(&mut answer, selected);
        answer
    }
}

/// Adds the pick, or the error, to `answer`.
fn answer_with(answer: &mut Value, selected: &Result<Selection, SelectError>) {
    match selected {
        Ok(selection) => {
            let engines = engines(&selection.pick.engines);
            answer["pick"] = json!({ "bucket": &*selection.pick.bucket, "engines": engines });
        }
        Err(e) => {
            let error = ApiError::from(e.clone());
            answer["error"] = json!({
                "status": error.status().as_u16(), "code": error.code(), "message": error.message(),
            });
        }
    }
}

/// A selection's engines: `{"plain": ...}` or `{"prefill": ..., "decode": ...}`, each
/// with its reason and predicted cached tokens.
pub(crate) fn engines(engines: &EnginePicks) -> Value {
    match engines {
        EnginePicks::Plain(pick) => json!({ "plain": picked(pick) }),
        EnginePicks::Pd { prefill, decode } => {
            json!({ "prefill": picked(prefill), "decode": picked(decode) })
        }
    }
}

fn picked(pick: &Pick) -> Value {
    json!({
        "engine": pick.engine.id().as_str(),
        "reason": pick.reason.as_str(),
        "predicted_cached_tokens": pick.predicted_cached_tokens,
    })
}

/// One bucket: skipped (the request does not fit it), tried (its stages, and what
/// came of it), or not tried (an earlier bucket was picked, or routing stopped).
fn explain_bucket(
    bucket: &Bucket,
    request: &RequestFacts<'_>,
    selected: &Result<Selection, SelectError>,
    seen: &[Observation],
    load: &LoadSnapshot,
) -> Value {
    let limits = bucket.limits();
    let mut entry = json!({
        "id": bucket.id(),
        "limits": { "min": limits.min, "max": limits.max },
        "max_context_tokens": bucket.max_context_tokens(),
    });
    if let Some(targets) = bucket.slo() {
        entry["slo"] = slo_seen(bucket.id(), seen)
            .unwrap_or_else(|| json!({ "ttft_ms": targets.ttft_ms, "tpot_ms": targets.tpot_ms }));
    }
    if !bucket.accepts(request.input_tokens, request.expected_peak_tokens) {
        entry["outcome"] = json!("skipped");
        entry["why"] = json!(misfit(bucket, request));
        return entry;
    }
    let stages: Vec<Role> = match bucket.groups() {
        BucketGroups::Plain(_) => vec![Role::Plain],
        BucketGroups::Pd { .. } => vec![Role::Prefill, Role::Decode],
    };
    let tried: Vec<Value> = stages
        .into_iter()
        .filter_map(|stage| explain_stage(bucket.id(), stage, seen, load))
        .collect();
    let id = bucket.id();
    let passed_over = match selected {
        Ok(selection) => selection.passed_over.as_slice(),
        Err(e) => e.attempts(),
    };
    let (outcome, why) = match selected {
        Err(SelectError::Stopped {
            bucket: Some(stopped),
            error,
        }) if &**stopped == id => ("stopped", Some(error.to_string())),
        _ if tried.is_empty() => ("not_tried", None),
        Ok(selection) if &*selection.pick.bucket == id => ("picked", None),
        _ => match passed_over.iter().find(|a| &*a.bucket == id) {
            Some(attempt) => ("passed_over", Some(attempt.error.to_string())),
            None => ("not_tried", None),
        },
    };
    entry["outcome"] = json!(outcome);
    if let Some(why) = why {
        entry["why"] = json!(why);
    }
    entry["stages"] = json!(tried);
    entry
}

/// A bucket's latency targets as the loop checked them: the targets, the predictions
/// (milliseconds) and whether they meet them; `None` when not checked.
fn slo_seen(bucket: &str, seen: &[Observation]) -> Option<Value> {
    let ms = |us: Option<u64>| us.map(|us| us as f64 / 1000.0);
    seen.iter().find_map(|o| match o {
        Observation::Slo {
            bucket: b,
            ttft_ms,
            tpot_ms,
            predicted_ttft_us,
            predicted_tpot_us,
            meets,
            demoted,
        } if b == bucket => Some(json!({
            "ttft_ms": ttft_ms,
            "tpot_ms": tpot_ms,
            "predicted_ttft_ms": ms(*predicted_ttft_us),
            "predicted_tpot_ms": ms(*predicted_tpot_us),
            "meets": meets,
            "demoted": demoted,
        })),
        _ => None,
    })
}

/// Why a request does not fit `bucket`.
fn misfit(bucket: &Bucket, request: &RequestFacts<'_>) -> String {
    let limits = bucket.limits();
    if !limits.contains(request.input_tokens) {
        let max = limits.max.map_or("no limit".to_owned(), |m| m.to_string());
        return format!(
            "the prompt's {} tokens are outside the bucket's limits ({} to {max})",
            request.input_tokens, limits.min
        );
    }
    let needed = request.expected_peak_tokens.unwrap_or(request.input_tokens);
    format!(
        "the prompt and its output budget need {needed} tokens, above the bucket's max_context_tokens ({})",
        bucket.max_context_tokens().unwrap_or_default()
    )
}

/// One stage of a tried bucket: its candidates with their load, predicted cached
/// tokens and admission verdicts, and the group's pick or failure; `None` when the
/// stage was not reached.
fn explain_stage(
    bucket: &str,
    stage: Role,
    seen: &[Observation],
    load: &LoadSnapshot,
) -> Option<Value> {
    let here = |b: &str, s: Role| b == bucket && s == stage;
    let candidates = seen.iter().find_map(|o| match o {
        Observation::Candidates {
            bucket: b,
            stage: s,
            engines,
        } if here(b, *s) => Some(engines),
        _ => None,
    })?;
    let mut of = candidates_seen(seen, &here);
    let picked = seen.iter().find_map(|o| match o {
        Observation::Picked {
            bucket: b,
            stage: s,
            engine,
            ..
        } if here(b, *s) => Some(engine),
        _ => None,
    });
    let listed = listed(candidates, picked, &of);
    let omitted = candidates.len() - listed.len();
    let candidates: Vec<Value> = listed
        .into_iter()
        .map(|engine| {
            let seen = of.remove(engine).unwrap_or_default();
            // Engines admission never read show the load table as it is now.
            let metrics = seen.read.unwrap_or_else(|| load.observe(engine).metrics());
            seen.to_json(engine, &metrics)
        })
        .collect();
    let mut entry = json!({ "stage": stage.as_str(), "candidates": candidates });
    if omitted > 0 {
        entry["candidates_omitted"] = json!(omitted);
    }
    let unpaired = unpaired(seen, &here);
    if !unpaired.is_empty() {
        entry["unpaired"] = json!(unpaired);
    }
    stage_outcome(&mut entry, seen, &here);
    Some(entry)
}

/// Most candidates a stage lists; past it, the explanation says how many it left out
/// (`candidates_omitted`), so its size does not grow with the fleet.
pub(crate) const MAX_LISTED_CANDIDATES: usize = 64;

/// The candidates a stage lists, in their order: all of them up to
/// [`MAX_LISTED_CANDIDATES`]; past it, first the picked engine, then those the pick
/// looked at (admission read them, or they hold some of the prompt), then the others
/// in order.
fn listed<'a>(
    candidates: &'a [EngineId],
    picked: Option<&EngineId>,
    of: &HashMap<&EngineId, Candidate>,
) -> Vec<&'a EngineId> {
    if candidates.len() <= MAX_LISTED_CANDIDATES {
        return candidates.iter().collect();
    }
    let is_picked = |e: &&EngineId| Some(*e) == picked;
    let first = candidates.iter().filter(is_picked);
    let looked_at = candidates
        .iter()
        .filter(|e| !is_picked(e) && of.contains_key(e));
    let others = candidates
        .iter()
        .filter(|e| !is_picked(e) && !of.contains_key(e));
    let kept: HashSet<&EngineId> = first
        .chain(looked_at)
        .chain(others)
        .take(MAX_LISTED_CANDIDATES)
        .collect();
    candidates.iter().filter(|e| kept.contains(e)).collect()
}

/// The engines the stage `here` names left out of its candidates because they cannot
/// pair with an engine of the other stage: each with that engine, the field they
/// disagree on and what the prefill and the decode engine say.
fn unpaired(seen: &[Observation], here: &dyn Fn(&str, Role) -> bool) -> Vec<Value> {
    seen.iter()
        .filter_map(|o| match o {
            Observation::Unpaired {
                bucket: b,
                stage: s,
                engine,
                with,
                mismatch,
            } if here(b, *s) => {
                let (prefill, decode) = mismatch.values();
                Some(json!({
                    "engine": engine.as_str(), "with": with.as_str(),
                    "field": mismatch.field(), "prefill": prefill, "decode": decode,
                }))
            }
            _ => None,
        })
        .collect()
}

/// What the stage `here` names saw of each engine, in one pass.
fn candidates_seen<'a>(
    seen: &'a [Observation],
    here: &dyn Fn(&str, Role) -> bool,
) -> HashMap<&'a EngineId, Candidate> {
    let mut of: HashMap<&EngineId, Candidate> = HashMap::new();
    for observation in seen {
        match observation {
            Observation::CachedTokens {
                bucket: b,
                stage: s,
                engine,
                tokens,
                slower_tokens,
                feed_age_ms,
            } if here(b, *s) => {
                of.entry(engine).or_default().cached =
                    Some((*tokens, *slower_tokens, *feed_age_ms));
            }
            Observation::Admission {
                bucket: b,
                stage: s,
                engine,
                metrics,
                caps,
                rejected,
            } if here(b, *s) => {
                let candidate = of.entry(engine).or_default();
                candidate.read.get_or_insert(*metrics);
                candidate.checks.push(json!({
                    "verdict": if rejected.is_some() { "rejected" } else { "admitted" },
                    "caps": caps,
                    "exceeded": rejected.map(|r| json!({
                        "limit": r.limit, "observed": r.observed, "cap": r.cap,
                    })),
                }));
            }
            _ => {}
        }
    }
    of
}

/// The stage's pick or failure, whether its cache lookups were unavailable, and what
/// its shadow policy picked beside it.
fn stage_outcome(entry: &mut Value, seen: &[Observation], here: &dyn Fn(&str, Role) -> bool) {
    if seen
        .iter()
        .any(|o| matches!(o, Observation::CacheUnavailable { bucket: b, stage: s } if here(b, *s)))
    {
        entry["cache"] = json!("unavailable");
    }
    for observation in seen {
        match observation {
            Observation::Picked {
                bucket: b,
                stage: s,
                engine,
                reason,
                predicted_cached_tokens,
            } if here(b, *s) => {
                entry["pick"] = json!({
                    "engine": engine.as_str(),
                    "reason": reason.as_str(),
                    "predicted_cached_tokens": predicted_cached_tokens,
                });
            }
            Observation::Failed {
                bucket: b,
                stage: s,
                error,
            } if here(b, *s) => {
                entry["error"] = json!({ "code": error.code(), "message": error.to_string() });
            }
            Observation::Shadow {
                bucket: b,
                stage: s,
                policy,
                engine,
                agreed,
                cached_tokens,
                live_cached_tokens,
            } if here(b, *s) => {
                entry["shadow"] = json!({
                    "policy": policy,
                    "engine": engine.as_ref().map(EngineId::as_str),
                    "agreed": agreed,
                    "cached_tokens": cached_tokens,
                    "live_cached_tokens": live_cached_tokens,
                });
            }
            _ => {}
        }
    }
}

/// What a stage saw of one candidate.
#[derive(Default)]
struct Candidate {
    /// Matched prompt tokens, those of them only on slower tiers, the feed's age.
    cached: Option<(u64, u64, u64)>,
    checks: Vec<Value>,
    /// The figures the first admission check read.
    read: Option<EngineMetrics>,
}

impl Candidate {
    /// The candidate's entry: `metrics` as its load.
    fn to_json(&self, engine: &EngineId, metrics: &EngineMetrics) -> Value {
        let mut candidate = json!({
            "engine": engine.as_str(),
            "load": figures(metrics),
            "matched_prefix_tokens": self.cached.map(|(tokens, _, _)| tokens),
            "admission": self.checks,
        });
        if let Some((_, slower, age)) = self.cached {
            if slower > 0 {
                candidate["matched_on_slower_tiers"] = json!(slower);
            }
            if age > 0 {
                candidate["kv_feed_age_ms"] = json!(age);
            }
        }
        candidate
    }
}

fn figures(metrics: &EngineMetrics) -> Value {
    json!({
        "running_requests": metrics.running_requests,
        "waiting_requests": metrics.waiting_requests,
        "kv_tokens": metrics.kv_tokens,
        "pending_prefill_tokens": metrics.pending_prefill_tokens,
        "inflight_requests": metrics.inflight_requests,
    })
}

#[cfg(test)]
mod tests;
