//! An engine group: membership plus one policy.

use std::collections::BTreeSet;
use std::sync::Arc;

use router_policy::{Observation, Pick, PickError, PickRequest, Policy};
use router_state::{Engine, EngineId, EngineListMemo, RegistrySnapshot, Role};

use crate::shadow::Shadow;

/// How many times a group's policy picks for one request when concurrent picks keep
/// taking the chosen engine's last slot first; after that the pick fails with the
/// engine's cap, as if the policy had seen it full.
pub const RESERVE_TRIES: usize = 4;

/// Which engines of the model and stage a group may pick from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Membership {
    /// Every healthy engine serving the model in the group's role.
    All,
    /// Only these engines (an empty set means none).
    Only(BTreeSet<EngineId>),
}

impl Membership {
    /// Whether the engine with this id is a member.
    pub fn contains(&self, id: &EngineId) -> bool {
        match self {
            Membership::All => true,
            Membership::Only(ids) => ids.contains(id),
        }
    }
}

/// Engine membership and the policy that picks among the members.
///
/// The group references engines by id and resolves them from the live registry on each
/// pick, so health and membership changes apply at once; the policy instance (and its
/// state, e.g. a round-robin cursor) is reused across requests. The candidates of a
/// model's engines are computed once per change of them and kept
/// ([`EngineListMemo`]), so a request does not filter a large fleet again.
#[derive(Debug, Clone)]
pub struct EngineGroup {
    membership: Membership,
    policy: Arc<dyn Policy>,
    /// The policy picking beside `policy` on a share of its picks, if any.
    shadow: Option<Shadow>,
    /// Each role's candidates, by the model's engines they were filtered from.
    candidates: Arc<[EngineListMemo<Vec<Arc<Engine>>>; 3]>,
}

/// A request's candidates, shared with the group that keeps them.
pub type Candidates = Arc<Vec<Arc<Engine>>>;

impl EngineGroup {
    /// A catch-all group: every healthy engine of the model in the picked role.
    pub fn new(policy: Arc<dyn Policy>) -> Self {
        Self {
            membership: Membership::All,
            policy,
            shadow: None,
            candidates: Arc::default(),
        }
    }

    /// A group of exactly these engines (none, if `ids` is empty).
    pub fn with_members(policy: Arc<dyn Policy>, ids: impl IntoIterator<Item = EngineId>) -> Self {
        Self {
            membership: Membership::Only(ids.into_iter().collect()),
            policy,
            shadow: None,
            candidates: Arc::default(),
        }
    }

    /// With `shadow` picking beside the group's policy.
    pub fn with_shadow(mut self, shadow: Shadow) -> Self {
        self.shadow = Some(shadow);
        self
    }

    /// The group's shadow policy, if it has one.
    pub fn shadow(&self) -> Option<&Shadow> {
        self.shadow.as_ref()
    }

    /// The group's membership.
    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// The group's policy.
    pub fn policy(&self) -> &Arc<dyn Policy> {
        &self.policy
    }

    /// The group's candidates for `model` and `stage`: healthy members in the stage's
    /// role, sorted by id; filtered from the model's engines once per change of them.
    pub fn candidates(&self, engines: &RegistrySnapshot, model: &str, stage: Role) -> Candidates {
        let memo = &self.candidates[match stage {
            Role::Plain => 0,
            Role::Prefill => 1,
            Role::Decode => 2,
        }];
        memo.get(engines.model_engines(model), |engines| {
            engines
                .iter()
                .filter(|w| w.is_healthy() && w.role() == stage && self.membership.contains(w.id()))
                .cloned()
                .collect()
        })
    }

    /// Resolves the candidates (leaving out the request's excluded engines, and those
    /// that do not serve the request's adapter), runs the
    /// policy and checks that the engine it returns is one of the candidates: the
    /// same `Arc`, not merely the same id.
    ///
    /// # Errors
    /// [`PickError::NoCandidates`] without invoking the policy when no engine is
    /// eligible, [`PickError::OutsideCandidates`] for a foreign result, and whatever
    /// the policy returns.
    pub async fn pick(
        &self,
        engines: &RegistrySnapshot,
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        let offer = Offer::new(self.eligible(engines, request), request.stage);
        self.pick_offered(offer, request).await
    }

    /// Runs the policy over the candidates of `offer` (some of this group's eligible
    /// engines), recording them and the outcome; fails with the offer's failure
    /// without invoking the policy when it holds none.
    pub(crate) async fn pick_offered(
        &self,
        offer: Offer,
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        let Offer { candidates, none } = offer;
        request.observe(|| Observation::Candidates {
            bucket: request.bucket_id.to_owned(),
            stage: request.stage,
            engines: candidates.iter().map(|c| c.id().clone()).collect(),
        });
        let picked = if candidates.is_empty() {
            Err(none)
        } else {
            self.pick_among(&candidates, request).await
        };
        request.observe(|| match &picked {
            Ok(pick) => Observation::Picked {
                bucket: request.bucket_id.to_owned(),
                stage: request.stage,
                engine: pick.engine.id().clone(),
                reason: pick.reason,
                predicted_cached_tokens: pick.predicted_cached_tokens,
            },
            Err(error) => Observation::Failed {
                bucket: request.bucket_id.to_owned(),
                stage: request.stage,
                error: error.clone(),
            },
        });
        picked
    }

    /// The candidates a pick for `request` offers the policy: those of
    /// [`candidates`](Self::candidates) less the request's excluded engines and those
    /// that do not serve its adapter.
    pub fn eligible(&self, engines: &RegistrySnapshot, request: &PickRequest<'_>) -> Candidates {
        let candidates = self.candidates(engines, request.facts.model, request.stage);
        let excluded = &request.facts.excluded;
        if excluded.is_empty() && request.facts.adapter.is_none() {
            return candidates;
        }
        let eligible = |c: &&Arc<Engine>| {
            !excluded.contains(c.id())
                && request
                    .facts
                    .adapter
                    .is_none_or(|adapter| c.serves_adapter(adapter))
        };
        Arc::new(candidates.iter().filter(eligible).cloned().collect())
    }

    /// Runs the policy and, unless the request is a dry run, lets the group's shadow
    /// pick beside its first pick (counted against the pick reserved), then reserves
    /// the engine it returned
    /// ([`Policy::reserve`]). A concurrent pick may take an engine's last slot between
    /// the policy's check and the reservation: the policy then picks again, seeing
    /// that engine full, up to [`RESERVE_TRIES`] times in all.
    async fn pick_among(
        &self,
        candidates: &[Arc<Engine>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        let mut tries = 0;
        let mut shadowed = None;
        loop {
            let mut pick = self.policy.pick(candidates, request).await?;
            if !candidates.iter().any(|c| Arc::ptr_eq(c, &pick.engine)) {
                return Err(PickError::OutsideCandidates {
                    stage: request.stage,
                    engine: pick.engine.id().clone(),
                });
            }
            if request.is_dry_run() {
                return Ok(pick);
            }
            // The shadow sees what the policy saw: before the pick is reserved. It is
            // counted against the pick reserved, and not at all without one.
            if let (0, Some(shadow)) = (tries, &self.shadow) {
                shadowed = shadow.pick(candidates, request).await;
            }
            tries += 1;
            match self.policy.reserve(&pick) {
                Ok(reservation) => {
                    pick.reservation = reservation;
                    if let (Some(picked), Some(shadow)) = (shadowed, &self.shadow) {
                        shadow.count(picked, request, &pick);
                    }
                    return Ok(pick);
                }
                Err(rejection) if tries >= RESERVE_TRIES => {
                    return Err(PickError::AdmissionRejected {
                        stage: request.stage,
                        rejection,
                    });
                }
                Err(_) => {}
            }
        }
    }
}

/// What a group offers its policy for one pick: candidates, and the failure a pick
/// ends with when there are none.
#[derive(Debug)]
pub(crate) struct Offer {
    /// The engines the policy picks among.
    pub(crate) candidates: Candidates,
    /// Why there is no engine to pick, when there is none.
    pub(crate) none: PickError,
}

impl Offer {
    /// `candidates` of `stage`; none of them is [`PickError::NoCandidates`].
    pub(crate) fn new(candidates: Candidates, stage: Role) -> Self {
        Self {
            candidates,
            none: PickError::NoCandidates { stage },
        }
    }
}
