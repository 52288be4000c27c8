//! The policy contract: request facts in, one admitted engine (or a typed failure) out.

use std::fmt;
use std::sync::Arc;

use router_state::{Engine, Reservation, Role};

use crate::error::{PickError, Rejection};
use crate::explain::Observation;
use crate::facts::RequestFacts;
use crate::future::BoxFuture;
use crate::pick::Pick;

/// Chooses one engine from a candidate set.
///
/// `engines` is the exact candidate set of one engine group, sorted by id, healthy and
/// of the request's stage. A policy returns an engine from that set that passed its
/// admission check, or a [`PickError`]; it never looks outside the set, never chooses
/// another bucket, and never crosses a PD role boundary. Policies own the state
/// handles they read (load table, affinity store, prefix index), which are given at
/// construction; requests carry only facts.
pub trait Policy: Send + Sync + fmt::Debug {
    /// Picks one engine for `request` from `engines`.
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Engine>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>>;

    /// Whether picks read the prompt ([`RequestFacts::token_ids`] or
    /// [`RequestFacts::input_tokens`]); a router need not tokenize a prompt that no
    /// policy on its way reads. Every policy is taken to read it unless it says it
    /// does not.
    fn reads_prompt(&self) -> bool {
        true
    }

    /// Reserves `pick`'s engine against the policy's caps on counts the router keeps
    /// ([`EngineAdmission::reserve`](crate::EngineAdmission::reserve)); the caller
    /// does so once a non-dry-run pick returns, and picks again when a concurrent pick
    /// took the last slot first. `Ok(None)` when no such cap applies; by default none
    /// does.
    ///
    /// # Errors
    /// The engine reached such a cap since the pick checked it.
    fn reserve(&self, pick: &Pick) -> Result<Option<Reservation>, Rejection> {
        let _ = pick;
        Ok(None)
    }
}

/// One stage of one request, as a bucket hands it to a group's policy: the
/// request's facts, the role being picked and the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PickRequest<'a> {
    /// What is known of the request.
    pub facts: RequestFacts<'a>,
    /// Plain, prefill or decode: the role of the engine being picked.
    pub stage: Role,
    /// Id of the bucket the pick is made in.
    pub bucket_id: &'a str,
}

impl<'a> PickRequest<'a> {
    /// The pick of `stage` in bucket `bucket_id` for the request `facts` describe.
    pub fn new(facts: RequestFacts<'a>, stage: Role, bucket_id: &'a str) -> Self {
        Self {
            facts,
            stage,
            bucket_id,
        }
    }

    /// Whether the pick is a dry run, and so must change nothing.
    pub fn is_dry_run(&self) -> bool {
        self.facts.is_dry_run()
    }

    /// Whether the policy's own rotation and generator move on (see
    /// [`Explanation::shadow`](crate::Explanation::shadow)).
    pub fn moves_own_state(&self) -> bool {
        self.facts.moves_own_state()
    }

    /// Records `observation` when the pick is recorded; builds it only then.
    pub fn observe(&self, observation: impl FnOnce() -> Observation) {
        self.facts.observe(observation);
    }
}
