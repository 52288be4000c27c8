//! The bucket loop: try compatible buckets in order until one supplies a complete
//! selection.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use router_policy::{PickError, RequestFacts};
use router_state::{RegistrySnapshot, Role};

use crate::pick::BucketPick;
use crate::resolver::BucketResolver;

/// A bucket that was tried and passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketAttempt {
    /// The bucket.
    pub bucket: Arc<str>,
    /// Why it could not supply a selection.
    pub error: PickError,
    /// How long its picks took, when the request asked for timing.
    pub took: Option<Duration>,
}

impl fmt::Display for BucketAttempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bucket {}: {}", self.bucket, self.error)
    }
}

/// A complete selection and the buckets passed over before it.
#[derive(Debug)]
pub struct Selection {
    /// The engines to dispatch to.
    pub pick: BucketPick,
    /// Earlier buckets that lacked candidates or rejected by admission.
    pub passed_over: Vec<BucketAttempt>,
    /// How long the chosen bucket's picks took, when the request asked for timing.
    pub took: Option<Duration>,
    /// Fitting buckets tried last because they were predicted to miss their latency
    /// targets.
    pub demoted: Vec<Arc<str>>,
}

/// Why no bucket supplied a selection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectError {
    /// No bucket accepts the request's length (a client error).
    #[error(transparent)]
    NoMatchingBucket(PickError),
    /// Every compatible bucket was tried and at least one engine was rejected by
    /// admission: the fleet is at capacity. The message lists every rejection, and
    /// the buckets whose prefill and decode engines could not pair.
    #[error("no engine can take the request now: {}", join(attempts))]
    AtCapacity {
        /// Every bucket tried, in order.
        attempts: Vec<BucketAttempt>,
    },
    /// Every compatible bucket was tried and none had an eligible engine; `stage` is
    /// the stage that was missing in the last bucket. The message names the buckets
    /// whose prefill and decode engines could not pair, and why.
    #[error("no {stage} engine is available{}", unpaired(attempts))]
    Unavailable {
        /// The missing stage.
        stage: Role,
        /// Every bucket tried, in order.
        attempts: Vec<BucketAttempt>,
    },
    /// A defect stopped routing: an invalid signal or configuration, or a policy that
    /// returned an engine outside its candidates.
    #[error("{error}")]
    Stopped {
        /// The bucket being tried, if any.
        bucket: Option<Arc<str>>,
        /// The defect.
        error: PickError,
    },
}

impl SelectError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            SelectError::NoMatchingBucket(_) => "no_matching_bucket",
            SelectError::AtCapacity { .. } => "at_capacity",
            SelectError::Unavailable { .. } => "no_engine_available",
            SelectError::Stopped { error, .. } => error.code(),
        }
    }

    /// The buckets tried before giving up.
    pub fn attempts(&self) -> &[BucketAttempt] {
        match self {
            SelectError::AtCapacity { attempts } | SelectError::Unavailable { attempts, .. } => {
                attempts
            }
            SelectError::NoMatchingBucket(_) | SelectError::Stopped { .. } => &[],
        }
    }
}

fn join(attempts: &[BucketAttempt]) -> String {
    attempts
        .iter()
        .filter(|a| !a.error.rejections().is_empty() || unpairs(a))
        .map(BucketAttempt::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// `: ` and the attempts whose engines could not pair, or nothing.
fn unpaired(attempts: &[BucketAttempt]) -> String {
    let named: Vec<String> = attempts
        .iter()
        .filter(|a| unpairs(a))
        .map(BucketAttempt::to_string)
        .collect();
    if named.is_empty() {
        String::new()
    } else {
        format!(": {}", named.join("; "))
    }
}

/// Whether the attempt's prefill and decode engines could not pair.
fn unpairs(attempt: &BucketAttempt) -> bool {
    matches!(attempt.error, PickError::NoCompatiblePair { .. })
}

impl BucketResolver {
    /// Resolves the request's buckets, moves those predicted to miss their latency
    /// targets last, and calls each one's
    /// [`pick_engines`](crate::Bucket::pick_engines) until one supplies a complete
    /// selection. Missing candidates and admission rejections advance to the next
    /// bucket, where every required engine is picked again; anything else stops.
    ///
    /// # Errors
    /// See [`SelectError`].
    pub async fn select(
        &self,
        engines: &RegistrySnapshot,
        request: &RequestFacts<'_>,
    ) -> Result<Selection, SelectError> {
        let buckets = self
            .resolve(request.input_tokens, request.expected_peak_tokens)
            .map_err(|error| SelectError::Stopped {
                bucket: None,
                error,
            })?;
        if buckets.is_empty() {
            return Err(SelectError::NoMatchingBucket(PickError::NoMatchingBucket {
                input_tokens: request.input_tokens,
                expected_peak_tokens: request.expected_peak_tokens,
            }));
        }
        let (buckets, demoted) = crate::slo::order(buckets, engines, request);
        let mut attempts = Vec::new();
        for bucket in buckets {
            let started = request.timed.then(Instant::now);
            let picked = bucket.pick_engines(engines, request).await;
            let took = started.map(|s| s.elapsed());
            match picked {
                Ok(pick) => {
                    tracing::debug!(
                        bucket = bucket.id(),
                        passed_over = attempts.len(),
                        "bucket selected"
                    );
                    return Ok(Selection {
                        pick,
                        passed_over: attempts,
                        took,
                        demoted,
                    });
                }
                Err(error) if error.advances_to_next_bucket() => {
                    tracing::debug!(bucket = bucket.id(), reason = error.code(), %error, "bucket passed over");
                    attempts.push(BucketAttempt {
                        bucket: bucket.id().into(),
                        error,
                        took,
                    });
                }
                Err(error) => {
                    tracing::warn!(bucket = bucket.id(), reason = error.code(), %error, "routing stopped");
                    return Err(SelectError::Stopped {
                        bucket: Some(bucket.id().into()),
                        error,
                    });
                }
            }
        }
        Err(exhausted(attempts))
    }
}

fn exhausted(attempts: Vec<BucketAttempt>) -> SelectError {
    if attempts.iter().any(|a| !a.error.rejections().is_empty()) {
        return SelectError::AtCapacity { attempts };
    }
    let stage = attempts
        .last()
        .and_then(|a| a.error.stage())
        .unwrap_or(Role::Plain);
    SelectError::Unavailable { stage, attempts }
}
