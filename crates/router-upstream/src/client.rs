//! Requests to engines (through the `h1` client) with their timeouts: relayed
//! requests, health probes and introspection.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};

use crate::h1::{H1Body, H1Client, H1Error};
use crate::info::{ServerInfo, parse_adapters, parse_server_info};
use crate::metrics_text::{ScrapedRank, parse_load_metrics};
#[cfg(feature = "tls")]
use crate::tls::EngineTls;
use crate::url::Origin;

/// Why a request to an engine failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    /// The connection could not be made (refused, unreachable).
    #[error("connection failed: {0}")]
    Connect(String),
    /// The connection (over TLS, with its handshake) was not made within the
    /// connect timeout.
    #[error("timed out: connect timeout")]
    ConnectTimeout,
    /// The TLS handshake failed, or the engine refused the connection with a TLS
    /// alert before reading the request.
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    /// The connection broke before the request was written.
    #[error("the connection broke before the request was written: {0}")]
    NotWritten(String),
    /// Connecting, or reading a probe's or introspection's answer, took too long.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// A relayed request's response head did not come within the first-byte
    /// timeout: for a request answered whole, a long generation rather than an
    /// engine fault.
    #[error("timed out: no response head within the first-byte timeout")]
    NoHead,
    /// The connection broke or the engine answered garbage.
    #[error("transport error: {0}")]
    Transport(String),
}

impl UpstreamError {
    /// The failure in words that never include the engine's address, for clients.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connection failed",
            Self::ConnectTimeout => "connect timeout",
            Self::Tls(_) => "TLS handshake failed",
            Self::NotWritten(_) => "the connection broke before the request was written",
            Self::Timeout(what) => what,
            Self::NoHead => "no response head within the first-byte timeout",
            Self::Transport(_) => "the connection broke",
        }
    }

    /// Whether the engine never received the request (no connection was made, it
    /// broke before the request was written, or TLS refused it), so sending it to
    /// another engine cannot run it twice.
    pub fn never_sent(&self) -> bool {
        matches!(
            self,
            Self::Connect(_) | Self::ConnectTimeout | Self::Tls(_) | Self::NotWritten(_)
        )
    }
}

impl From<H1Error> for UpstreamError {
    fn from(e: H1Error) -> Self {
        match e {
            H1Error::Connect(e) => Self::Connect(e.to_string()),
            H1Error::ConnectTimeout => Self::ConnectTimeout,
            H1Error::Tls(e) => Self::Tls(e.to_string()),
            H1Error::NotWritten(e) => Self::NotWritten(e.to_string()),
            e => Self::Transport(e.to_string()),
        }
    }
}

/// How long the client waits for an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamTimeouts {
    /// Connecting, with the TLS handshake for an `https://` engine.
    pub connect: Duration,
    /// From sending a request to the response head.
    pub first_byte: Duration,
    /// How long an idle engine connection is kept for reuse; keep it below the
    /// engines' own keep-alive timeout (5 s for the uvicorn servers SGLang and vLLM
    /// run), so the router is not the one surprised by a connection the engine has
    /// just closed.
    pub pool_idle: Duration,
}

/// The most idle connections kept per engine.
const MAX_IDLE_PER_ENGINE: usize = 256;
/// The largest answer read from an engine's `/health` or `/server_info`.
const MAX_INFO_BYTES: usize = 1 << 20;
/// How long one `/server_info` attempt may take.
const INFO_TIMEOUT: Duration = Duration::from_secs(2);

/// The client shared by dispatch, health probes and introspection.
#[derive(Debug, Clone)]
pub struct Upstream {
    client: H1Client,
    first_byte: Duration,
}

impl Upstream {
    /// A client with `timeouts` and a keep-alive pool per engine. It reaches
    /// `http://` engines only until it is given TLS settings
    /// ([`with_tls`](Self::with_tls)).
    pub fn new(timeouts: UpstreamTimeouts) -> Self {
        Self {
            client: H1Client::new(timeouts.connect, timeouts.pool_idle, MAX_IDLE_PER_ENGINE),
            first_byte: timeouts.first_byte,
        }
    }

    /// The client reaching `https://` engines with `tls` as well.
    #[cfg(feature = "tls")]
    pub fn with_tls(self, tls: EngineTls) -> Self {
        Self {
            client: self.client.with_tls(tls),
            ..self
        }
    }

    /// How long a request waits for an engine's response head once sent.
    pub fn first_byte_timeout(&self) -> Duration {
        self.first_byte
    }

    /// Closes engine connections that have been idle too long.
    pub fn prune_idle(&self) {
        self.client.prune_idle();
    }

    /// Posts `body` to `path` of the engine at `origin` and waits for the response
    /// head within the first-byte timeout. A request that was written is never sent
    /// twice (the engine may be running it).
    ///
    /// # Errors
    /// Connecting, writing or reading the head failed or timed out.
    pub async fn post(
        &self,
        origin: &Origin,
        path: &str,
        headers: &[(HeaderName, &HeaderValue)],
        body: &Bytes,
    ) -> Result<Response<H1Body>, UpstreamError> {
        let request = self.client.request("POST", origin, path, headers, body);
        match tokio::time::timeout(self.first_byte, request).await {
            Err(_) => Err(UpstreamError::NoHead),
            Ok(result) => result.map_err(UpstreamError::from),
        }
    }

    /// `GET base + path` within `timeout`; the status and the whole body (at most
    /// 1 MiB).
    ///
    /// # Errors
    /// The exchange failed, took too long, or the answer was too large.
    pub async fn get(
        &self,
        base: &str,
        path: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), UpstreamError> {
        let origin = Origin::of(base)
            .ok_or_else(|| UpstreamError::Transport("not an engine base URL".into()))?;
        let json = HeaderValue::from_static("application/json");
        let headers = [(header::ACCEPT, &json)];
        let exchange = async {
            let response = self
                .client
                .request("GET", &origin, path, &headers, &Bytes::new())
                .await?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_INFO_BYTES)
                .collect()
                .await
                .map_err(|e| UpstreamError::Transport(e.to_string()))?
                .to_bytes();
            Ok::<_, UpstreamError>((status, body))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => Err(UpstreamError::Timeout("no complete answer in time")),
            Ok(result) => result,
        }
    }

    /// Whether the engine at `base` answers `GET /health` with a success within
    /// `timeout`.
    pub async fn probe(&self, base: &str, timeout: Duration) -> bool {
        matches!(
            self.get(base, "/health", timeout).await,
            Ok((status, _)) if status.is_success()
        )
    }

    /// Reads the load of the engine's ranks `0..dp_size` from its Prometheus
    /// `/metrics` (at most 1 MiB) within `timeout`.
    ///
    /// # Errors
    /// The exchange failed, took too long, or the engine answered an error status.
    pub async fn scrape_load(
        &self,
        base: &str,
        dp_size: u32,
        timeout: Duration,
    ) -> Result<Vec<ScrapedRank>, UpstreamError> {
        let (status, body) = self.get(base, "/metrics", timeout).await?;
        if !status.is_success() {
            return Err(UpstreamError::Transport(format!(
                "/metrics answered {status}"
            )));
        }
        Ok(parse_load_metrics(&String::from_utf8_lossy(&body), dp_size))
    }

    /// The LoRA adapters the engine's `/v1/models` lists (at most 1,024 names of
    /// 1 to 256 bytes of visible ASCII; none when it has no such endpoint, a 404 or
    /// 405): `None` when it could not be read (no answer within 2 s, an answer over
    /// 1 MiB, any other error status, a body that is not JSON).
    pub async fn adapters(&self, base: &str) -> Option<Vec<String>> {
        match self.get(base, "/v1/models", INFO_TIMEOUT).await {
            Ok((status, body)) if status.is_success() => {
                let models = serde_json::from_slice(&body).ok()?;
                Some(parse_adapters(&models))
            }
            // No such endpoint: no adapters. Any other refusal (429, 408, a proxy's
            // 401) says nothing of them.
            Ok((status, _))
                if status == http::StatusCode::NOT_FOUND
                    || status == http::StatusCode::METHOD_NOT_ALLOWED =>
            {
                Some(Vec::new())
            }
            _ => None,
        }
    }

    /// Reads the engine's `/server_info` (and the adapters its `/v1/models` lists):
    /// up to three attempts, 100 ms then 200 ms
    /// apart. An engine that answers 4xx (vLLM has no such endpoint) says nothing
    /// about itself; `None` if it never answered.
    pub async fn server_info(&self, base: &str) -> Option<ServerInfo> {
        let mut wait = Duration::from_millis(100);
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            let info = match self.get(base, "/server_info", INFO_TIMEOUT).await {
                Ok((status, body)) if status.is_success() => {
                    let info = serde_json::from_slice(&body).unwrap_or_default();
                    parse_server_info(&info, base)
                }
                Ok((status, _)) if status.is_client_error() => ServerInfo::default(),
                _ => continue,
            };
            return Some(ServerInfo {
                adapters: self.adapters(base).await.unwrap_or_default(),
                ..info
            });
        }
        None
    }
}
