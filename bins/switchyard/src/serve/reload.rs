//! Reloading `serve --config FILE`: on SIGHUP, and with `--watch-config` whenever the
//! file's content changes (read every second; a Kubernetes ConfigMap volume swaps
//! the file under its path, which reading it again sees).

use std::sync::Arc;
use std::time::Duration;

use router_http::{AppContext, ConfigError, RouterConfig};
use tokio::signal::unix::Signal;

use super::{ServeArgs, overridden};

/// How often `--watch-config` reads the file.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Reloads the configuration file on each `hangup` (and on change with
/// `--watch-config`) until the task is aborted.
pub(super) async fn run(
    ctx: Arc<AppContext>,
    mut hangup: Signal,
    args: ServeArgs,
    env_token: Option<String>,
) {
    let Some(path) = args.config.clone() else {
        while hangup.recv().await.is_some() {
            tracing::warn!("SIGHUP: nothing to reload (the router was started from fleet flags)");
        }
        return;
    };
    let read = || std::fs::read_to_string(&path);
    let mut last = read().ok();
    let mut tick = tokio::time::interval(WATCH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let text = tokio::select! {
            received = hangup.recv() => {
                if received.is_none() {
                    return;
                }
                tracing::info!(file = %path.display(), "SIGHUP: reloading the configuration");
                read()
            }
            _ = tick.tick(), if args.watch_config => {
                let text = read();
                if text.as_ref().ok() == last.as_ref() {
                    continue;
                }
                tracing::info!(file = %path.display(), "the configuration file changed: reloading it");
                text
            }
        };
        last = text.as_ref().ok().cloned();
        let config = text
            .map_err(|e| ConfigError::at(path.display().to_string(), format_args!("reading: {e}")))
            .and_then(|text| RouterConfig::from_yaml(&text));
        match config {
            Ok(config) => {
                let config = overridden(config, &args, env_token.clone());
                drop(ctx.reload(config).await);
            }
            Err(e) => drop(ctx.refuse_reload(vec![e])),
        }
    }
}
