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
//! The feature `server` (on by default) adds the engine as a server: `start` runs it
//! from a `SimConfig`, with its HTTP surface and ZeroMQ feeds. Without it the crate is
//! the engine model alone (scheduling and timing, the prefix cache, the KV-event and
//! `LoadStat` encodings), which `router-replay` steps on its virtual clock.

mod cache;
mod engine;
mod events;
mod faults;
mod load_stat;
#[cfg(feature = "server")]
mod server;

pub use cache::{CacheChange, PageKey, PrefixCache, extend_page_keys, page_keys};
pub use engine::{EngineSpec, LoadSample, Run, Served, SimEngine};
pub use events::{EventForm, KvEvent, Medium, encode_batch};
pub use faults::FaultConfig;
pub use load_stat::{
    LOAD_REPUBLISH, LOAD_TICK, LoadForm, encode_basic_load_stat, encode_load_stat,
};
#[cfg(feature = "server")]
pub use server::{
    BindError, BoundPorts, EngineRole, FleetConfig, MAX_ENGINES, PdProtocol, RunningEngine,
    SimConfig, StartError, TokenizerError, Visits, free_port_ranges, start, start_fleet,
};
