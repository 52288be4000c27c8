//! Taking a file only once it is whole: read, wait, read again, and take it when two
//! reads in a row agree on its length, modification time and text; a file still
//! changing after a bounded number of reads is not taken.

use std::future::Future;
use std::time::Duration;

use super::{ReadError, Snapshot};

/// How long a file must stay the same before it is taken, and how often it is read
/// before giving up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settle {
    /// The time between two reads that must agree.
    pub interval: Duration,
    /// The most reads made after the first.
    pub rereads: u32,
}

impl Settle {
    /// The default interval: a writer that pauses longer is not waited for.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(500);
    /// Rereads before giving up: a file is given ten intervals to settle.
    pub const REREADS: u32 = 10;

    /// Reads `interval` apart, at most [`REREADS`](Self::REREADS) of them.
    pub fn every(interval: Duration) -> Self {
        Self {
            interval,
            rereads: Self::REREADS,
        }
    }
}

impl Default for Settle {
    fn default() -> Self {
        Self::every(Self::DEFAULT_INTERVAL)
    }
}

/// Why a file was not taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettleError {
    /// A read failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// It was still changing at the last read.
    #[error(
        "still changing after {reads} reads {interval:?} apart: write the file beside and rename it over, or raise the settle interval"
    )]
    Unsettled {
        /// The reads made.
        reads: u32,
        /// Their interval.
        interval: Duration,
    },
    /// It had to stay unchanged for `hold` (it does more than add), and changed
    /// within that time after each of `tries` reads through.
    #[error(
        "changed again within {hold:?} of being read, {tries} times (a file that does more than add models or engines must stay unchanged that long): write the file beside and rename it over"
    )]
    Unheld {
        /// The times the file was read through.
        tries: u32,
        /// How long it had to stay unchanged.
        hold: Duration,
    },
}

/// The file `read` reads, once two reads `settle.interval` apart agree.
///
/// # Errors
/// The first failed read, or [`SettleError::Unsettled`].
pub async fn settled<R, F>(settle: Settle, mut read: R) -> Result<Snapshot, SettleError>
where
    R: FnMut() -> F,
    F: Future<Output = Result<Snapshot, ReadError>>,
{
    let mut last = read().await?;
    for _ in 0..settle.rereads {
        tokio::time::sleep(settle.interval).await;
        let next = read().await?;
        if next == last {
            return Ok(next);
        }
        last = next;
    }
    Err(SettleError::Unsettled {
        reads: settle.rereads + 1,
        interval: settle.interval,
    })
}

/// Whether the file `read` reads still holds `taken` at each of `reads` reads
/// `interval` apart: false at the first that differs.
///
/// # Errors
/// The first failed read.
pub async fn unchanged<R, F>(
    taken: &Snapshot,
    interval: Duration,
    reads: u32,
    mut read: R,
) -> Result<bool, ReadError>
where
    R: FnMut() -> F,
    F: Future<Output = Result<Snapshot, ReadError>>,
{
    for _ in 0..reads {
        tokio::time::sleep(interval).await;
        if read().await? != *taken {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::SystemTime;

    use parking_lot::Mutex;
    use tokio::time::Instant;

    use super::*;
    use crate::file::{MAX_CONFIG_BYTES, read_regular_off_runtime};

    fn snapshot(text: &str, modified: u64) -> Snapshot {
        Snapshot {
            len: text.len() as u64,
            modified: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(modified)),
            text: text.to_owned(),
        }
    }

    /// A file whose reads return `reads` in turn (the last one, a snapshot, from then
    /// on), and the time of each read.
    struct Scripted {
        reads: Mutex<VecDeque<Result<Snapshot, ReadError>>>,
        at: Mutex<Vec<Duration>>,
        start: Instant,
    }

    impl Scripted {
        fn new(reads: Vec<Result<Snapshot, ReadError>>) -> Self {
            Self {
                reads: Mutex::new(reads.into()),
                at: Mutex::new(Vec::new()),
                start: Instant::now(),
            }
        }

        async fn read(&self) -> Result<Snapshot, ReadError> {
            self.at.lock().push(self.start.elapsed());
            let mut reads = self.reads.lock();
            match reads.front().expect("a read") {
                Ok(snapshot) if reads.len() == 1 => Ok(snapshot.clone()),
                _ => reads.pop_front().expect("a read"),
            }
        }

        fn times(&self) -> Vec<Duration> {
            self.at.lock().clone()
        }
    }

    const HALF: &str = "models:\n  - id: m\n";
    const WHOLE: &str = "models:\n  - id: m\n    engines: [{id: A, url: 'http://a'}]\n";

    #[tokio::test(start_paused = true)]
    async fn a_file_written_in_two_halves_is_taken_only_once_whole() {
        // The second half lands between the first read and the second.
        let file = Scripted::new(vec![Ok(snapshot(HALF, 1)), Ok(snapshot(WHOLE, 2))]);
        let taken = settled(Settle::default(), || file.read())
            .await
            .expect("taken");
        assert_eq!(taken.text(), WHOLE);
        let ms = Duration::from_millis;
        assert_eq!(file.times(), [ms(0), ms(500), ms(1000)]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_text_with_another_length_or_time_is_not_settled_yet() {
        let mut grown = snapshot(WHOLE, 2);
        grown.len += 1;
        let file = Scripted::new(vec![
            Ok(grown),
            Ok(snapshot(WHOLE, 3)),
            Ok(snapshot(WHOLE, 2)),
        ]);
        let taken = settled(Settle::default(), || file.read())
            .await
            .expect("taken");
        assert_eq!(taken, snapshot(WHOLE, 2));
        assert_eq!(file.times().len(), 4, "two reads agree only at the fourth");
    }

    #[tokio::test(start_paused = true)]
    async fn a_file_that_keeps_changing_is_given_up_after_the_rereads() {
        let reads = (0..20).map(|n| Ok(snapshot(HALF, n))).collect();
        let file = Scripted::new(reads);
        let settle = Settle::every(Duration::from_millis(100));
        let error = settled(settle, || file.read()).await.expect_err("given up");
        assert_eq!(
            error.to_string(),
            "still changing after 11 reads 100ms apart: write the file beside and rename it over, or raise the settle interval"
        );
        assert_eq!(file.times().last(), Some(&Duration::from_secs(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_real_file_completed_between_two_reads_is_taken_whole() {
        let dir = std::env::temp_dir().join(format!("switchyard-settle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.yaml");
        std::fs::write(&path, HALF).unwrap();
        let reads = Mutex::new(0);
        let taken = settled(Settle::default(), || {
            *reads.lock() += 1;
            if *reads.lock() == 2 {
                // The writer's second half, after its pause.
                std::fs::write(&path, WHOLE).unwrap();
            }
            read_regular_off_runtime(path.clone(), MAX_CONFIG_BYTES)
        })
        .await;
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(taken.expect("taken").text(), WHOLE);
        assert_eq!(
            *reads.lock(),
            3,
            "the half file was read once, then the whole twice"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_file_is_unchanged_only_if_every_read_agrees() {
        let ms = Duration::from_millis;
        let file = Scripted::new(vec![Ok(snapshot(HALF, 1))]);
        let held = unchanged(&snapshot(HALF, 1), ms(500), 10, || file.read()).await;
        assert!(held.expect("read"));
        assert_eq!(file.times().len(), 10);
        assert_eq!(file.times().last(), Some(&ms(5000)));

        let file = Scripted::new(vec![
            Ok(snapshot(HALF, 1)),
            Ok(snapshot(HALF, 1)),
            Ok(snapshot(WHOLE, 2)),
        ]);
        let held = unchanged(&snapshot(HALF, 1), ms(500), 10, || file.read()).await;
        assert!(!held.expect("read"), "the third read saw the rest written");
        assert_eq!(file.times(), [ms(500), ms(1000), ms(1500)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_the_answer_at_once() {
        let file = Scripted::new(vec![Err(ReadError::TooLarge(16))]);
        let error = settled(Settle::default(), || file.read())
            .await
            .expect_err("refused");
        assert_eq!(
            error.to_string(),
            "larger than 16 bytes: the most such a file may hold"
        );
        assert_eq!(file.times(), [Duration::ZERO], "read once, no wait");
    }
}
