//! The integration tests of engine-sim, one module a subject, linked into one test binary
//! (a binary each would link the dependency tree once per file).

mod common;

mod faults;
mod fleet;
mod http;
mod pd;
mod zmq;
