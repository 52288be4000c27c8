//! Per-engine acceptance: caps on observed load, checked after a policy chooses.

use std::fmt;

use router_state::{Engine, EngineMetrics, EngineReportedLoadTable, Reservation};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config_error::PolicyConfigError;
use crate::error::LimitExceeded;

/// Decides whether one engine may take one more request.
///
/// Admission observes; it does not rank engines, choose replacements or change
/// buckets. Policies hold it as `Arc<dyn EngineAdmission>` and call it where their
/// selection algorithm needs it. Caps on counts the router keeps itself can also be
/// held exactly: once a policy has chosen, [`reserve`](Self::reserve) takes the
/// chosen engine's slot in one atomic step, and the dispatch holds that slot.
pub trait EngineAdmission: Send + Sync + fmt::Debug {
    /// Checks `engine` against `metrics`, the observation the policy selected on.
    ///
    /// # Errors
    /// An [`AdmissionError`] when the check itself cannot run; the pick fails with
    /// [`PickError::InvalidSignal`](crate::PickError::InvalidSignal).
    fn check(
        &self,
        engine: &Engine,
        metrics: &EngineMetrics,
    ) -> Result<AdmissionDecision, AdmissionError>;

    /// The caps checked, for explanations, when the admission is a set of caps.
    fn limits(&self) -> Option<AdmissionLimits> {
        None
    }

    /// Reserves one request on the chosen `engine` against the caps on counts this
    /// router keeps (`load`'s in-flight requests), in one atomic step with their check,
    /// so concurrent picks never take an engine past such a cap. `Ok(None)` when no
    /// such cap applies (the dispatch counts the request itself); by default none does.
    ///
    /// # Errors
    /// The cap the engine reached since it was checked (a concurrent pick took the
    /// last slot).
    fn reserve(
        &self,
        engine: &Engine,
        load: &EngineReportedLoadTable,
    ) -> Result<Option<Reservation>, LimitExceeded> {
        let _ = (engine, load);
        Ok(None)
    }
}

/// The verdict of an admission check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionDecision {
    /// The engine may take the request.
    Allow,
    /// The engine reached a cap.
    Reject(LimitExceeded),
}

/// An admission check that could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("admission check failed: {0}")]
pub struct AdmissionError(pub String);

/// Absolute per-engine caps. Each is optional; an unset cap is not checked, so the
/// default admits everything. A cap admits while the engine's metric is below it, and
/// a cap on a metric the engine has not reported (no fresh, complete report) admits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdmissionLimits {
    /// Cap on the engine's reported running requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running_requests: Option<u64>,
    /// Cap on the engine's reported waiting requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_waiting_requests: Option<u64>,
    /// Cap on the engine's reported total KV tokens (in use plus queued).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kv_tokens: Option<u64>,
    /// Cap on the engine's reported waiting uncached prompt tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_prefill_tokens: Option<u64>,
    /// Cap on the requests this router has in flight to the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight_requests: Option<u64>,
}

impl AdmissionLimits {
    /// Every cap with its configuration name and the metric it reads.
    fn caps(&self, m: &EngineMetrics) -> [(&'static str, Option<u64>, Option<u64>); 5] {
        [
            (
                "max_running_requests",
                self.max_running_requests,
                m.running_requests,
            ),
            (
                "max_waiting_requests",
                self.max_waiting_requests,
                m.waiting_requests,
            ),
            ("max_kv_tokens", self.max_kv_tokens, m.kv_tokens),
            (
                "max_pending_prefill_tokens",
                self.max_pending_prefill_tokens,
                m.pending_prefill_tokens,
            ),
            (
                "max_inflight_requests",
                self.max_inflight_requests,
                Some(m.inflight_requests),
            ),
        ]
    }

    /// Rejects caps of zero, which would admit nothing.
    ///
    /// # Errors
    /// [`PolicyConfigError::ZeroCap`] naming the first such cap.
    pub fn validate(&self) -> Result<(), PolicyConfigError> {
        match self
            .caps(&EngineMetrics::default())
            .iter()
            .find(|(_, cap, _)| *cap == Some(0))
        {
            Some((limit, _, _)) => Err(PolicyConfigError::ZeroCap { limit }),
            None => Ok(()),
        }
    }
}

impl EngineAdmission for AdmissionLimits {
    fn check(
        &self,
        _engine: &Engine,
        metrics: &EngineMetrics,
    ) -> Result<AdmissionDecision, AdmissionError> {
        for (limit, cap, observed) in self.caps(metrics) {
            if let (Some(cap), Some(observed)) = (cap, observed)
                && observed >= cap
            {
                return Ok(AdmissionDecision::Reject(LimitExceeded {
                    limit,
                    observed,
                    cap,
                }));
            }
        }
        Ok(AdmissionDecision::Allow)
    }

    fn limits(&self) -> Option<AdmissionLimits> {
        Some(*self)
    }

    fn reserve(
        &self,
        engine: &Engine,
        load: &EngineReportedLoadTable,
    ) -> Result<Option<Reservation>, LimitExceeded> {
        let Some(cap) = self.max_inflight_requests else {
            return Ok(None);
        };
        match load.try_reserve(engine.id(), cap) {
            Ok(reservation) => Ok(Some(reservation)),
            Err(observed) => Err(LimitExceeded {
                limit: "max_inflight_requests",
                observed,
                cap,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use router_state::Role;

    use super::*;

    fn engine() -> Engine {
        Engine::new("e", "http://e", "m", Role::Plain)
    }

    fn check(limits: AdmissionLimits, metrics: EngineMetrics) -> AdmissionDecision {
        limits.check(&engine(), &metrics).unwrap()
    }

    #[test]
    fn the_default_admits_everything() {
        let busy = EngineMetrics {
            running_requests: Some(u64::MAX),
            waiting_requests: Some(u64::MAX),
            kv_tokens: Some(u64::MAX),
            pending_prefill_tokens: Some(u64::MAX),
            inflight_requests: u64::MAX,
        };
        assert_eq!(
            check(AdmissionLimits::default(), busy),
            AdmissionDecision::Allow
        );
    }

    #[test]
    fn each_cap_admits_below_and_rejects_at_its_value() {
        type Case = (AdmissionLimits, fn(u64) -> EngineMetrics, &'static str);
        let cases: [Case; 5] = [
            (
                AdmissionLimits {
                    max_running_requests: Some(4),
                    ..Default::default()
                },
                |v| EngineMetrics {
                    running_requests: Some(v),
                    ..Default::default()
                },
                "max_running_requests",
            ),
            (
                AdmissionLimits {
                    max_waiting_requests: Some(4),
                    ..Default::default()
                },
                |v| EngineMetrics {
                    waiting_requests: Some(v),
                    ..Default::default()
                },
                "max_waiting_requests",
            ),
            (
                AdmissionLimits {
                    max_kv_tokens: Some(4),
                    ..Default::default()
                },
                |v| EngineMetrics {
                    kv_tokens: Some(v),
                    ..Default::default()
                },
                "max_kv_tokens",
            ),
            (
                AdmissionLimits {
                    max_pending_prefill_tokens: Some(4),
                    ..Default::default()
                },
                |v| EngineMetrics {
                    pending_prefill_tokens: Some(v),
                    ..Default::default()
                },
                "max_pending_prefill_tokens",
            ),
            (
                AdmissionLimits {
                    max_inflight_requests: Some(4),
                    ..Default::default()
                },
                |v| EngineMetrics {
                    inflight_requests: v,
                    ..Default::default()
                },
                "max_inflight_requests",
            ),
        ];
        for (limits, metrics, name) in cases {
            assert_eq!(
                check(limits, metrics(3)),
                AdmissionDecision::Allow,
                "{name} admits below"
            );
            assert_eq!(
                check(limits, metrics(4)),
                AdmissionDecision::Reject(LimitExceeded {
                    limit: name,
                    observed: 4,
                    cap: 4
                }),
                "{name} rejects at the cap"
            );
        }
    }

    #[test]
    fn unknown_reported_metrics_fail_open_but_in_flight_is_always_checked() {
        let limits = AdmissionLimits {
            max_running_requests: Some(1),
            max_waiting_requests: Some(1),
            max_kv_tokens: Some(1),
            max_pending_prefill_tokens: Some(1),
            max_inflight_requests: Some(1),
        };
        let unknown = EngineMetrics::default();
        assert_eq!(check(limits, unknown), AdmissionDecision::Allow);
        let busy_locally = EngineMetrics {
            inflight_requests: 1,
            ..unknown
        };
        assert!(
            matches!(check(limits, busy_locally), AdmissionDecision::Reject(e) if e.limit == "max_inflight_requests")
        );
    }

    #[test]
    fn unknown_fields_are_rejected_and_the_schema_lists_the_five_caps() {
        let err = serde_json::from_str::<AdmissionLimits>(r#"{"max_running":1}"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("unknown field `max_running`, expected one of"),
            "{err}"
        );
        let parsed: AdmissionLimits =
            serde_json::from_str(r#"{"max_running_requests": 64, "max_kv_tokens": 1048576, "max_inflight_requests": 64}"#)
                .unwrap();
        assert_eq!(parsed.max_kv_tokens, Some(1_048_576));
        let schema = serde_json::to_value(schemars::schema_for!(AdmissionLimits)).unwrap();
        let mut props: Vec<_> = schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        props.sort();
        assert_eq!(
            props,
            [
                "max_inflight_requests",
                "max_kv_tokens",
                "max_pending_prefill_tokens",
                "max_running_requests",
                "max_waiting_requests"
            ]
        );
        assert_eq!(schema["additionalProperties"], false);
    }

    #[test]
    fn a_zero_cap_is_a_configuration_error() {
        let limits = AdmissionLimits {
            max_waiting_requests: Some(0),
            ..Default::default()
        };
        assert_eq!(
            limits.validate().unwrap_err().to_string(),
            "admission.max_waiting_requests must be at least 1: a cap of 0 admits nothing"
        );
        assert!(AdmissionLimits::default().validate().is_ok());
    }
}
