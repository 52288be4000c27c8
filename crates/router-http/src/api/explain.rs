//! `POST /explain/<endpoint>`: a routed request's body and headers, prepared and
//! selected as the endpoint would, without dispatching it, taking in-flight slots or
//! binding a key; the answer says what selection saw and decided. Part of the admin
//! API: the same token, the same address.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use router_buckets::{Bucket, BucketGroups, BucketRequest, EnginePicks, SelectError, Selection};
use router_policy::{Explanation, Observation, Pick, PrefixMemo};
use router_state::{EngineId, EngineMetrics, LoadSnapshot, Role};
use serde_json::{Value, json};

use super::chat::{Ready, read_body, ready};
use crate::app::AppContext;
use crate::error::ApiError;
use crate::prepare::Endpoint;

/// The path that explains `endpoint`.
pub(super) fn path(endpoint: &Endpoint) -> String {
    format!("/explain{}", endpoint.path)
}

/// The `POST` route explaining `endpoint`.
pub(super) fn explained(endpoint: &'static Endpoint) -> MethodRouter<Arc<AppContext>> {
    post(
        move |State(ctx): State<Arc<AppContext>>, request: Request| explain(endpoint, ctx, request),
    )
}

async fn explain(endpoint: &'static Endpoint, ctx: Arc<AppContext>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = match read_body(&ctx, body).await {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    let ready = match ready(endpoint, &ctx, &parts.headers, &body).await {
        Ok(ready) => ready,
        Err((_, e)) => return e.into_response(),
    };
    let memo = PrefixMemo::new();
    let explanation = Explanation::dry_run();
    let request = match ready.bucket_request(&memo) {
        Ok(request) => request.with_explanation(Some(&explanation)),
        Err(e) => return e.into_response(),
    };
    let selected = ready
        .route
        .resolver
        .select(&ctx.fleet.snapshot(), &request)
        .await;
    let seen = explanation.observations();
    let load = ctx.fleet.load().snapshot();
    Json(report(endpoint, &ready, &request, &selected, &seen, &load)).into_response()
}

/// The explanation's JSON: the request's facts, every bucket in the order the loop
/// considers them, and the pick or why there is none.
fn report(
    endpoint: &Endpoint,
    ready: &Ready<'_>,
    request: &BucketRequest<'_>,
    selected: &Result<Selection, SelectError>,
    seen: &[Observation],
    load: &LoadSnapshot,
) -> Value {
    let buckets: Vec<Value> = ready
        .route
        .resolver
        .buckets()
        .iter()
        .map(|bucket| explain_bucket(bucket, request, selected, seen, load))
        .collect();
    let mut answer = json!({
        "model": &*ready.route.id,
        "endpoint": endpoint.path,
        "request": {
            "prompt_tokens": request.input_tokens,
            "tokenized": request.token_ids.is_some(),
            "max_output_tokens": ready.prepared.max_output_tokens,
            "expected_peak_tokens": request.expected_peak_tokens,
            "stream": ready.prepared.stream,
            "session_key": request.session_key,
            "routing_key": request.routing_key,
            "adapter": request.adapter,
        },
        "buckets": buckets,
    });
    match selected {
        Ok(selection) => {
            let engines = match &selection.pick.engines {
                EnginePicks::Plain(pick) => json!({ "plain": picked(pick) }),
                EnginePicks::Pd { prefill, decode } => {
                    json!({ "prefill": picked(prefill), "decode": picked(decode) })
                }
            };
            answer["pick"] = json!({ "bucket": &*selection.pick.bucket, "engines": engines });
        }
        Err(e) => {
            let error = ApiError::from(e.clone());
            answer["error"] = json!({
                "status": error.status().as_u16(), "code": error.code(), "message": error.message(),
            });
        }
    }
    answer
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
    request: &BucketRequest<'_>,
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
        _ if tried.is_empty() => ("not_tried", None),
        Ok(selection) if &*selection.pick.bucket == id => ("picked", None),
        Err(SelectError::Stopped {
            bucket: Some(stopped),
            error,
        }) if &**stopped == id => ("stopped", Some(error.to_string())),
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

/// Why a request does not fit `bucket`.
fn misfit(bucket: &Bucket, request: &BucketRequest<'_>) -> String {
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
    let candidates: Vec<Value> = candidates
        .iter()
        .map(|engine| explain_candidate(engine, bucket, stage, seen, load))
        .collect();
    let mut entry = json!({ "stage": stage.as_str(), "candidates": candidates });
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
            _ => {}
        }
    }
    Some(entry)
}

fn explain_candidate(
    engine: &EngineId,
    bucket: &str,
    stage: Role,
    seen: &[Observation],
    load: &LoadSnapshot,
) -> Value {
    let mut cached = None;
    let mut checks = Vec::new();
    let mut read = None;
    for observation in seen {
        match observation {
            Observation::CachedTokens {
                bucket: b,
                stage: s,
                engine: e,
                tokens,
            } if b == bucket && *s == stage && e == engine => cached = Some(*tokens),
            Observation::Admission {
                bucket: b,
                stage: s,
                engine: e,
                metrics,
                caps,
                rejected,
            } if b == bucket && *s == stage && e == engine => {
                read.get_or_insert(*metrics);
                checks.push(json!({
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
    // Engines admission never read show the load table as it is now.
    let metrics = read.unwrap_or_else(|| load.observe(engine).metrics());
    json!({
        "engine": engine.as_str(),
        "load": figures(&metrics),
        "matched_prefix_tokens": cached,
        "admission": checks,
    })
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
