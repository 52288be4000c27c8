//! The queueing and timing model of one engine.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio::time::{Instant, sleep};

/// How fast and how wide an engine is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineSpec {
    /// Requests that run at once; the rest wait in arrival order.
    pub max_running_requests: u32,
    /// Prompt tokens prefilled per second, per running request.
    pub prefill_tokens_per_sec: f64,
    /// Output tokens generated per second, per running request.
    pub decode_tokens_per_sec: f64,
    /// KV-cache capacity in tokens, as reported.
    pub kv_capacity_tokens: u64,
}

impl Default for EngineSpec {
    fn default() -> Self {
        Self {
            max_running_requests: 64,
            prefill_tokens_per_sec: 40_000.0,
            decode_tokens_per_sec: 1_000.0,
            kv_capacity_tokens: 1 << 20,
        }
    }
}

/// The engine's queues and counters, in the terms of the `LoadStat` gauge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadSample {
    /// Requests running.
    pub running_requests: u64,
    /// Requests waiting for a slot.
    pub waiting_requests: u64,
    /// KV tokens held by running requests.
    pub used_kv_tokens: u64,
    /// KV-cache capacity in tokens.
    pub max_kv_tokens: u64,
    /// Prompt tokens of waiting requests (nothing is cached in this model).
    pub waiting_uncached_tokens: u64,
    /// KV tokens in use plus the prompt tokens of waiting requests.
    pub total_tokens: u64,
    /// The running-request limit.
    pub max_running_requests: u64,
    /// Counter: prompt tokens prefilled since start.
    pub prefill_uncached_tokens_total: u64,
    /// Counter: microseconds spent prefilling since start.
    pub prefill_busy_us_total: u64,
}

/// How long one request took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// Time spent waiting for a running slot.
    pub queued: Duration,
    /// Time from arrival to the first output token.
    pub time_to_first_token: Duration,
    /// Time from arrival to the last output token.
    pub total: Duration,
}

/// One simulated engine.
#[derive(Debug)]
pub struct SimEngine {
    spec: EngineSpec,
    slots: Semaphore,
    state: Mutex<LoadSample>,
}

impl SimEngine {
    /// An idle engine.
    pub fn new(spec: EngineSpec) -> Self {
        Self {
            spec,
            slots: Semaphore::new(spec.max_running_requests as usize),
            state: Mutex::new(LoadSample {
                max_kv_tokens: spec.kv_capacity_tokens,
                max_running_requests: u64::from(spec.max_running_requests),
                ..LoadSample::default()
            }),
        }
    }

    /// The engine's spec.
    pub fn spec(&self) -> EngineSpec {
        self.spec
    }

    /// The current queues and counters.
    pub fn load(&self) -> LoadSample {
        *self.state.lock()
    }

    /// Serves one request: waits for a slot, prefills the prompt, then decodes the
    /// output. Dropping the future (a client that went away) frees whatever the request
    /// held, as an engine aborts a request whose connection closed.
    pub async fn serve(&self, prompt_tokens: u64, output_tokens: u64) -> Served {
        let arrived = Instant::now();
        let mut request = Tracked::waiting(self, prompt_tokens);
        let _slot = self
            .slots
            .acquire()
            .await
            .expect("the semaphore is never closed");
        request.start_running();
        let queued = arrived.elapsed();
        let prefill =
            Duration::from_secs_f64(prompt_tokens as f64 / self.spec.prefill_tokens_per_sec);
        sleep(prefill).await;
        request.prefilled(prefill);
        let time_to_first_token = arrived.elapsed();
        let decode =
            Duration::from_secs_f64(output_tokens as f64 / self.spec.decode_tokens_per_sec);
        sleep(decode).await;
        Served {
            queued,
            time_to_first_token,
            total: arrived.elapsed(),
        }
    }
}

/// A request's share of the engine's counters, returned on drop at any stage.
struct Tracked<'a> {
    engine: &'a SimEngine,
    prompt_tokens: u64,
    running: bool,
}

impl<'a> Tracked<'a> {
    fn waiting(engine: &'a SimEngine, prompt_tokens: u64) -> Self {
        let mut s = engine.state.lock();
        s.waiting_requests += 1;
        s.waiting_uncached_tokens += prompt_tokens;
        s.total_tokens += prompt_tokens;
        Self {
            engine,
            prompt_tokens,
            running: false,
        }
    }

    fn start_running(&mut self) {
        let mut s = self.engine.state.lock();
        s.waiting_requests -= 1;
        s.waiting_uncached_tokens -= self.prompt_tokens;
        s.running_requests += 1;
        s.used_kv_tokens += self.prompt_tokens;
        self.running = true;
    }

    fn prefilled(&self, took: Duration) {
        let mut s = self.engine.state.lock();
        s.prefill_uncached_tokens_total += self.prompt_tokens;
        s.prefill_busy_us_total += took.as_micros() as u64;
    }
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        let mut s = self.engine.state.lock();
        s.total_tokens -= self.prompt_tokens;
        if self.running {
            s.running_requests -= 1;
            s.used_kv_tokens -= self.prompt_tokens;
        } else {
            s.waiting_requests -= 1;
            s.waiting_uncached_tokens -= self.prompt_tokens;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn spec(slots: u32) -> EngineSpec {
        EngineSpec {
            max_running_requests: slots,
            prefill_tokens_per_sec: 1000.0,
            decode_tokens_per_sec: 100.0,
            kv_capacity_tokens: 10_000,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn prefill_and_decode_take_tokens_over_their_rates() {
        let engine = SimEngine::new(spec(4));
        let served = engine.serve(500, 20).await;
        assert_eq!(served.queued, Duration::ZERO);
        assert_eq!(served.time_to_first_token, Duration::from_millis(500));
        assert_eq!(served.total, Duration::from_millis(700));
        let load = engine.load();
        assert_eq!(
            (
                load.prefill_uncached_tokens_total,
                load.prefill_busy_us_total
            ),
            (500, 500_000)
        );
        assert_eq!(
            (
                load.running_requests,
                load.used_kv_tokens,
                load.total_tokens
            ),
            (0, 0, 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_queue_behind_the_running_limit_and_report_it() {
        let engine = Arc::new(SimEngine::new(spec(1)));
        let first = tokio::spawn({
            let engine = Arc::clone(&engine);
            async move { engine.serve(1000, 0).await }
        });
        tokio::task::yield_now().await;
        let second = tokio::spawn({
            let engine = Arc::clone(&engine);
            async move { engine.serve(300, 0).await }
        });
        tokio::task::yield_now().await;
        let load = engine.load();
        assert_eq!((load.running_requests, load.waiting_requests), (1, 1));
        assert_eq!(
            (
                load.used_kv_tokens,
                load.waiting_uncached_tokens,
                load.total_tokens
            ),
            (1000, 300, 1300)
        );
        assert_eq!(first.await.unwrap().total, Duration::from_secs(1));
        let second = second.await.unwrap();
        assert_eq!(
            second.queued,
            Duration::from_secs(1),
            "waited for the only slot"
        );
        assert_eq!(second.time_to_first_token, Duration::from_millis(1300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_request_frees_its_slot_and_counters() {
        let engine = Arc::new(SimEngine::new(spec(1)));
        let running = tokio::spawn({
            let engine = Arc::clone(&engine);
            async move { engine.serve(1000, 1000).await }
        });
        let waiting = tokio::spawn({
            let engine = Arc::clone(&engine);
            async move { engine.serve(50, 0).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(engine.load().waiting_requests, 1);
        waiting.abort();
        running.abort();
        assert!(running.await.unwrap_err().is_cancelled());
        assert!(waiting.await.unwrap_err().is_cancelled());
        let load = engine.load();
        assert_eq!(
            (
                load.running_requests,
                load.waiting_requests,
                load.total_tokens
            ),
            (0, 0, 0)
        );
        assert_eq!(
            engine.serve(10, 0).await.queued,
            Duration::ZERO,
            "the slot is free again"
        );
    }
}
