//! Requests to engines (through the `h1` client) with their timeouts, and what
//! engines report about themselves.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Limited};
use router_state::Role;
use serde_json::Value;

use crate::config::TimeoutConfig;
use crate::h1::{H1Body, H1Client, H1Error};

/// Checks that `url` is an `http://host:port` engine base URL.
///
/// # Errors
/// What is wrong with it (without echoing it into client-facing messages).
pub(crate) fn check_engine_url(url: &str) -> Result<(), String> {
    let uri: Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err("must start with http:// (engines are reached over plain HTTP)".into());
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("needs a host".into());
    }
    if uri
        .path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
    {
        return Err("must be a base URL without a path or query".into());
    }
    Ok(())
}

/// Why a request to an engine failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// The connection could not be made (refused, unreachable).
    #[error("connection failed: {0}")]
    Connect(String),
    /// Connecting, or waiting for the response head, took too long.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// The connection broke or the engine answered garbage.
    #[error("transport error: {0}")]
    Transport(String),
}

impl From<H1Error> for UpstreamError {
    fn from(e: H1Error) -> Self {
        match e {
            H1Error::Connect(e) => Self::Connect(e.to_string()),
            H1Error::ConnectTimeout => Self::Timeout("connect timeout"),
            e => Self::Transport(e.to_string()),
        }
    }
}

/// How long an idle engine connection is kept: below the 5 s keep-alive timeout of
/// the uvicorn servers SGLang and vLLM run, so the router is not the one surprised
/// by a connection the engine has just closed.
const IDLE_CONNECTION: Duration = Duration::from_secs(4);
/// The most idle connections kept per engine.
const MAX_IDLE_PER_ENGINE: usize = 256;

/// The HTTP client shared by dispatch, health probes and introspection.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    client: H1Client,
    first_byte: Duration,
}

impl Upstream {
    pub(crate) fn new(timeouts: &TimeoutConfig) -> Self {
        Self {
            client: H1Client::new(
                Duration::from_millis(timeouts.connect_ms),
                IDLE_CONNECTION,
                MAX_IDLE_PER_ENGINE,
            ),
            first_byte: Duration::from_millis(timeouts.first_byte_ms),
        }
    }

    /// Closes engine connections that have been idle too long.
    pub(crate) fn prune_idle(&self) {
        self.client.prune_idle();
    }

    /// Posts a chat request to the engine at `authority` and waits for the response
    /// head within the first-byte timeout.
    pub(crate) async fn post_chat(
        &self,
        authority: &Arc<str>,
        headers: &[(HeaderName, &HeaderValue)],
        body: &Bytes,
    ) -> Result<Response<H1Body>, UpstreamError> {
        let request = self
            .client
            .request("POST", authority, CHAT_PATH, headers, body);
        match tokio::time::timeout(self.first_byte, request).await {
            Err(_) => Err(UpstreamError::Timeout(
                "no response head within the first-byte timeout",
            )),
            Ok(result) => result.map_err(UpstreamError::from),
        }
    }

    /// `GET base + path` within `timeout`; the status and the whole body.
    pub(crate) async fn get(
        &self,
        base: &str,
        path: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), UpstreamError> {
        let authority = authority(base)
            .ok_or_else(|| UpstreamError::Transport("not an engine base URL".into()))?;
        let json = HeaderValue::from_static("application/json");
        let headers = [(header::ACCEPT, &json)];
        let exchange = async {
            let response = self
                .client
                .request("GET", &authority, path, &headers, &Bytes::new())
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
}

/// The largest answer read from an engine's `/health` or `/server_info`.
const MAX_INFO_BYTES: usize = 1 << 20;

/// The path chat requests are sent to.
const CHAT_PATH: &str = "/v1/chat/completions";

/// The host of an engine base URL (empty when it has none).
pub(crate) fn url_host(url: &str) -> String {
    url.parse::<Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_owned))
        .unwrap_or_default()
}

/// The `host:port` an engine base URL is reached at (port 80 when it names none).
pub(crate) fn authority(url: &str) -> Option<Arc<str>> {
    let uri: Uri = url.parse().ok()?;
    let host = uri.host().filter(|h| !h.is_empty())?;
    let port = uri.port_u16().unwrap_or(80);
    Some(Arc::from(format!("{host}:{port}")))
}

/// What an engine's `/server_info` says about it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    pub(crate) role: Option<Role>,
    pub(crate) bootstrap_port: Option<u16>,
    pub(crate) dp_size: Option<u32>,
    pub(crate) load_feed: Option<FeedEndpoint>,
    pub(crate) kv_feed: Option<KvFeedEndpoint>,
}

/// Where an engine publishes KV-cache events, and replays them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KvFeedEndpoint {
    pub(crate) feed: FeedEndpoint,
    /// Replay ROUTER of rank r at `host:replay_port_base + r`.
    pub(crate) replay_port_base: Option<u16>,
    /// The engine's KV page size, when it says.
    pub(crate) block_size: Option<u32>,
}

/// Where an engine publishes a ZeroMQ feed: rank r at `host:port_base + r`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FeedEndpoint {
    pub(crate) host: String,
    pub(crate) port_base: u16,
    pub(crate) topic: String,
}

impl FeedEndpoint {
    pub(crate) fn rank_endpoint(&self, rank: u32) -> Option<String> {
        let port = self.port_base.checked_add(u16::try_from(rank).ok()?)?;
        Some(format!("tcp://{}:{port}", self.host))
    }
}

/// Reads `/server_info` fields the router uses; a wildcard publisher host means the
/// engine URL's host.
pub(crate) fn parse_server_info(info: &Value, engine_url: &str) -> ServerInfo {
    let role = match info["disaggregation_mode"].as_str() {
        Some("prefill") => Some(Role::Prefill),
        Some("decode") => Some(Role::Decode),
        Some("null") | None if info.get("disaggregation_mode").is_some() => Some(Role::Plain),
        _ => None,
    };
    let kv = &info["kv_events"];
    let engine_host = url_host(engine_url);
    let host = match kv["endpoint_host"].as_str() {
        None | Some("*" | "0.0.0.0" | "::" | "[::]" | "") => engine_host,
        Some(host) => host.to_owned(),
    };
    let port = |key: &str| kv[key].as_u64().and_then(|p| u16::try_from(p).ok());
    let load_feed = port("load_endpoint_port_base").map(|port_base| FeedEndpoint {
        host: host.clone(),
        port_base,
        topic: kv["load_topic"].as_str().unwrap_or("load").to_owned(),
    });
    let kv_feed = port("endpoint_port_base").map(|port_base| KvFeedEndpoint {
        feed: FeedEndpoint {
            host: host.clone(),
            port_base,
            topic: kv["topic"].as_str().unwrap_or_default().to_owned(),
        },
        replay_port_base: port("replay_endpoint_port_base"),
        block_size: kv["block_size"]
            .as_u64()
            .and_then(|b| u32::try_from(b).ok()),
    });
    ServerInfo {
        role,
        bootstrap_port: info["disaggregation_bootstrap_port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok()),
        dp_size: info["dp_size"]
            .as_u64()
            .and_then(|d| u32::try_from(d).ok())
            .filter(|d| *d > 0),
        load_feed,
        kv_feed,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn engine_urls_are_plain_http_base_urls() {
        assert!(check_engine_url("http://10.0.0.7:30000").is_ok());
        assert!(check_engine_url("http://engine-1:8000/").is_ok());
        assert_eq!(
            check_engine_url("https://e:1").unwrap_err(),
            "must start with http:// (engines are reached over plain HTTP)"
        );
        assert_eq!(
            check_engine_url("http://e:1/v1").unwrap_err(),
            "must be a base URL without a path or query"
        );
        assert!(
            check_engine_url("not a url")
                .unwrap_err()
                .starts_with("not a URL")
        );
    }

    #[test]
    fn engines_are_reached_at_host_and_port() {
        let authority = |url| authority(url).as_deref().map(str::to_owned);
        assert_eq!(
            authority("http://10.0.0.7:30000").as_deref(),
            Some("10.0.0.7:30000")
        );
        assert_eq!(
            authority("http://engine-1/").as_deref(),
            Some("engine-1:80")
        );
        assert_eq!(
            authority("http://[::1]:8000").as_deref(),
            Some("[::1]:8000")
        );
        assert_eq!(authority("not a url"), None);
    }

    #[test]
    fn reads_role_ports_and_the_load_feed_from_server_info() {
        let info = json!({
            "disaggregation_mode": "prefill", "disaggregation_bootstrap_port": 8998, "dp_size": 2,
            "kv_events": {"endpoint_host": "*", "endpoint_port_base": 5557, "replay_endpoint_port_base": 5570,
                          "topic": "kv", "block_size": 32, "load_endpoint_port_base": 5560, "load_topic": "load"}
        });
        let parsed = parse_server_info(&info, "http://10.1.2.3:30000");
        assert_eq!(
            (parsed.role, parsed.bootstrap_port, parsed.dp_size),
            (Some(Role::Prefill), Some(8998), Some(2))
        );
        let feed = parsed.load_feed.unwrap();
        assert_eq!(
            feed.rank_endpoint(1).unwrap(),
            "tcp://10.1.2.3:5561",
            "a wildcard host means the engine's host"
        );
        let kv = parsed.kv_feed.unwrap();
        assert_eq!(
            (
                kv.feed.rank_endpoint(1).unwrap(),
                kv.replay_port_base,
                kv.feed.topic.as_str(),
                kv.block_size
            ),
            ("tcp://10.1.2.3:5558".to_owned(), Some(5570), "kv", Some(32))
        );
        let plain = parse_server_info(
            &json!({"disaggregation_mode": "null", "kv_events": null}),
            "http://h:1",
        );
        assert_eq!((plain.role, plain.load_feed), (Some(Role::Plain), None));
        assert_eq!(
            parse_server_info(&json!({}), "http://h:1"),
            ServerInfo::default(),
            "vLLM has no /server_info fields"
        );
    }
}
