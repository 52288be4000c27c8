//! Reloading `serve --config FILE`: on SIGHUP, and with `--watch-config` whenever the
//! file's content changes (read every second, reloaded once two reads in a row
//! agree; a Kubernetes ConfigMap volume swaps the file under its path, which reading
//! it again sees). A file that cannot be read is no change to reload.

use std::sync::Arc;
use std::time::Duration;

use router_config::RouterConfig;
use router_http::{AppContext, ConfigError};
use tokio::signal::unix::Signal;

use super::{ServeArgs, overridden};

/// How often `--watch-config` reads the file.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Reloads the configuration file on each `hangup` (and with `--watch-config`, when
/// its content differs from `started_from`, the text startup read, or from the last
/// text reloaded) until the task is aborted.
pub(super) async fn run(
    ctx: Arc<AppContext>,
    mut hangup: Signal,
    started_from: Option<String>,
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
    let mut last = started_from;
    // A changed text is reloaded once two reads in a row agree, so a file being
    // written in place is not read half-way.
    let mut seen: Option<String> = None;
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
                let text = read().ok();
                if text.is_none() || text == last {
                    seen = None;
                    continue;
                }
                if text != seen {
                    seen = text;
                    continue;
                }
                tracing::info!(file = %path.display(), "the configuration file changed: reloading it");
                seen = None;
                text.ok_or_else(|| std::io::Error::other("the file could not be read"))
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
