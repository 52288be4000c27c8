//! `GET /metrics`: every metric family, in the format the scraper asked for.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, header};

use crate::app::AppContext;
use crate::metrics::Format;

pub(super) async fn scrape(State(ctx): State<Arc<AppContext>>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(headers.get(header::ACCEPT));
    let text = ctx.metrics.render(format).await;
    (
        [
            (header::CONTENT_TYPE, format.content_type()),
            (header::VARY, "accept"),
        ],
        text,
    )
        .into_response()
}
