//! A simulated inference engine that the router cannot tell from a real SGLang server.
//!
//! Real engines are not available where Switchyard is tested and demonstrated, so
//! this crate plays the other side of the wire. It is written from the engines'
//! published protocols, never from the router's code, and depends on no router crate:
//! a shared misunderstanding could otherwise pass every test. It speaks the OpenAI chat
//! API (JSON and SSE), `/server_info`, `/metrics` and `/flush_cache`; publishes KV-cache
//! events and the `LoadStat` gauge over ZeroMQ per data-parallel rank with replay;
//! hands prompts from prefill to decode engines through bootstrap rooms (SGLang) or
//! `kv_transfer_params` (vLLM's NIXL connector); and models a
//! paged prefix cache and a scheduler, so time to first token depends on cache hits
//! and load as on a real engine. Faults can be switched on by flag or at runtime.
//!
//! ```
//! use engine_sim::{EngineSpec, SimEngine};
//!
//! let engine = SimEngine::new(EngineSpec { page_size: 16, ..EngineSpec::default() });
//! # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build()?.block_on(async {
//! let prompt: Vec<u32> = (0..20_000).collect();
//! let first = engine.serve(prompt.clone(), 100).await;
//! let second = engine.serve(prompt, 100).await;
//! // 20,000 prompt tokens at the default 40,000 tokens/s take half a second to prefill;
//! // the second time every full page is cached.
//! assert_eq!(first.time_to_first_token.as_millis(), 500);
//! assert_eq!(second.cached_tokens, 20_000);
//! # });
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! [`start`] runs the full engine (HTTP and ZeroMQ) from a [`SimConfig`].

mod bootstrap;
mod cache;
mod chat;
mod config;
mod embeddings;
mod engine;
mod events;
mod faults;
mod load_stat;
mod nixl;
mod placement;
mod ports;
mod publish;
mod server;
mod tokenizer;
mod visits;

pub use cache::{CacheChange, PageKey, PrefixCache, extend_page_keys, page_keys};
pub use config::{EngineRole, EventForm, LoadForm, PdProtocol, SimConfig};
pub use engine::{EngineSpec, LoadSample, Run, Served, SimEngine};
pub use events::{KvEvent, Medium, encode_batch};
pub use faults::FaultConfig;
pub use load_stat::{encode_basic_load_stat, encode_load_stat};
pub use ports::free_port_ranges;
pub use publish::{BindError, LOAD_REPUBLISH, LOAD_TICK};
pub use server::{BoundPorts, RunningEngine, StartError, start};
pub use tokenizer::TokenizerError;
pub use visits::Visits;
