//! Switchyard's client to engines: requests relayed to SGLang and vLLM servers, their
//! health probes, what they say about themselves, and the load a vLLM engine's
//! `/metrics` states.
//!
//! The key choice is an HTTP/1.1 client of its own ([`H1Body`]): a response body is
//! read from the engine's socket by the task that relays it, not handed over chunk by
//! chunk from a separate connection task, so each burst of server-sent events costs
//! one read and one write. Keep-alive connections are pooled per engine below the
//! engines' own keep-alive timeout, and a request that was written is never sent
//! twice. Engines at `https://` URLs are reached over TLS (feature `tls`, on by
//! default: rustls with its `ring` provider, [`EngineTls`]), the handshake within
//! the connect timeout. This crate knows nothing of policies, buckets, the fleet or
//! the router's HTTP server; its protocol code has its own fuzz targets (`fuzz/`,
//! `h1_response` and `h1_exchange`).
//!
//! ```no_run
//! use std::time::Duration;
//! use router_upstream::{Origin, Upstream, UpstreamTimeouts};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let upstream = Upstream::new(UpstreamTimeouts {
//!     connect: Duration::from_secs(2),
//!     first_byte: Duration::from_secs(300),
//!     pool_idle: Duration::from_secs(4),
//! });
//! let engine = "http://127.0.0.1:30000";
//! if upstream.probe(engine, Duration::from_secs(2)).await {
//!     let info = upstream.server_info(engine).await;
//!     println!("mode: {:?}", info.and_then(|i| i.disaggregation_mode));
//!     let origin = Origin::of(engine).ok_or("not an engine URL")?;
//!     let body = bytes::Bytes::from_static(br#"{"model":"m","prompt":"hi"}"#);
//!     let response = upstream.post(&origin, "/v1/completions", &[], &body).await?;
//!     println!("status {}", response.status());
//! }
//! # Ok(()) }
//! ```

mod client;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod h1;
mod info;
mod metrics_text;
#[cfg(feature = "tls")]
mod tls;
mod url;

pub use client::{Upstream, UpstreamError, UpstreamTimeouts};
pub use h1::{H1Body, H1Error};
pub use info::{
    DisaggregationMode, FeedEndpoint, HandOver, KvFeedEndpoint, ServerInfo, parse_server_info,
};
pub use metrics_text::{ScrapedRank, parse_load_metrics};
#[cfg(feature = "tls")]
pub use tls::{EngineTls, MAX_PEM_BYTES, TlsError, TlsFile, TlsFiles};
pub use url::{EngineUrlError, Origin, check_engine_url, url_host};
