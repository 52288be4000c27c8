//! The integration tests of router-http, one module a subject, linked into one test binary
//! (a binary each would link the dependency tree once per file).

mod common;
#[path = "../../../tests/python_env.rs"]
mod python_env;

mod admin;
mod affinity;
mod cache_aware;
mod clients;
mod decisions;
mod endpoints;
mod explain;
mod failures;
mod flow;
mod indexer;
mod indexer_follows;
mod lora;
mod pairing;
#[cfg(feature = "picker")]
mod picker;
mod ranks;
mod regret;
mod reload;
mod retries;
mod serving;
mod slo;
mod spans;
mod tls;
mod tool_sessions;
mod trace;
mod usage;
mod vllm;
