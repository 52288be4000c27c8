//! The threads that tokenize prompts: a fixed set, `limits.tokenize_concurrency` of
//! them, so a long prompt never stalls the threads that serve requests, and the
//! tokenizer's per-thread caches are bounded by the thread count (on a pool that
//! grows with load, every new thread would fill its own).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc;

use parking_lot::Mutex;
use tokio::sync::{Semaphore, oneshot};

type Job = Box<dyn FnOnce() + Send>;

/// See the module documentation.
#[derive(Debug)]
pub struct TokenizePool {
    /// One per thread: a job waits for a permit and holds it until it has run, so
    /// the queue never holds more jobs than there are threads, even when the
    /// requests that queued them have gone.
    permits: Arc<Semaphore>,
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl TokenizePool {
    /// Starts `threads` threads; they end when the pool is dropped.
    ///
    /// # Panics
    /// The operating system refused to start a thread.
    pub fn new(threads: usize) -> Self {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for n in 0..threads {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("tokenize-{n}"))
                .spawn(move || {
                    loop {
                        let job = queue.lock().recv();
                        let Ok(job) = job else { return };
                        // A job that panics answers nothing; the thread lives on.
                        drop(catch_unwind(AssertUnwindSafe(job)));
                    }
                })
                .expect("a tokenizing thread starts");
        }
        Self {
            permits: Arc::new(Semaphore::new(threads)),
            jobs: Mutex::new(jobs),
        }
    }

    /// Runs `job` on one of the threads once one is free; `None` if it panicked. A
    /// job whose caller went away between queueing it and a thread taking it is
    /// skipped.
    pub async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let permit = Arc::clone(&self.permits).acquire_owned().await.ok()?;
        let (answer, answered) = oneshot::channel();
        let job: Job = Box::new(move || {
            if !answer.is_closed() {
                drop(answer.send(job()));
            }
            drop(permit);
        });
        self.jobs.lock().send(job).ok()?;
        answered.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_the_pools_threads_and_a_panic_leaves_them_running() {
        let pool = TokenizePool::new(1);
        let name = || std::thread::current().name().map(str::to_owned);
        assert_eq!(pool.run(name).await, Some(Some("tokenize-0".to_owned())));
        assert_eq!(pool.run(|| panic!("a broken tokenizer")).await, None::<()>);
        assert_eq!(
            pool.run(name).await,
            Some(Some("tokenize-0".to_owned())),
            "the thread survived"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn however_many_jobs_come_at_once_only_the_pools_threads_run_them() {
        let pool = Arc::new(TokenizePool::new(2));
        let jobs: Vec<_> = (0..64)
            .map(|_| {
                let pool = Arc::clone(&pool);
                tokio::spawn(async move { pool.run(|| std::thread::current().id()).await })
            })
            .collect();
        let mut threads = std::collections::HashSet::new();
        for job in jobs {
            threads.insert(job.await.unwrap().expect("the job ran"));
        }
        assert!(threads.len() <= 2, "{} threads tokenized", threads.len());
    }

    #[tokio::test]
    async fn an_abandoned_job_holds_its_thread_until_it_ends() {
        let pool = TokenizePool::new(1);
        let (started, mut running) = tokio::sync::mpsc::unbounded_channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        // The job blocks the only thread; its caller goes away.
        let abandoned = pool.run(move || {
            started.send(()).unwrap();
            released.recv().unwrap();
        });
        tokio::select! {
            _ = abandoned => unreachable!("the job is blocked"),
            _ = running.recv() => {}
        }
        assert_eq!(
            pool.permits.available_permits(),
            0,
            "the running job still holds the thread's permit: nothing queues behind it"
        );
        release.send(()).unwrap();
        assert_eq!(pool.run(|| 7).await, Some(7));
    }
}
