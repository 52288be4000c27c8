//! `POST /explain/<endpoint>`: a routed request's body and headers, prepared and
//! selected as the endpoint would, without dispatching it, taking in-flight slots or
//! binding a key; the answer says what selection saw and decided. Part of the admin
//! API: the same token, the same address.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use router_policy::{Explanation, PrefixMemo};

use super::chat::{read_body, ready};
use crate::app::AppContext;
use crate::explanation;
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
    let (body, _charge) = match read_body(&ctx, body).await {
        Ok(read) => read,
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
    let class = match ready.route.flow.as_deref() {
        Some(flow) => match flow.classify(
            &parts.headers,
            ready.prepared.priority,
            (&ctx.objectives, &ready.route.id),
        ) {
            Ok(class) => Some((flow, class)),
            Err(e) => return e.into_response(),
        },
        None => None,
    };
    let selected = ready
        .route
        .resolver
        .select(&ctx.fleet.snapshot(), &request)
        .await;
    let report = explanation::Report {
        endpoint: endpoint.path,
        model: &ready.route.id,
        resolver: &ready.route.resolver,
        prepared: &ready.prepared,
        request: &request,
        selected: &selected,
        seen: &explanation.observations(),
        load: &ctx.fleet.load().snapshot(),
    };
    let mut answer = report.to_json();
    if let Some((flow, class)) = class {
        answer["flow"] = flow.explain(&class, &selected);
    }
    Json(answer).into_response()
}
