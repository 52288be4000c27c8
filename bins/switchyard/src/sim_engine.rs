//! `switchyard sim-engine`: one simulated engine until SIGINT or SIGTERM.

use std::io::Write;

use anyhow::Context;

pub(crate) fn run(config: engine_sim::SimConfig) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let engine = engine_sim::start(config)
            .await
            .context("starting the simulated engine")?;
        let ready = serde_json::json!({"event": "ready", "ports": engine.ports()});
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{ready}")?;
        stdout.flush()?;
        drop(stdout);
        shutdown_signal().await;
        engine.shutdown().await;
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
