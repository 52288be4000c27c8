//! A simulated inference engine that behaves like an SGLang server under load.
//!
//! Real engines are not available where Switchyard is tested and demonstrated, so
//! this crate plays the other side of the wire. It is written from the engines'
//! published protocols, never from the router's code, and depends on no router crate:
//! a shared misunderstanding could otherwise pass every test. The timing model is the
//! part a router notices: requests queue behind `max_running_requests`, prefill takes
//! prompt tokens over the prefill rate, decode emits at the decode rate, and the engine
//! reports its queues as the SGLang `LoadStat` gauge.
//!
//! ```
//! use engine_sim::{EngineSpec, SimEngine};
//!
//! let engine = SimEngine::new(EngineSpec { max_running_requests: 1, ..EngineSpec::default() });
//! # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build()?.block_on(async {
//! let served = engine.serve(20_000, 100).await;
//! // 20,000 prompt tokens at the default 40,000 tokens/s take half a second to prefill.
//! assert_eq!(served.time_to_first_token.as_millis(), 500);
//! assert_eq!(engine.load().running_requests, 0);
//! # });
//! # Ok::<(), std::io::Error>(())
//! ```

mod engine;
mod load_stat;

pub use engine::{EngineSpec, LoadSample, Served, SimEngine};
pub use load_stat::encode_load_stat;
