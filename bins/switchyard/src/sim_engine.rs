//! `switchyard sim-engine`: simulated engines until SIGINT or SIGTERM.

use std::io::Write;

use anyhow::Context;

/// Starts every engine of `config` and prints one JSON line once all serve: the
/// first engine's ports as `ports`, every engine's as `engines`.
pub(crate) fn run(config: engine_sim::FleetConfig) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let engines = engine_sim::start_fleet(&config)
            .await
            .context("starting the simulated engines")?;
        let ports: Vec<_> = engines.iter().map(|e| e.ports()).collect();
        let ready = serde_json::json!({"event": "ready", "ports": ports[0], "engines": ports});
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{ready}")?;
        stdout.flush()?;
        drop(stdout);
        shutdown_signal().await;
        for engine in engines {
            engine.shutdown().await;
        }
        Ok(())
    })
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => drop(signal.recv().await),
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
