//! The integration tests of router-buckets, one module a subject, linked into one test binary
//! (a binary each would link the dependency tree once per file).

mod common;

mod config;
mod pairing;
mod reservation;
mod resolver;
mod selection;
mod shadow;
mod slo;
