//! The integration tests of router-policy, one module a subject, linked into one test binary
//! (a binary each would link the dependency tree once per file).

mod common;

mod affinity;
mod cache_aware;
mod errors;
mod explain;
mod policies;
// The test kit is the crate's own feature, which its dev-dependency on itself turns on
// here (a published copy of the crate has that only with `--features test-kit`).
#[cfg(feature = "test-kit")]
mod properties;
