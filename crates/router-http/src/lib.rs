//! The Switchyard HTTP router: OpenAI-compatible chat in, the engine (or prefill and
//! decode pair) that will serve it best out.
//!
//! A request is prepared once, as its endpoint reads it (validation, tokenization,
//! expected peak), then the model's [`BucketResolver`](router_buckets::BucketResolver)
//! runs the bucket loop over the fleet's engine snapshot; only a complete selection
//! is dispatched, holding one in-flight guard per engine actually sent to, and the
//! engine's answer is relayed frame by frame. The engines themselves (registration,
//! feeds, health) belong to [`router_fleet::Fleet`], reached through
//! [`router_upstream`]; this crate holds the HTTP API, the routing tables, dispatch,
//! metrics and the configuration, and is the only library crate with an HTTP server.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = router_config::RouterConfig::from_yaml(r#"
//! listen: 127.0.0.1:8080
//! models:
//!   - id: chat-model
//!     engines:
//!       - {id: A1, url: "http://127.0.0.1:31011", role: plain}
//!       - {id: A2, url: "http://127.0.0.1:31012", role: plain}
//! "#)?;
//! let router = router_http::start(config).await?;
//! println!("serving on {}", router.addr());
//! router.shutdown().await;
//! # Ok(()) }
//! ```

mod access;
mod api;
mod app;
mod attempts;
#[cfg(feature = "bench-kit")]
pub mod bench_kit;
mod budget;
mod connections;
mod decisions;
mod dispatch;
mod error;
mod explanation;
pub mod file;
mod flow;
mod indexer;
mod metrics;
mod prepare;
mod relay;
mod reload;
mod retries;
mod retry_after;
mod routing;
mod server;
mod share;
mod spans;
mod trace;
mod validated;

pub use api::MAX_BODY_BYTES;
pub use app::{AppContext, StartError};
pub use connections::PROBE_SLOTS;
pub use error::ApiError;
pub use indexer::{IndexerContext, RunningIndexer, start_indexer};
pub use prepare::prompt_ids;
pub use reload::{ReloadError, ReloadSummary};
pub use router_config::ConfigError;
pub use server::{RunningRouter, start, start_validated};
pub use validated::ValidatedConfig;
