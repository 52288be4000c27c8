//! The integration tests of switchyard, one module a subject, linked into one test binary
//! (a binary each would link the dependency tree once per file).

mod common;

mod cli;
mod dashboards;
mod demo;
mod indexer;
mod indexer_failover;
mod kubernetes;
mod manifests;
mod reload;
mod replay;
mod replicas;
mod workloads;
