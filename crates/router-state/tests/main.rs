//! The integration tests of router-state, one module a subject, linked into one test binary
//! (a binary each would link the dependency tree once per file).

#[path = "../../../tests/python_env.rs"]
#[cfg(feature = "zmq")]
mod python_env;

mod fuzz_corpus;
#[cfg(feature = "zmq")]
mod hostile_feed;
#[cfg(feature = "zmq")]
mod kv_feed;
#[cfg(feature = "zmq")]
mod load_feed;
#[cfg(feature = "zmq")]
mod real_publishers;
