//! The simulated engine as a server (feature `server`): the HTTP surface, the ZeroMQ
//! publishers, the prefill/decode hand-over, tokenization, the faults it acts on and
//! the `switchyard sim-engine` settings, around the engine model.
//!
//! `fleet` starts several engines in one process. Imports run one way. `launch` binds the sockets and serves the route table
//! (`routes`), which names the handlers, one module a surface: `chat` (with
//! `placement` and `nixl`), `embeddings`, `info`, `metrics` and `admin`. Every handler
//! reads `state`, which imports no handler.

mod admin;
mod bootstrap;
mod chat;
mod config;
mod embeddings;
mod error;
mod faults;
mod fleet;
mod info;
mod launch;
mod listener;
mod metrics;
mod nixl;
mod placement;
mod ports;
mod publish;
mod routes;
mod running;
mod state;
mod tokenizer;
mod visits;

pub use config::{EngineRole, PdProtocol, SimConfig};
pub use fleet::{FleetConfig, MAX_ENGINES, start_fleet};
pub use launch::{StartError, start};
pub use ports::free_port_ranges;
pub use publish::BindError;
pub use running::{BoundPorts, RunningEngine};
pub use tokenizer::TokenizerError;
pub use visits::Visits;
