//! The one error type every handler returns: OpenAI-shaped, with a stable code.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use router_buckets::SelectError;
use router_policy::PickError;
use serde_json::json;

use crate::flow::Refusal;

/// An error answered to a client as `{"error": {"message", "type", "param", "code"}}`.
///
/// Messages name engines by id only, never by URL, and only as `routing_headers`
/// allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    param: Option<String>,
    /// Seconds a client should wait before trying again, sent as `Retry-After`.
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// A 400 about one request parameter.
    pub(crate) fn invalid(
        code: &'static str,
        param: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            param: Some(param.into()),
            ..Self::new(StatusCode::BAD_REQUEST, code, message)
        }
    }

    /// A 400 about the body as a whole.
    pub(crate) fn bad_body(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_body", message)
    }

    /// 404 for a request to a path no endpoint serves.
    #[cfg(feature = "picker")]
    pub(crate) fn unknown_endpoint(method: &str, path: &str) -> Self {
        /// What the client sent is repeated at most this long.
        fn shown(text: &str) -> &str {
            &text[..text.floor_char_boundary(256)]
        }
        let (method, path) = (shown(method), shown(path));
        Self::new(
            StatusCode::NOT_FOUND,
            "unknown_endpoint",
            format!(
                "the router routes POST /v1/chat/completions, /v1/completions, /v1/embeddings and /generate, not {method} {path}"
            ),
        )
    }

    /// 503 for a request the endpoint picker cannot name one engine for.
    #[cfg(feature = "picker")]
    pub(crate) fn unservable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unservable_by_picker",
            message,
        )
    }

    /// 404 for a model the router does not serve.
    pub(crate) fn model_not_found(model: &str) -> Self {
        Self {
            param: Some("model".into()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!("model {model:?} is not served here"),
            )
        }
    }

    /// 404 for the LoRA adapter `/generate`'s `lora_path` names, which no engine of
    /// the model lists.
    pub(crate) fn adapter_not_found(adapter: &str) -> Self {
        Self {
            param: Some("lora_path".into()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!("LoRA adapter {adapter:?} is not served here"),
            )
        }
    }

    /// 413 for a body over the limit.
    pub(crate) fn too_large(limit: usize) -> Self {
        let limit = if limit >= 1 << 20 {
            format!("{} MiB", limit >> 20)
        } else {
            format!("{} KiB", limit >> 10)
        };
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the request body exceeds {limit}"),
        )
    }

    /// 408: the body did not arrive in time.
    pub(crate) fn body_timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the request body did not arrive within {} ms",
                limit.as_millis()
            ),
        )
    }

    /// 503 with a retry hint: the router cannot take the request now.
    pub(crate) fn overloaded(message: impl Into<String>) -> Self {
        Self {
            retry_after: Some(crate::retry_after::MIN_SECONDS),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message)
        }
    }

    /// 500: the router failed.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }

    /// 502: the engine failed.
    pub(crate) fn upstream(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "upstream_error", message)
    }

    /// 504: the engine did not answer in time.
    pub(crate) fn timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GATEWAY_TIMEOUT, "upstream_timeout", message)
    }

    /// 401 for the admin API.
    pub(crate) fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required",
        )
    }

    /// 403: the admin API is off.
    pub(crate) fn admin_disabled() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "admin_disabled",
            "the admin API is off: set admin.token, admin.token_file or SWITCHYARD_ADMIN_TOKEN",
        )
    }

    /// A 4xx of the admin API.
    pub(crate) fn admin(status: StatusCode, message: impl Into<String>) -> Self {
        Self::new(status, "invalid_worker", message)
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The error of `error`, asking a refused client to wait what `load` says the
    /// refusing engines need to drain (see `retry_after`).
    pub(crate) fn of_selection(error: SelectError, load: &router_state::LoadSnapshot) -> Self {
        let seconds = crate::retry_after::seconds(&error, load);
        let mut api = Self::from(error);
        if api.retry_after.is_some() {
            api.retry_after = Some(seconds);
        }
        api
    }

    /// 429 for a request whose tenant has its cap's worth in flight.
    pub(crate) fn tenant_over_cap(in_flight: u64, cap: u64) -> Self {
        Self {
            retry_after: Some(crate::retry_after::MIN_SECONDS),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "tenant_over_cap",
                format!(
                    "the request's tenant has {in_flight} requests in flight, its cap is {cap}"
                ),
            )
        }
    }

    /// The error of a request flow control refused (or whose selection failed),
    /// asking the client to come back when the queue's drain rate says it may find
    /// room.
    pub(crate) fn of_refusal(refusal: Refusal, load: &router_state::LoadSnapshot) -> Self {
        let seconds = |wait: Duration| wait.as_secs_f64().ceil().max(1.0) as u64;
        match refusal {
            Refusal::Select(error) => Self::of_selection(error, load),
            Refusal::Full { retry_after, .. } => Self {
                retry_after: Some(seconds(retry_after)),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "queue_full",
                    "every engine for the request is at its caps and the model's queue is full",
                )
            },
            Refusal::Timeout {
                retry_after,
                waited,
                ..
            } => Self {
                retry_after: Some(seconds(retry_after)),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "queue_timeout",
                    format!(
                        "no engine for the request had room within {} ms in the model's queue",
                        waited.as_millis()
                    ),
                )
            },
        }
    }

    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The request parameter at fault, if one is.
    pub fn param(&self) -> Option<&str> {
        self.param.as_deref()
    }
}

impl From<SelectError> for ApiError {
    fn from(e: SelectError) -> Self {
        let code = e.code();
        match e {
            SelectError::NoMatchingBucket(error) => {
                Self::new(StatusCode::BAD_REQUEST, code, error.to_string())
            }
            SelectError::AtCapacity { .. } | SelectError::Unavailable { .. } => Self {
                retry_after: Some(crate::retry_after::MIN_SECONDS),
                ..Self::new(StatusCode::SERVICE_UNAVAILABLE, code, e.to_string())
            },
            SelectError::Stopped { error, bucket } => {
                let message = match bucket {
                    Some(bucket) => format!("routing failed in bucket {bucket}: {error}"),
                    None => format!("routing failed: {error}"),
                };
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
            }
            _ => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                e.to_string(),
            ),
        }
    }
}

impl From<PickError> for ApiError {
    fn from(e: PickError) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!("routing failed: {e}"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        let body = json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}});
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
