//! `switchyard indexer`: the prefix index shared by router replicas, as a process.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context;
use serde_json::json;

/// Options of `switchyard indexer`.
#[derive(Debug, clap::Args)]
pub(crate) struct IndexerArgs {
    /// The routers' YAML configuration file: its cache-aware models' engines are
    /// followed; its `listen` is the indexer's address unless overridden.
    #[arg(long)]
    config: PathBuf,
    /// Address to listen on (overrides the file's `listen`).
    #[arg(long)]
    host: Option<IpAddr>,
    /// Port to listen on (overrides the file's `listen`).
    #[arg(long)]
    port: Option<u16>,
}

pub(crate) fn run(args: &IndexerArgs) -> anyhow::Result<()> {
    let mut config = crate::serve::load(&args.config)?;
    if args.host.is_some() || args.port.is_some() {
        config.listen = SocketAddr::new(
            args.host.unwrap_or(config.listen.ip()),
            args.port.unwrap_or(config.listen.port()),
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let indexer = router_http::start_indexer(config)
            .await
            .context("starting the indexer")?;
        println!("{}", json!({"event": "ready", "addr": indexer.addr()}));
        crate::sim_engine::shutdown_signal().await;
        indexer.shutdown().await;
        anyhow::Ok(())
    })
}
