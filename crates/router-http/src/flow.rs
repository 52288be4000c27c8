//! Flow control on the serving path (a model's `flow` section): the tenant and the
//! priority band of a request, its tenant's in-flight cap (429 past it), and the
//! model's queue, where a request that finds every fitting bucket full waits for
//! capacity instead of getting 503 at once.
//!
//! While a model's queue holds anyone, a new request queues behind them rather than
//! trying the engines first, so arrivals never take freed capacity from those already
//! waiting; capacity events (a request released, a load report, an engine joining)
//! give the turn to whoever the queue's order says goes next.

mod class;
mod objectives;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use std::hash::{Hash, Hasher};

use router_buckets::{BucketResolver, SelectError, Selection};
use router_config::{FlowConfig, MAX_TENANT_BYTES};
use router_flow::{
    DisciplineSettings, Expired, LedgerSettings, Refused, RoomSettings, TenantGuard, TenantLedger,
    WaitingRoom,
};
use router_policy::RequestFacts;

use crate::error::ApiError;
pub(crate) use class::Class;
pub(crate) use objectives::ClusterObjectives;

/// How many entries of the queue's order are offered the turn after one capacity
/// event before the room waits for the next: past the first, those whose engines
/// may still have room when the first's are full.
const TRIES_PER_PASS: usize = 8;

/// The tenant of a request that names none.
pub(crate) const ANONYMOUS: &str = "anonymous";

// A tenant name of the digest form fits the bound on names.
const _: () = assert!("key-0123456789abcdef".len() <= MAX_TENANT_BYTES);

/// A model's flow control, built from its `flow` section.
#[derive(Debug)]
pub(crate) struct ModelFlow {
    config: FlowConfig,
    room: Option<Arc<WaitingRoom>>,
    ledger: Option<TenantLedger>,
}

/// Why a request was refused before any engine was tried, or found none.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The bucket loop's own failure (no queue, or one it cannot wait out).
    Select(SelectError),
    /// The queue was full.
    Full {
        /// When to come back, from the queue's drain rate.
        retry_after: Duration,
        /// The bucket loop's last failure (no attempt, when others were waiting).
        last: SelectError,
    },
    /// The request waited its `max_wait_ms` without capacity freeing for it.
    Timeout {
        /// When to come back, from the queue's drain rate.
        retry_after: Duration,
        /// How long it waited.
        waited: Duration,
        /// The bucket loop's last failure.
        last: SelectError,
    },
}

impl Refusal {
    /// The bucket loop's failure behind the refusal.
    pub(crate) fn select_error(&self) -> &SelectError {
        match self {
            Refusal::Select(last) | Refusal::Full { last, .. } | Refusal::Timeout { last, .. } => {
                last
            }
        }
    }

    /// Whether the request waited in the queue and left it without capacity.
    pub(crate) fn timed_out(&self) -> bool {
        matches!(self, Refusal::Timeout { .. })
    }
}

/// A selection, and how long the request waited in the queue for it.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) selection: Selection,
    pub(crate) waited: Option<Duration>,
}

impl ModelFlow {
    /// The flow control `config` describes; `None` for the default section, which
    /// changes nothing on the request path.
    pub(crate) fn new(config: &FlowConfig) -> Option<Arc<Self>> {
        if *config == FlowConfig::default() {
            return None;
        }
        let room = config.queue.map(|queue| {
            WaitingRoom::new(RoomSettings {
                max_wait: Duration::from_millis(queue.max_wait_ms),
                discipline: DisciplineSettings {
                    bands: config.priority.band_count(),
                    starvation_limit: config.priority.starvation_limit,
                    capacity: queue.max_queued,
                },
                tries_per_pass: TRIES_PER_PASS,
            })
            .expect("the flow section's checks bound every setting")
        });
        let ledger = config.tenants.as_ref().map(|tenants| {
            TenantLedger::new(LedgerSettings {
                max_tracked: tenants.max_tracked,
            })
            .always_naming(tenants.max_inflight.keys().map(|t| Arc::from(t.as_str())))
        });
        Some(Arc::new(Self {
            config: config.clone(),
            room,
            ledger,
        }))
    }

    /// The model's queue, when it has one.
    pub(crate) fn room(&self) -> Option<&Arc<WaitingRoom>> {
        self.room.as_ref()
    }

    /// The section this was built from.
    pub(crate) fn config(&self) -> &FlowConfig {
        &self.config
    }

    /// Counts the request against its tenant's in-flight cap until the guard drops.
    ///
    /// # Errors
    /// 429 when the tenant has its cap's worth in flight.
    pub(crate) fn hold_tenant(&self, class: &Class) -> Result<Option<TenantGuard>, ApiError> {
        let (Some(ledger), Some(tenants)) = (&self.ledger, &self.config.tenants) else {
            return Ok(None);
        };
        ledger
            .try_acquire(&class.tenant, tenants.cap(&class.tenant))
            .map(Some)
            .map_err(|over| ApiError::tenant_over_cap(over.in_flight, over.cap))
    }

    /// Runs `select` (the bucket loop) for a request of `class`: at once when the
    /// queue is empty, and again in the queue whenever its turn comes while every
    /// fitting bucket is full, until it gets a selection, fails otherwise, or waits
    /// past its deadline. A request dropped while it waits leaves the queue at once.
    /// `kind` says, when it enters the queue, which requests the same capacity would
    /// serve ([`kind`]).
    pub(crate) async fn select<F, Fut>(
        &self,
        class: &Class,
        kind: impl FnOnce() -> u64,
        select: F,
    ) -> Result<Admitted, Refusal>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Selection, SelectError>>,
    {
        let Some(room) = &self.room else {
            return direct(select().await);
        };
        let mut last = SelectError::AtCapacity {
            attempts: Vec::new(),
        };
        if room.is_empty() {
            match select().await {
                Err(full @ SelectError::AtCapacity { .. }) => last = full,
                selected => return direct(selected),
            }
        }
        let weight = self.weight(&class.tenant);
        let mut ticket = match room.enter(class.band, Arc::clone(&class.tenant), weight, kind()) {
            Ok(ticket) => ticket,
            Err(Refused::Full { retry_after }) => return Err(Refusal::Full { retry_after, last }),
        };
        loop {
            if let Err(Expired {
                retry_after,
                waited,
            }) = ticket.turn().await
            {
                return Err(Refusal::Timeout {
                    retry_after,
                    waited,
                    last,
                });
            }
            match select().await {
                Ok(selection) => {
                    let waited = ticket.admitted();
                    return Ok(Admitted {
                        selection,
                        waited: Some(waited),
                    });
                }
                Err(full @ SelectError::AtCapacity { .. }) => {
                    last = full;
                    ticket.failed();
                }
                Err(other) => return Err(Refusal::Select(other)),
            }
        }
    }

    /// The label `tenant` is counted under in metrics: its name when the section
    /// names it (or it is `anonymous`), else `other`, so clients cannot create label
    /// values.
    pub(crate) fn tenant_label(&self, tenant: &Arc<str>) -> Arc<str> {
        let named = self.config.tenants.as_ref().is_some_and(|t| {
            t.weights.contains_key(&**tenant) || t.max_inflight.contains_key(&**tenant)
        });
        if named || &**tenant == ANONYMOUS {
            Arc::clone(tenant)
        } else {
            Arc::from(router_flow::OVERFLOW_TENANT)
        }
    }

    fn weight(&self, tenant: &str) -> NonZeroU32 {
        let weight = self.config.tenants.as_ref().map_or(1, |t| t.weight(tenant));
        NonZeroU32::new(weight).unwrap_or(NonZeroU32::MIN)
    }
}

impl ModelFlow {
    /// What flow control would do with a request of `class` whose dry-run selection
    /// gave `selected`, and why, for `/explain`.
    pub(crate) fn explain(
        &self,
        class: &Class,
        selected: &Result<Selection, SelectError>,
    ) -> serde_json::Value {
        let cap = self
            .config
            .tenants
            .as_ref()
            .and_then(|t| t.cap(&class.tenant));
        let in_flight = self.ledger.as_ref().map(|l| l.in_flight(&class.tenant));
        let depth = self.room.as_ref().map(|r| r.depth());
        let waiting: usize = depth.iter().flatten().sum();
        let full = matches!(selected, Err(SelectError::AtCapacity { .. }));
        let (outcome, why) = match (&self.room, cap.zip(in_flight)) {
            (_, Some((cap, n))) if n >= cap => {
                ("refused", "the tenant has its in-flight cap's worth (429)")
            }
            (Some(room), _) if waiting >= room.settings().discipline.capacity => {
                ("refused", "the queue is full (503)")
            }
            (Some(_), _) if waiting > 0 => (
                "queued",
                "others wait in the model's queue: a new request waits behind those its band and tenant share put first",
            ),
            (Some(_), _) if full => (
                "queued",
                "every fitting bucket is at its caps: the request waits for capacity",
            ),
            (None, _) if full => (
                "refused",
                "every fitting bucket is at its caps and the model has no queue (503)",
            ),
            _ => ("selected", "flow control lets the selection stand"),
        };
        serde_json::json!({
            "tenant": &*class.tenant,
            "band": class.band,
            "tenant_in_flight": in_flight,
            "tenant_cap": cap,
            "queue_depth": depth,
            "max_wait_ms": self.config.queue.map(|q| q.max_wait_ms),
            "outcome": outcome,
            "why": why,
        })
    }
}

fn direct(selected: Result<Selection, SelectError>) -> Result<Admitted, Refusal> {
    selected
        .map(|selection| Admitted {
            selection,
            waited: None,
        })
        .map_err(Refusal::Select)
}

/// A request's kind in the queue: the buckets it fits, in order, and the adapter it
/// needs, hashed. Requests of one kind find the same engines full; the queue offers
/// capacity to one of each kind per pass, so a request whose buckets are full does not
/// hold back one whose buckets have room.
pub(crate) fn kind(resolver: &BucketResolver, request: &RequestFacts<'_>) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    if let Ok(buckets) = resolver.resolve(request.input_tokens, request.expected_peak_tokens) {
        for bucket in buckets {
            bucket.id().hash(&mut hasher);
        }
    }
    request.adapter.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests;
