//! Reloading `serve --config FILE` (and `indexer --config FILE`): on SIGHUP, and with `--watch-config` whenever the
//! file differs from what was last read (read every second; a Kubernetes ConfigMap
//! volume swaps the file under its path, which reading it again sees).
//!
//! Either way the file is taken only once whole: two reads `--config-settle-ms` apart
//! must agree on its length, modification time and text. A file that does more than
//! add models or engines to the configuration in force (a file cut short by a
//! writer's pause names fewer, or cuts a value) must then stay unchanged for ten more
//! intervals (5 s at the default) before it is applied; one that changes in that time
//! is read through again, three times at most. A file
//! still changing after ten reads, or one that cannot be read (missing, not a
//! regular file, over 1 MiB), is refused and the old configuration keeps serving.
//! Every read runs on a blocking thread, never on the runtime's workers, and a FIFO
//! or a device at the path is refused without waiting for a writer.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use router_config::RouterConfig;
use router_http::file::{
    self, MAX_CONFIG_BYTES, ReadError, Settle, SettleError, Snapshot, settled, unchanged,
};
use router_http::{AppContext, ConfigError, IndexerContext, ReloadError, ReloadSummary};
use tokio::signal::unix::Signal;

/// How often `--watch-config` reads the file.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The settle intervals a file that does more than add must stay unchanged.
const HOLD: u32 = 10;

/// The times such a file is read through again when it changed during its hold.
const HOLD_TRIES: u32 = 3;

/// What a read of the file found, as the watcher compares it: its text, or why it
/// could not be read.
type Seen = Result<String, String>;

/// What a reload is applied to: a router, or an indexer.
pub(crate) trait Reloadable: Send + Sync + 'static {
    /// Applies `config` in place of the running one.
    fn reload(
        &self,
        config: RouterConfig,
    ) -> impl Future<Output = Result<ReloadSummary, ReloadError>> + Send;

    /// Counts and logs a reload refused before it reached the target.
    fn refuse_reload(&self, refused: ReloadError) -> ReloadError;
}

impl Reloadable for AppContext {
    fn reload(
        &self,
        config: RouterConfig,
    ) -> impl Future<Output = Result<ReloadSummary, ReloadError>> + Send {
        AppContext::reload(self, config)
    }

    fn refuse_reload(&self, refused: ReloadError) -> ReloadError {
        AppContext::refuse_reload(self, refused)
    }
}

impl Reloadable for IndexerContext {
    fn reload(
        &self,
        config: RouterConfig,
    ) -> impl Future<Output = Result<ReloadSummary, ReloadError>> + Send {
        IndexerContext::reload(self, config)
    }

    fn refuse_reload(&self, refused: ReloadError) -> ReloadError {
        IndexerContext::refuse_reload(self, refused)
    }
}

/// The configuration file and how it is reloaded.
#[derive(Debug, Clone)]
pub(crate) struct File {
    /// The file; `None` for a router started from fleet flags.
    pub(crate) path: Option<PathBuf>,
    /// Whether a change of its content reloads it (`--watch-config`).
    pub(crate) watch: bool,
    /// The interval two reads that agree must be apart (`--config-settle-ms`).
    pub(crate) settle: Duration,
}

/// Reloads `file` into `target` on each `hangup` (and with `file.watch`, when what
/// it holds differs from `started_from`, the text startup read, or from what the
/// last reload read) until the task is aborted. `running` is the configuration
/// startup applied; `overridden` applies the command line and environment to each
/// configuration read.
pub(crate) async fn run<T: Reloadable>(
    target: Arc<T>,
    mut hangup: Signal,
    mut running: RouterConfig,
    started_from: Option<String>,
    file: File,
    overridden: impl Fn(RouterConfig) -> RouterConfig + Send,
) {
    let Some(path) = file.path else {
        while hangup.recv().await.is_some() {
            tracing::warn!("SIGHUP: nothing to reload (the router was started from fleet flags)");
        }
        return;
    };
    let settle = Settle::every(file.settle);
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
            _ = tick.tick(), if file.watch => {
                let now = seen(read(path.clone()).await);
                if last.as_ref() == Some(&now) {
                    continue;
                }
                tracing::info!(file = %path.display(), "the configuration file changed: reloading it");
            }
        }
        let (seen, taken) = take(
            &path,
            settle,
            || read(path.clone()),
            |next: &RouterConfig| only_adds(&running, next),
            &overridden,
        )
        .await;
        last = seen;
        match taken {
            Ok(config) => {
                if target.reload(config.clone()).await.is_ok() {
                    running = config;
                }
            }
            Err(refused) => drop(target.refuse_reload(refused)),
        }
    }
}

/// One read of the configuration file, off the runtime.
async fn read(path: PathBuf) -> Result<Snapshot, ReadError> {
    file::read_regular_off_runtime(path, MAX_CONFIG_BYTES).await
}

fn seen(read: Result<Snapshot, ReadError>) -> Seen {
    read.map(Snapshot::into_text).map_err(|e| e.to_string())
}

/// The configuration the file at `path` holds once whole (see the module
/// documentation), or why it is refused; with what was read of it, for the watcher
/// (`None`: read it through again at the next tick, whatever it holds then). `read`
/// reads the file; `safe` says whether a configuration may be applied without the
/// hold; `overridden` applies the command line to it.
async fn take<R, F>(
    path: &Path,
    settle: Settle,
    mut read: R,
    safe: impl Fn(&RouterConfig) -> bool,
    overridden: impl Fn(RouterConfig) -> RouterConfig,
) -> (Option<Seen>, Result<RouterConfig, ReloadError>)
where
    R: FnMut() -> F,
    F: Future<Output = Result<Snapshot, ReadError>>,
{
    let unreadable =
        |e: SettleError| ReloadError::Unreadable(ConfigError::at(path.display().to_string(), e));
    let hold = settle.interval * HOLD;
    for _ in 0..HOLD_TRIES {
        let snapshot = match settled(settle, &mut read).await {
            Ok(snapshot) => snapshot,
            Err(SettleError::Read(e)) => {
                return (Some(Err(e.to_string())), Err(unreadable(e.into())));
            }
            Err(e) => return (None, Err(unreadable(e))),
        };
        let seen = Some(Ok(snapshot.text().to_owned()));
        let config = match RouterConfig::from_yaml(snapshot.text()) {
            Ok(config) => overridden(config),
            Err(e) => return (seen, Err(ReloadError::Invalid(vec![e]))),
        };
        if safe(&config) {
            return (seen, Ok(config));
        }
        tracing::info!(file = %path.display(), ?hold, "the file does more than add models or engines: it is applied once unchanged this long");
        match unchanged(&snapshot, settle.interval, HOLD, &mut read).await {
            Ok(true) => return (seen, Ok(config)),
            Ok(false) => {
                tracing::info!(file = %path.display(), "the file changed during its hold: reading it through again")
            }
            Err(e) => return (Some(Err(e.to_string())), Err(unreadable(e.into()))),
        }
    }
    let unsettled = SettleError::Unheld {
        tries: HOLD_TRIES,
        hold,
    };
    (None, Err(unreadable(unsettled)))
}

/// Whether `next` only adds models or engines to `running`: with those taken out, it
/// is `running`.
fn only_adds(running: &RouterConfig, next: &RouterConfig) -> bool {
    let before: HashMap<&str, HashSet<&str>> = (running.models.iter())
        .map(|m| {
            (
                m.id.as_str(),
                m.engines.iter().map(|e| e.id.as_str()).collect(),
            )
        })
        .collect();
    let mut kept = next.clone();
    kept.models.retain_mut(|model| {
        let Some(engines) = before.get(model.id.as_str()) else {
            return false;
        };
        model.engines.retain(|e| engines.contains(e.id.as_str()));
        true
    });
    kept == *running
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use parking_lot::Mutex;
    use tokio::time::Instant;

    use super::*;

    const WHOLE: &str = "models:\n  - id: m\n    engines:\n      - {id: A, url: 'http://127.0.0.1:1'}\n      - {id: B, url: 'http://127.0.0.1:2'}\n";
    /// The same file cut short after its first engine: it would remove `B`.
    const HALF: &str =
        "models:\n  - id: m\n    engines:\n      - {id: A, url: 'http://127.0.0.1:1'}\n";

    /// A configuration file its writer fills in steps: each text lands at its time.
    struct Written {
        path: PathBuf,
        steps: Mutex<Vec<(Duration, &'static str)>>,
        start: Instant,
    }

    impl Written {
        fn new(name: &str, steps: &[(u64, &'static str)]) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("switchyard-reload-{}-{name}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let mut steps: Vec<_> = (steps.iter().rev())
                .map(|&(ms, text)| (Duration::from_millis(ms), text))
                .collect();
            let path = dir.join("config.yaml");
            std::fs::write(&path, steps.pop().expect("a first text").1).unwrap();
            Self {
                path,
                steps: Mutex::new(steps),
                start: Instant::now(),
            }
        }

        /// Reads the file as it is now, after what the writer wrote by now.
        fn read(&self) -> impl Future<Output = Result<Snapshot, ReadError>> + use<> {
            let mut steps = self.steps.lock();
            while steps
                .last()
                .is_some_and(|(at, _)| *at <= self.start.elapsed())
            {
                let (_, text) = steps.pop().expect("a step");
                std::fs::write(&self.path, text).unwrap();
            }
            read(self.path.clone())
        }

        async fn take(&self) -> (Option<Seen>, Result<RouterConfig, ReloadError>) {
            take(
                &self.path,
                Settle::default(),
                || self.read(),
                |config: &RouterConfig| config.models[0].engines.len() == 2,
                |config| config,
            )
            .await
        }
    }

    impl Drop for Written {
        fn drop(&mut self) {
            drop(std::fs::remove_dir_all(self.path.parent().expect("a dir")));
        }
    }

    fn engines(taken: &Result<RouterConfig, ReloadError>) -> Vec<String> {
        let config = taken.as_ref().expect("taken");
        (config.models[0].engines.iter())
            .map(|e| e.id.clone())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_file_cut_short_by_a_three_second_pause_is_never_applied() {
        let file = Written::new("pause", &[(0, HALF), (3_000, WHOLE)]);
        let (seen, taken) = file.take().await;
        assert_eq!(engines(&taken), ["A", "B"], "the whole file, not its half");
        assert_eq!(seen, Some(Ok(WHOLE.to_owned())));
        // Half settled at 0.5 s; its hold saw the rest at 3 s; the whole settled at 3.5 s.
        assert_eq!(file.start.elapsed(), Duration::from_millis(3_500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_file_that_removes_an_engine_is_applied_once_unchanged_for_the_hold() {
        let file = Written::new("removes", &[(0, HALF)]);
        let (_, taken) = file.take().await;
        assert_eq!(engines(&taken), ["A"]);
        assert_eq!(file.start.elapsed(), Duration::from_millis(500 + 5_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_file_that_removes_nothing_is_applied_once_settled() {
        let file = Written::new("adds", &[(0, WHOLE)]);
        let (_, taken) = file.take().await;
        assert_eq!(engines(&taken), ["A", "B"]);
        assert_eq!(file.start.elapsed(), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_removal_that_keeps_changing_during_its_hold_is_refused() {
        // Each settles, then changes again two seconds into its hold.
        let steps: Vec<_> = (0..8)
            .map(|n| (n * 2_600, if n % 2 == 0 { HALF } else { HALF.trim_end() }))
            .collect();
        let file = Written::new("churn", &steps);
        let (seen, taken) = file.take().await;
        assert_eq!(seen, None, "read through again at the next tick");
        let refused = taken.expect_err("refused").to_string();
        assert!(
            refused.ends_with("changed again within 5s of being read, 3 times (a file that does more than add models or engines must stay unchanged that long): write the file beside and rename it over"),
            "{refused}"
        );
    }

    #[test]
    fn only_added_models_and_engines_skip_the_hold() {
        let config = |text: &str| RouterConfig::from_yaml(text).expect("a configuration");
        let running = config(HALF);
        assert!(only_adds(&running, &running));
        assert!(only_adds(&running, &config(WHOLE)), "engine B added");
        let model =
            format!("{WHOLE}  - id: k\n    engines: [{{id: C, url: 'http://127.0.0.1:3'}}]\n");
        assert!(only_adds(&running, &config(&model)), "model k added");
        assert!(!only_adds(&config(WHOLE), &running), "B removed");
        let cut = HALF.replace("127.0.0.1:1", "127.0.0.1");
        assert!(!only_adds(&running, &config(&cut)), "A's url cut short");
        let paged = format!("{HALF}    block_size: 7\n");
        assert!(!only_adds(&running, &config(&paged)), "the page size set");
        assert!(!only_adds(&config(&paged), &running), "the page size gone");
    }
}
