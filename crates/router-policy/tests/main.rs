//! The integration tests of router-policy, one module a subject, linked into one test binary
//! (a binary each would link the dependency tree once per file).

mod common;

mod affinity;
mod cache_aware;
mod errors;
mod explain;
mod policies;
mod properties;
mod rendezvous;
mod routed_pages;
mod score;
mod window;
