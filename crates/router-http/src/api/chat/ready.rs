//! A routed request made ready for selection: its body read as its endpoint reads
//! it, its model's route resolved (and refused when the model's engines do not serve
//! the endpoint), its prompt tokenized where routing needs it, its affinity keys read.

use std::hash::RandomState;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::HeaderMap;
use router_config::PdProtocol;
use router_policy::{PrefixMemo, RequestFacts};
use router_state::kv_events::cache_namespace;
use tokio::sync::OwnedSemaphorePermit;

use super::model_of;
use crate::app::AppContext;
use crate::decisions::replay::{self, Prompt, Replay};
use crate::error::ApiError;
use crate::prepare::{Counted, Endpoint, Prepared, Tokenize, prepare};
use crate::routing::ModelRoute;
use crate::validated::AffinityHeaders;

/// The most served models a missing-model error names.
const NAMED_MODELS: usize = 8;

/// The served models `ids`, quoted, for an error: the first [`NAMED_MODELS`], then how
/// many more.
fn served_models(ids: &[String]) -> String {
    let named: Vec<String> = ids
        .iter()
        .take(NAMED_MODELS)
        .map(|id| format!("{id:?}"))
        .collect();
    match ids.len() {
        0 => "no model yet".to_owned(),
        n if n > NAMED_MODELS => format!("{} and {} more", named.join(", "), n - NAMED_MODELS),
        _ => named.join(", "),
    }
}

/// A request prepared for selection: its model's route, the facts its endpoint
/// reads, and its affinity keys.
pub(in crate::api) struct Ready<'h> {
    pub(in crate::api) route: Arc<ModelRoute>,
    pub(in crate::api) prepared: Prepared,
    /// The adapter `model` names (`base:adapter`), if any.
    named_adapter: Option<Arc<str>>,
    pub(in crate::api) session_key: Option<&'h str>,
    pub(in crate::api) routing_key: Option<&'h str>,
    /// The salted cache namespace, for a request with a `cache_salt`.
    salted: Option<String>,
}

impl Ready<'_> {
    /// The LoRA adapter the request is for: the one `model` names wins over
    /// `/generate`'s `lora_path`, as on SGLang.
    pub(in crate::api) fn adapter(&self) -> Option<&str> {
        self.named_adapter
            .as_deref()
            .or(self.prepared.adapter.as_deref())
    }

    /// The facts the bucket loop selects on, with prefix lookups shared through
    /// `memo`.
    pub(in crate::api) fn bucket_request<'a>(
        &'a self,
        memo: &'a PrefixMemo,
    ) -> Result<RequestFacts<'a>, ApiError> {
        let request = RequestFacts::new(&self.route.id, self.prepared.input_tokens)
            .with_max_output_tokens(self.prepared.max_output_tokens)
            .map_err(|e| ApiError::invalid("invalid_parameter", "max_tokens", e.to_string()))?;
        Ok(request
            .with_adapter(self.adapter())
            .with_cache_namespace(self.salted.as_deref())
            .with_token_ids(self.prepared.token_ids.as_deref())
            .with_prefix_memo(Some(memo))
            .with_session_key(self.session_key)
            .with_routing_key(self.routing_key))
    }

    /// The `replay` object of this request's replayable decision record
    /// ([`replay`](crate::decisions::replay)), the request having arrived at
    /// `arrived`, its pages hashed under `key`: from the ids routing read; when
    /// routing reads no prompt, from tokenizing it on a task of its own, off the
    /// request threads, while the request goes on, if `tokenizing` gives leave (held
    /// until the tokenization ends; none for a request no bucket took); its length
    /// alone when neither is possible.
    pub(in crate::api) fn replay(
        &self,
        endpoint: &'static Endpoint,
        ctx: &Arc<AppContext>,
        body: &Bytes,
        arrived: SystemTime,
        key: &RandomState,
        tokenizing: impl FnOnce() -> Option<OwnedSemaphorePermit>,
    ) -> Replay {
        let estimate = self.prepared.input_tokens;
        let block_size = self.route.block_size;
        let namespace = self.salted.as_deref().or(self.adapter());
        let prompt = |token_ids: Option<&[u32]>, tokens: u64, namespace: Option<&str>| {
            let prompt = Prompt {
                token_ids,
                tokens,
                block_size,
                namespace,
            };
            replay::fields(prompt, arrived, key)
        };
        let tokenizer = match (&self.prepared.token_ids, &self.route.record_tokenizer) {
            (Some(ids), _) => return Replay::Ready(prompt(Some(ids), estimate, namespace)),
            (None, Some(tokenizer)) => tokenizer,
            (None, None) => return Replay::Ready(prompt(None, estimate, namespace)),
        };
        let Some(permit) = tokenizing() else {
            return Replay::Ready(prompt(None, estimate, namespace));
        };
        let tokenize = Tokenize::new(endpoint, body.clone(), Arc::clone(tokenizer));
        let (ctx, key) = (Arc::clone(ctx), key.clone());
        let namespace = namespace.map(str::to_owned);
        Replay::spawn(async move {
            let counted = tokenize.off_thread(&ctx.tokenizing).await.ok();
            drop(permit);
            let prompt = Prompt {
                token_ids: counted.as_ref().map(Counted::ids),
                tokens: counted.as_ref().map_or(estimate, Counted::tokens),
                block_size,
                namespace: namespace.as_deref(),
            };
            replay::fields(prompt, arrived, &key)
        })
    }
}

/// Reads `body` as `endpoint` does, resolves its model and tokenizes its prompt
/// where routing needs it, and reads the affinity headers.
///
/// # Errors
/// The client's mistake or a tokenization failure, with the model for metrics (empty
/// until known).
pub(in crate::api) async fn ready<'h>(
    endpoint: &'static Endpoint,
    ctx: &Arc<AppContext>,
    headers: &'h HeaderMap,
    body: &Bytes,
) -> Result<Ready<'h>, (Arc<str>, ApiError)> {
    let mut route = None;
    let mut named_adapter = None;
    let prepared = prepare(endpoint, body, |model| {
        let (found, named) = resolve(ctx, model)?;
        // Known from here on, a refused request is counted under its model.
        let found = route.insert(found);
        // An adapter no engine of the model lists is not found, however it is named
        // (vLLM's adapter name, SGLang's `base:adapter`).
        if let Some(adapter) = &named
            && !listed(ctx, found, adapter)
        {
            return Err(ApiError::model_not_found(model.unwrap_or_default()));
        }
        named_adapter = named;
        check_endpoint(endpoint, found)?;
        Ok(found.tokenizer.clone())
    });
    let (prepared, tokenize) = prepared.map_err(|e| (model_of(route.as_ref()), e))?;
    let route = route.expect("prepare resolved the model");
    if named_adapter.is_none()
        && let Some(adapter) = &prepared.adapter
        && !listed(ctx, &route, adapter)
    {
        return Err((Arc::clone(&route.id), ApiError::adapter_not_found(adapter)));
    }
    let prepared = match tokenize {
        None => prepared,
        Some(tokenize) => match tokenize.off_thread(&ctx.tokenizing).await {
            Ok(tokens) => prepared.with_tokens(tokens),
            Err(e) => return Err((Arc::clone(&route.id), e)),
        },
    };
    let keys = affinity_keys(&ctx.affinity_headers, headers);
    match keys {
        Ok((session_key, routing_key)) => {
            let salted = prepared.cache_salt.as_deref().and_then(|salt| {
                let adapter = named_adapter.as_deref().or(prepared.adapter.as_deref());
                cache_namespace(adapter, Some(salt))
            });
            Ok(Ready {
                route,
                prepared,
                named_adapter,
                session_key,
                routing_key,
                salted,
            })
        }
        Err(e) => Err((Arc::clone(&route.id), e)),
    }
}

/// Whether an engine of `route`'s model lists LoRA adapter `adapter`, healthy or not.
fn listed(ctx: &AppContext, route: &ModelRoute, adapter: &str) -> bool {
    ctx.fleet
        .snapshot()
        .model_engines(&route.id)
        .iter()
        .any(|engine| engine.serves_adapter(adapter))
}

/// The route and adapter of the model a request names (the one served, when it names
/// none).
fn resolve(
    ctx: &AppContext,
    model: Option<&str>,
) -> Result<(Arc<ModelRoute>, Option<Arc<str>>), ApiError> {
    let (found, named) = match model {
        Some(model) => ctx
            .routing
            .resolve(model, || ctx.fleet.snapshot())
            .ok_or_else(|| ApiError::model_not_found(model))?,
        None => {
            let only = ctx.routing.only().ok_or_else(|| {
                ApiError::invalid(
                    "missing_model",
                    "model",
                    format!(
                        "model is required: this router serves {}",
                        served_models(&ctx.routing.model_ids())
                    ),
                )
            })?;
            (only, None)
        }
    };
    Ok((found, named))
}

/// Refuses, before its prompt is tokenized, a request to an endpoint the model's
/// engines do not serve.
fn check_endpoint(endpoint: &Endpoint, found: &ModelRoute) -> Result<(), ApiError> {
    let pd_only = !found.resolver.has_plain_bucket();
    if pd_only && endpoint.plain_only {
        let message = format!(
            "model {:?} is served by prefill/decode engines, which do not serve {}",
            found.id, endpoint.path
        );
        return Err(ApiError::invalid("invalid_model", "model", message));
    }
    if pd_only && found.pd_protocol == PdProtocol::Vllm && !endpoint.vllm_pd {
        let message = format!(
            "model {:?} is served by vLLM prefill/decode engines, whose hand-over serves /v1/chat/completions and /v1/completions, not {}",
            found.id, endpoint.path
        );
        return Err(ApiError::invalid("invalid_model", "model", message));
    }
    Ok(())
}

/// The session and routing keys of the affinity headers; a key longer than the
/// store takes is the client's mistake.
fn affinity_keys<'h>(
    affinity: &AffinityHeaders,
    headers: &'h HeaderMap,
) -> Result<(Option<&'h str>, Option<&'h str>), ApiError> {
    let header = |name: &str| -> Result<Option<&'h str>, ApiError> {
        let value = headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty());
        match value {
            Some(v) if v.len() > affinity.max_key_bytes => Err(ApiError::invalid(
                "invalid_header",
                name,
                format!(
                    "the {name} header is {} bytes; at most {} are accepted",
                    v.len(),
                    affinity.max_key_bytes
                ),
            )),
            v => Ok(v),
        }
    };
    Ok((header(&affinity.session)?, header(&affinity.routing_key)?))
}
