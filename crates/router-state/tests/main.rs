//! The integration tests of router-state, one module a subject, linked into one test binary
//! (a binary each would link the dependency tree once per file).

#[path = "../../../tests/python_env.rs"]
mod python_env;

mod fuzz_corpus;
mod hostile_feed;
mod kv_feed;
mod load_feed;
mod real_publishers;
