//! Reloading `serve --config FILE`: on SIGHUP, and with `--watch-config` whenever the
//! file differs from what was last read (read every second; a Kubernetes ConfigMap
//! volume swaps the file under its path, which reading it again sees).
//!
//! Either way the file is taken only once whole: two reads `--config-settle-ms` apart
//! must agree on its length, modification time and text. A file still changing after
//! ten such reads, or one that cannot be read (missing, not a regular file, over
//! 1 MiB), is refused and the old configuration keeps serving. Every read runs on a
//! blocking thread, never on the runtime's workers, and a FIFO or a device at the path
//! is refused without waiting for a writer.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use router_config::RouterConfig;
use router_http::file::{
    self, MAX_CONFIG_BYTES, ReadError, Settle, SettleError, Snapshot, settled,
};
use router_http::{AppContext, ConfigError, ReloadError};
use tokio::signal::unix::Signal;

use super::{ServeArgs, overridden};

/// How often `--watch-config` reads the file.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// What a read of the file found, as the watcher compares it: its text, or why it
/// could not be read.
type Seen = Result<String, String>;

/// Reloads the configuration file on each `hangup` (and with `--watch-config`, when
/// what it holds differs from `started_from`, the text startup read, or from what the
/// last reload read) until the task is aborted.
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
    let settle = Settle::every(Duration::from_millis(args.config_settle_ms));
    // `None`: not known, so the watcher reads the file through at its next tick.
    let mut last: Option<Seen> = started_from.map(Ok);
    let mut tick = tokio::time::interval(WATCH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            received = hangup.recv() => {
                if received.is_none() {
                    return;
                }
                tracing::info!(file = %path.display(), "SIGHUP: reloading the configuration");
            }
            _ = tick.tick(), if args.watch_config => {
                let now = seen(read(path.clone()).await);
                if last.as_ref() == Some(&now) {
                    continue;
                }
                tracing::info!(file = %path.display(), "the configuration file changed: reloading it");
            }
        }
        let taken = settled(settle, || read(path.clone())).await;
        last = match &taken {
            Ok(snapshot) => Some(Ok(snapshot.text().to_owned())),
            Err(SettleError::Read(e)) => Some(Err(e.to_string())),
            // Read through again at the next tick, whatever it holds then.
            Err(_) => None,
        };
        reload(&ctx, &path, taken, &args, env_token.clone()).await;
    }
}

/// One read of the configuration file, off the runtime.
async fn read(path: PathBuf) -> Result<Snapshot, ReadError> {
    file::read_regular_off_runtime(path, MAX_CONFIG_BYTES).await
}

fn seen(read: Result<Snapshot, ReadError>) -> Seen {
    read.map(Snapshot::into_text).map_err(|e| e.to_string())
}

/// Reloads what `taken` read of the file at `path`, or counts and logs why not.
async fn reload(
    ctx: &AppContext,
    path: &Path,
    taken: Result<Snapshot, SettleError>,
    args: &ServeArgs,
    env_token: Option<String>,
) {
    let text = match taken {
        Ok(snapshot) => snapshot.into_text(),
        Err(e) => {
            let error = ConfigError::at(path.display().to_string(), e);
            drop(ctx.refuse_reload(ReloadError::Unreadable(error)));
            return;
        }
    };
    match RouterConfig::from_yaml(&text) {
        Ok(config) => drop(ctx.reload(overridden(config, args, env_token)).await),
        Err(e) => drop(ctx.refuse_reload(ReloadError::Invalid(vec![e]))),
    }
}
