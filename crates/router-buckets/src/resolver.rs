//! A model's buckets, ordered once, filtered per request.

use std::collections::HashSet;

use router_policy::PickError;

use crate::bucket::{Bucket, BucketError};

/// A model's bucket collection: length filtering and ordering.
///
/// The order (ascending input capacity, unbounded last, then rank, then id) depends
/// only on configuration, so it is computed once here; [`resolve`](Self::resolve) is a
/// filter that preserves it. The resolver never looks at engines or policies.
#[derive(Debug, Clone)]
pub struct BucketResolver {
    buckets: Vec<Bucket>,
}

impl BucketResolver {
    /// Orders `buckets`.
    ///
    /// # Errors
    /// [`BucketError::DuplicateId`] when two buckets share an id.
    pub fn new(mut buckets: Vec<Bucket>) -> Result<Self, BucketError> {
        let mut seen = HashSet::new();
        if let Some(dup) = buckets.iter().find(|b| !seen.insert(b.id())) {
            return Err(BucketError::DuplicateId(dup.id().to_owned()));
        }
        buckets.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
        Ok(Self { buckets })
    }

    /// Every bucket in resolution order.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// The bucket with this id.
    pub fn get(&self, id: &str) -> Option<&Bucket> {
        self.buckets.iter().find(|b| b.id() == id)
    }

    /// Whether some bucket picks plain engines (what serves a request prefill/decode
    /// engines do not, such as an embedding).
    pub fn has_plain_bucket(&self) -> bool {
        self.buckets
            .iter()
            .any(|b| matches!(b.groups(), crate::BucketGroups::Plain(_)))
    }

    /// Whether where a request goes can depend on its prompt (see
    /// [`Bucket::routes_on_prompt`]); when not, a router need not tokenize prompts.
    pub fn routes_on_prompt(&self) -> bool {
        self.buckets.iter().any(Bucket::routes_on_prompt)
    }

    /// The buckets a request fits, in the order to try them; possibly empty.
    ///
    /// A bucket fits when its inclusive token range contains `input_tokens` and its
    /// context capacity holds `expected_peak_tokens` (or the input when the output
    /// budget is unknown).
    ///
    /// # Errors
    /// [`PickError::InvalidSignal`] when a known peak is below the input length.
    pub fn resolve(
        &self,
        input_tokens: u64,
        expected_peak_tokens: Option<u64>,
    ) -> Result<Vec<&Bucket>, PickError> {
        if let Some(peak) = expected_peak_tokens
            && peak < input_tokens
        {
            return Err(PickError::InvalidSignal {
                stage: None,
                message: format!(
                    "expected peak of {peak} tokens is below the {input_tokens} input tokens"
                ),
            });
        }
        Ok(self
            .buckets
            .iter()
            .filter(|b| b.accepts(input_tokens, expected_peak_tokens))
            .collect())
    }
}

/// Resolution order: ascending capacity with unbounded last, then rank, then id.
pub(crate) fn order_key(bucket: &Bucket) -> (bool, u64, i32, &str) {
    let capacity = bucket.capacity();
    (
        capacity.is_none(),
        capacity.unwrap_or(0),
        bucket.rank(),
        bucket.id(),
    )
}
