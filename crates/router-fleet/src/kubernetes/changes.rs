//! Waiting for a change to objects that are read whole again when one changes (an
//! InferencePool, the InferenceObjectives): a watch from the list's resource version
//! until it tells of a change, fails, or it is time to read them again anyway.

use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{Api, DynamicObject, WatchEvent, WatchParams};
use tokio::time::Instant;

use super::{MAX_BACKOFF, WATCH_SECONDS};

/// Why the wait ended.
#[derive(Debug)]
pub(super) enum Wake {
    /// An object changed: read them again.
    Changed,
    /// It is time to read them again anyway.
    Relist,
    /// The watch failed: read them again after a backoff.
    Failed,
}

/// Waits until an object `fields` selects (all, when `None`) changes, the watch
/// fails, or it is `relist_at`. Without a `version` to watch from (the list named
/// none), it waits for `relist_at`. A watch the server ends is resumed from the last
/// version seen, at most once a second. `what` names the objects in the log.
pub(super) async fn changed(
    api: &Api<DynamicObject>,
    fields: Option<&str>,
    version: Option<String>,
    relist_at: Instant,
    what: &str,
) -> Wake {
    let Some(mut version) = version else {
        tokio::time::sleep_until(relist_at).await;
        return Wake::Relist;
    };
    let mut params = WatchParams::default().timeout(WATCH_SECONDS);
    if let Some(fields) = fields {
        params = params.fields(fields);
    }
    loop {
        let started = Instant::now();
        let stream = tokio::select! {
            stream = api.watch(&params, &version) => stream,
            () = tokio::time::sleep_until(relist_at) => return Wake::Relist,
        };
        let Ok(stream) = stream else {
            return Wake::Failed;
        };
        let mut stream = std::pin::pin!(stream);
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                () = tokio::time::sleep_until(relist_at) => return Wake::Relist,
            };
            match event {
                Some(Ok(
                    WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_),
                )) => {
                    return Wake::Changed;
                }
                Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                    version = bookmark.metadata.resource_version;
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    tracing::info!(watched = what, code = status.code, message = %status.message, "the watch ended: reading again");
                    return Wake::Failed;
                }
                Some(Err(e)) => {
                    tracing::info!(watched = what, error = %e, "the watch failed: reading again");
                    return Wake::Failed;
                }
                None => break,
            }
        }
        // Resumed at most once a second, as a pod watch is.
        tokio::time::sleep_until(started + Duration::from_secs(1)).await;
    }
}

/// Waits as `wake` says before the objects are read again: `backoff` after a failed
/// watch (doubled for the next, to [`MAX_BACKOFF`]), `settle` after a change (so a
/// burst is read once); `backoff` starts over unless the watch failed.
pub(super) async fn pause(wake: Wake, backoff: &mut Duration, settle: Duration) {
    match wake {
        Wake::Failed => {
            tokio::time::sleep(*backoff).await;
            *backoff = (*backoff * 2).min(MAX_BACKOFF);
        }
        Wake::Changed => {
            tokio::time::sleep(settle).await;
            *backoff = Duration::from_millis(100);
        }
        Wake::Relist => *backoff = Duration::from_millis(100),
    }
}
