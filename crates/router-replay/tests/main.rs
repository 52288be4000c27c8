//! The integration tests of router-replay, one module a subject, linked into one test
//! binary.

mod common;

mod closed_loop;
mod replay;
mod shapes;
mod siblings;
mod trace;
mod workload;
