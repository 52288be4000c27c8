//! `switchyard indexer`: the prefix index shared by router replicas, as a process.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

/// Options of `switchyard indexer`.
#[derive(Debug, clap::Args)]
pub(crate) struct IndexerArgs {
    /// The routers' YAML configuration file: its cache-aware models' engines are
    /// followed (those it names at startup), and lookups must carry the token of its
    /// `prefix_indexer` section when it names one.
    #[arg(long)]
    config: PathBuf,
    /// Address to serve lookups on: one only the routers reach (without a token,
    /// anyone who reaches it learns which prompts' prefixes the engines hold).
    #[arg(long, default_value = "127.0.0.1:30100")]
    listen: SocketAddr,
}

pub(crate) fn run(args: &IndexerArgs) -> anyhow::Result<()> {
    let config = crate::serve::load(&args.config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        // SIGHUP reloads a router; the indexer says it does not instead of ending.
        let mut hangup = signal(SignalKind::hangup()).context("listening for SIGHUP")?;
        let indexer = router_http::start_indexer(config, args.listen)
            .await
            .context("starting the indexer")?;
        println!("{}", json!({"event": "ready", "addr": indexer.addr()}));
        let shutdown = crate::sim_engine::shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = hangup.recv() => tracing::warn!("SIGHUP: the indexer does not reload its file; restart it to follow engines added since it started"),
            }
        }
        indexer.shutdown().await;
        anyhow::Ok(())
    })
}
