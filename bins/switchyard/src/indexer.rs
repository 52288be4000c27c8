//! `switchyard indexer`: the prefix index shared by router replicas, as a process.
//! It reloads its file as `serve` does (SIGHUP, `--watch-config`) and takes the
//! admin token from `SWITCHYARD_ADMIN_TOKEN` when the file gives none.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use router_config::RouterConfig;
use router_http::file::{MAX_CONFIG_BYTES, Snapshot, read_regular};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

use crate::serve::reload::{self, File};
use crate::serve::{ADMIN_TOKEN_ENV, admin_token_from_env};

/// Options of `switchyard indexer`.
#[derive(Debug, clap::Args)]
pub(crate) struct IndexerArgs {
    /// The routers' YAML configuration file: its cache-aware models' engines are
    /// followed (SIGHUP reloads it, as it reloads a router), and lookups must carry
    /// the token of its `prefix_indexer` section when it names one.
    #[arg(long)]
    config: PathBuf,
    /// Reload the configuration file when its content changes (read every second),
    /// as on SIGHUP.
    #[arg(long)]
    watch_config: bool,
    /// A reload takes the file once two reads this many milliseconds apart agree
    /// (10 to 60000; it gives up after ten rereads); a file that does more than add
    /// models or engines must then stay unchanged ten times as long.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    config_settle_ms: u64,
    /// Address to serve lookups (and the admin API, with `--admin`) on: one only the
    /// routers reach (without a token, anyone who reaches it learns which prompts'
    /// prefixes the engines hold).
    #[arg(long, default_value = "127.0.0.1:30100")]
    listen: SocketAddr,
    /// Serve the routers' engine admin API (`/workers`) on `--listen`, under the
    /// file's admin token (or `SWITCHYARD_ADMIN_TOKEN`); without it `/workers` is
    /// off (403) whatever the file says, as the routers' token is theirs.
    #[arg(long)]
    admin: bool,
}

/// The file as the indexer takes it: the admin token kept only with `--admin`.
fn admin_of(mut config: RouterConfig, admin: bool, env_token: Option<String>) -> RouterConfig {
    if admin {
        return admin_token_from_env(config, env_token);
    }
    config.admin.token = None;
    config.admin.token_file = None;
    config
}

pub(crate) fn run(args: &IndexerArgs) -> anyhow::Result<()> {
    let env_token = std::env::var(ADMIN_TOKEN_ENV).ok();
    // Read before the configuration is, so `--watch-config` sees any change after.
    let started_from = read_regular(&args.config, MAX_CONFIG_BYTES)
        .ok()
        .map(Snapshot::into_text);
    let admin = args.admin;
    let config = admin_of(crate::serve::load(&args.config)?, admin, env_token.clone());
    let running = config.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let served = runtime.block_on(async {
        // Listening for SIGHUP before startup, so no signal sent meanwhile ends the
        // process; one received during startup reloads the file once it is done.
        let hangup = signal(SignalKind::hangup()).context("listening for SIGHUP")?;
        let indexer = router_http::start_indexer(config, args.listen)
            .await
            .context("starting the indexer")?;
        let file = File {
            path: Some(args.config.clone()),
            watch: args.watch_config,
            settle: Duration::from_millis(args.config_settle_ms),
        };
        let reloads = tokio::spawn(reload::run(
            Arc::clone(indexer.context()),
            hangup,
            running,
            started_from,
            file,
            move |config| admin_of(config, admin, env_token.clone()),
        ));
        println!("{}", json!({"event": "ready", "addr": indexer.addr()}));
        crate::sim_engine::shutdown_signal().await;
        reloads.abort();
        indexer.shutdown().await;
        anyhow::Ok(())
    });
    // What still runs on a blocking thread is a reload's read or check, which no one
    // waits for: the process does not either.
    runtime.shutdown_background();
    served
}
