//! Pod health: passive outlier detection from completions and active health checks, with
//! Envoy's outlier-detection rules as the model (no IO: outcomes and check results come in as
//! calls, time as the caller's [`Timestamp`]).
//!
//! A pod is in one of three ejection states:
//! - **in service**: a candidate for every strategy (unless its active checks are failing);
//! - **ejected** until a deadline, after [`HealthConfig::consecutive_5xx`] upstream errors or
//!   [`HealthConfig::consecutive_gateway_failures`] connect failures, resets or timeouts in a
//!   row (a success resets both counts; a client's cancel counts for nothing). The deadline is
//!   `base_ejection_ms × n`, capped at `max_ejection_ms`, where `n` is the number of times the
//!   pod was ejected, less one for each `base_ejection_ms` it then spent in service;
//! - **probing**: the deadline has passed; the pod is a candidate again but takes one request at
//!   a time, the probe. The probe's success puts it back in service; its failure ejects it again
//!   for longer; a cancelled or expired probe lets the next request probe.
//!
//! An ejection that would take more than [`HealthConfig::max_ejection_percent`] of any of the
//! pod's models' pods out of service is not made, except that one pod may always be ejected;
//! and one pod of every model always stays in service (a model of one pod never loses it).
//!
//! Active checks (a shell's scrape of the engine's `/metrics` or `/health`) are counted apart:
//! [`HealthConfig::unhealthy_threshold`] failed checks in a row take the pod out of service
//! (*check failing*), [`HealthConfig::healthy_threshold`] passed checks in a row bring it back.
//! A passed check also ends an ejection for gateway failures (the pod was unreachable) when the
//! checker saw the pod fail since the ejection began: it went down and came back. It never ends
//! an ejection for 5xx answers: a pod that answers its health check while failing requests is
//! exactly what outcome-based ejection is for.

use crate::ids::Ticket;
use crate::tickets::Outcome;
use crate::time::Timestamp;

/// Default upstream errors (5xx, connect failures, resets, timeouts) in a row that eject a pod:
/// Envoy's `consecutive_5xx` default.
pub const DEFAULT_CONSECUTIVE_5XX: u32 = 5;
/// Default connect failures, resets or timeouts in a row that eject a pod. Envoy counts these as
/// `consecutive_gateway_failure` (default 5, enforcement off by default); kvroute enforces them
/// at 3, because a refused connection means no engine is listening and each further request
/// sent there is a client error a router could have avoided.
pub const DEFAULT_CONSECUTIVE_GATEWAY_FAILURES: u32 = 3;
/// Default first ejection time: Envoy's `base_ejection_time` (30 s).
pub const DEFAULT_BASE_EJECTION_MS: u64 = 30_000;
/// Default longest ejection: Envoy's `max_ejection_time` (300 s).
pub const DEFAULT_MAX_EJECTION_MS: u64 = 300_000;
/// Default share of a model's pods that may be ejected at once: Envoy's `max_ejection_percent`
/// (10%; like Envoy, one pod may always be ejected).
pub const DEFAULT_MAX_EJECTION_PERCENT: u8 = 10;
/// Default failed active checks in a row that take a pod out of service (Kubernetes'
/// `failureThreshold` default).
pub const DEFAULT_UNHEALTHY_THRESHOLD: u32 = 3;
/// Default passed active checks in a row that bring it back (Kubernetes' `successThreshold`).
pub const DEFAULT_HEALTHY_THRESHOLD: u32 = 1;

/// The health rules' parameters. A threshold of 0 turns that rule off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    /// Upstream errors in a row that eject a pod (default 5; 0 = off). Every failure outcome
    /// counts: [`Outcome::Failed`], [`Outcome::ConnectFailed`], [`Outcome::Reset`],
    /// [`Outcome::Timeout`].
    pub consecutive_5xx: u32,
    /// Connect failures, resets and timeouts in a row that eject a pod (default 3; 0 = off).
    pub consecutive_gateway_failures: u32,
    /// The first ejection's length, ms (default 30 s); the n-th lasts n times as long.
    pub base_ejection_ms: u64,
    /// The longest ejection, ms (default 300 s; at least `base_ejection_ms` is used).
    pub max_ejection_ms: u64,
    /// Most pods of a model ejected at once, as a percentage of its pods (default 10; one pod
    /// may always be ejected, and one always stays in service). 0..=100.
    pub max_ejection_percent: u8,
    /// Failed active checks in a row that take a pod out of service (default 3; 0 = checks
    /// never do).
    pub unhealthy_threshold: u32,
    /// Passed active checks in a row that bring it back (default 1; 0 is taken as 1).
    pub healthy_threshold: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            consecutive_5xx: DEFAULT_CONSECUTIVE_5XX,
            consecutive_gateway_failures: DEFAULT_CONSECUTIVE_GATEWAY_FAILURES,
            base_ejection_ms: DEFAULT_BASE_EJECTION_MS,
            max_ejection_ms: DEFAULT_MAX_EJECTION_MS,
            max_ejection_percent: DEFAULT_MAX_EJECTION_PERCENT,
            unhealthy_threshold: DEFAULT_UNHEALTHY_THRESHOLD,
            healthy_threshold: DEFAULT_HEALTHY_THRESHOLD,
        }
    }
}

impl HealthConfig {
    /// The name of the first field out of range, if any.
    pub(crate) fn invalid_field(&self) -> Option<&'static str> {
        if self.base_ejection_ms == 0 {
            return Some("health.base_ejection_ms");
        }
        if self.max_ejection_percent > 100 {
            return Some("health.max_ejection_percent");
        }
        None
    }

    /// How many of `pods` pods may be out of service by ejection at once.
    pub(crate) fn max_ejected(&self, pods: usize) -> usize {
        let share = pods * usize::from(self.max_ejection_percent) / 100;
        share.max(1).min(pods.saturating_sub(1))
    }
}

/// Why a pod was ejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EjectionReason {
    /// [`HealthConfig::consecutive_5xx`] upstream errors in a row.
    Consecutive5xx,
    /// [`HealthConfig::consecutive_gateway_failures`] connect failures, resets or timeouts in a
    /// row.
    ConsecutiveGatewayFailure,
}

impl EjectionReason {
    /// Every reason, in a stable order (the order of [`PodHealth::ejections`]).
    pub const ALL: [EjectionReason; 2] = [
        EjectionReason::Consecutive5xx,
        EjectionReason::ConsecutiveGatewayFailure,
    ];

    /// The label, with Envoy's outlier-detection names.
    pub const fn as_str(self) -> &'static str {
        match self {
            EjectionReason::Consecutive5xx => "consecutive_5xx",
            EjectionReason::ConsecutiveGatewayFailure => "consecutive_gateway_failure",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// How an ejected pod came back into service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Readmission {
    /// Its probe request succeeded.
    Probe,
    /// An active check passed after the checker had seen it fail (gateway-failure ejections
    /// only).
    HealthCheck,
}

impl Readmission {
    /// The label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Readmission::Probe => "probe",
            Readmission::HealthCheck => "health_check",
        }
    }
}

/// A change of a pod's health, returned by the call that caused it (for logs and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthEvent {
    /// The pod was ejected until `until` (its `nth` ejection counting the decay).
    Ejected {
        /// Why.
        reason: EjectionReason,
        /// When the ejection ends (then one probe request at a time).
        until: Timestamp,
        /// The ejection's multiplier of `base_ejection_ms`.
        nth: u32,
    },
    /// The pod met an ejection rule, but ejecting it would have taken more of a model's pods
    /// out of service than allowed; it stays in service.
    EjectionSkipped {
        /// The rule it met.
        reason: EjectionReason,
    },
    /// The pod is back in service.
    Readmitted {
        /// What brought it back.
        by: Readmission,
    },
    /// Its active checks failed `unhealthy_threshold` times in a row: out of service.
    ChecksFailing,
    /// Its active checks passed again: back in service unless ejected.
    ChecksPassing,
}

/// A pod's health as [`crate::PodInfo`] shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodHealth {
    /// Ejected and not yet back in service (waiting out its ejection, or probing).
    pub ejected: bool,
    /// When its ejection ends, while it waits one out.
    pub ejected_until: Option<Timestamp>,
    /// Its ejection is over and one probe request at a time decides whether it is back.
    pub probing: bool,
    /// Why it is ejected, while it is.
    pub reason: Option<EjectionReason>,
    /// Ejections so far, by [`EjectionReason::ALL`] order.
    pub ejections: [u64; 2],
    /// Its active checks are failing (out of service until they pass again).
    pub checks_failing: bool,
    /// Upstream errors in a row so far.
    pub consecutive_errors: u32,
    /// Connect failures, resets and timeouts in a row so far.
    pub consecutive_gateway_failures: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    InService,
    Ejected {
        until: Timestamp,
        reason: EjectionReason,
    },
    Probing {
        reason: EjectionReason,
        probe: Option<Ticket>,
    },
}

/// Whether a pod may take a request now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// As any request.
    Yes,
    /// As its probe.
    Probe,
    /// Not at all.
    No,
}

/// What an outcome means for the pod, before the model-level cap is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Nothing,
    /// It meets an ejection rule while in service: eject if the cap allows.
    Eject(EjectionReason),
    /// Its probe failed: eject again (it is already counted as ejected).
    Reeject(EjectionReason),
    Readmitted,
}

/// One pod's health state.
#[derive(Clone, Debug)]
pub(crate) struct Health {
    state: State,
    consecutive_errors: u32,
    consecutive_gateway: u32,
    /// Ejections counted for the next length (decays while in service).
    multiplier: u32,
    /// When the pod last came back into service.
    in_service_since: Timestamp,
    ejections: [u64; 2],
    checks_failed: u32,
    checks_passed: u32,
    checks_failing: bool,
    /// A check failed since the current ejection began.
    check_failed_while_ejected: bool,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            state: State::InService,
            consecutive_errors: 0,
            consecutive_gateway: 0,
            multiplier: 0,
            in_service_since: Timestamp::ZERO,
            ejections: [0; 2],
            checks_failed: 0,
            checks_passed: 0,
            checks_failing: false,
            check_failed_while_ejected: false,
        }
    }
}

impl Health {
    /// A pod that was removed and added again keeps its ejection counts, nothing else.
    pub(crate) fn revived(ejections: [u64; 2]) -> Self {
        Health {
            ejections,
            ..Health::default()
        }
    }

    pub(crate) fn ejections(&self) -> [u64; 2] {
        self.ejections
    }

    /// Whether the pod counts against its models' ejection cap.
    pub(crate) fn is_ejected(&self) -> bool {
        !matches!(self.state, State::InService)
    }

    /// Whether the pod is in service: not ejected, checks not failing.
    pub(crate) fn in_service(&self) -> bool {
        !self.is_ejected() && !self.checks_failing
    }

    /// Whether the pod may take a request at `now`.
    pub(crate) fn admission(&self, now: Timestamp) -> Admission {
        if self.checks_failing {
            return Admission::No;
        }
        match self.state {
            State::InService => Admission::Yes,
            State::Ejected { until, .. } if until <= now => Admission::Probe,
            State::Probing { probe: None, .. } => Admission::Probe,
            _ => Admission::No,
        }
    }

    /// The pod was routed `ticket`; as its probe when [`Health::admission`] said so.
    pub(crate) fn on_routed(&mut self, ticket: Ticket, now: Timestamp) {
        if self.admission(now) != Admission::Probe {
            return;
        }
        if let State::Ejected { reason, .. } | State::Probing { reason, .. } = self.state {
            self.state = State::Probing {
                reason,
                probe: Some(ticket),
            };
        }
    }

    /// The end of an ejection, if the pod waits one out (for the router's timer).
    pub(crate) fn ejection_end(&self) -> Option<Timestamp> {
        match self.state {
            State::Ejected { until, .. } => Some(until),
            _ => None,
        }
    }

    /// Moves an ejection whose time is up to probing; true if it did.
    pub(crate) fn expire_ejection(&mut self, now: Timestamp) -> bool {
        match self.state {
            State::Ejected { until, reason } if until <= now => {
                self.state = State::Probing {
                    reason,
                    probe: None,
                };
                true
            }
            _ => false,
        }
    }

    /// A request the pod was routed ended with `outcome`.
    pub(crate) fn on_outcome(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        cfg: &HealthConfig,
    ) -> Verdict {
        match self.state {
            State::InService => {}
            State::Probing {
                reason,
                probe: Some(p),
            } if p == ticket => {
                return match failure_kind(outcome) {
                    None if outcome == Outcome::Success => Verdict::Readmitted,
                    None => {
                        // A cancel says nothing: the next request probes.
                        self.state = State::Probing {
                            reason,
                            probe: None,
                        };
                        Verdict::Nothing
                    }
                    Some(gateway) => Verdict::Reeject(if gateway {
                        EjectionReason::ConsecutiveGatewayFailure
                    } else {
                        reason
                    }),
                };
            }
            // Requests routed before the ejection: they decide nothing.
            _ => return Verdict::Nothing,
        }
        match failure_kind(outcome) {
            None if outcome == Outcome::Success => {
                self.consecutive_errors = 0;
                self.consecutive_gateway = 0;
                Verdict::Nothing
            }
            None => Verdict::Nothing,
            Some(gateway) => {
                self.consecutive_errors = self.consecutive_errors.saturating_add(1);
                if gateway {
                    self.consecutive_gateway = self.consecutive_gateway.saturating_add(1);
                }
                let met = |n: u32, threshold: u32| threshold > 0 && n >= threshold;
                if met(self.consecutive_gateway, cfg.consecutive_gateway_failures) {
                    Verdict::Eject(EjectionReason::ConsecutiveGatewayFailure)
                } else if met(self.consecutive_errors, cfg.consecutive_5xx) {
                    Verdict::Eject(EjectionReason::Consecutive5xx)
                } else {
                    Verdict::Nothing
                }
            }
        }
    }

    /// A ticket of the pod ended without an outcome (expired or detached): if it was the
    /// probe, the next request probes.
    pub(crate) fn forget_probe(&mut self, ticket: Ticket) {
        if let State::Probing {
            reason,
            probe: Some(p),
        } = self.state
        {
            if p == ticket {
                self.state = State::Probing {
                    reason,
                    probe: None,
                };
            }
        }
    }

    /// Ejects the pod at `now` and says until when.
    pub(crate) fn eject(
        &mut self,
        reason: EjectionReason,
        now: Timestamp,
        cfg: &HealthConfig,
    ) -> HealthEvent {
        if matches!(self.state, State::InService) {
            let served = now.millis_since(self.in_service_since) / cfg.base_ejection_ms;
            let decay = u32::try_from(served).unwrap_or(u32::MAX);
            self.multiplier = self.multiplier.saturating_sub(decay);
        }
        self.multiplier = self.multiplier.saturating_add(1);
        let length = cfg
            .base_ejection_ms
            .saturating_mul(u64::from(self.multiplier))
            .min(cfg.max_ejection_ms.max(cfg.base_ejection_ms));
        let until = now.add_millis(length);
        self.state = State::Ejected { until, reason };
        self.ejections[reason.index()] += 1;
        self.consecutive_errors = 0;
        self.consecutive_gateway = 0;
        self.check_failed_while_ejected = false;
        HealthEvent::Ejected {
            reason,
            until,
            nth: self.multiplier,
        }
    }

    /// Starts the failure counts over (after an ejection the caps forbade: the next one is
    /// considered after as many failures again, not at every failure).
    pub(crate) fn reset_counts(&mut self) {
        self.consecutive_errors = 0;
        self.consecutive_gateway = 0;
    }

    /// Puts the pod back in service at `now`.
    pub(crate) fn readmit(&mut self, by: Readmission, now: Timestamp) -> HealthEvent {
        self.state = State::InService;
        self.in_service_since = now;
        self.consecutive_errors = 0;
        self.consecutive_gateway = 0;
        HealthEvent::Readmitted { by }
    }

    /// An active check of the pod passed or failed at `now`.
    pub(crate) fn on_check(
        &mut self,
        passed: bool,
        now: Timestamp,
        cfg: &HealthConfig,
    ) -> Option<HealthEvent> {
        if !passed {
            self.checks_passed = 0;
            self.checks_failed = self.checks_failed.saturating_add(1);
            if self.is_ejected() {
                self.check_failed_while_ejected = true;
            }
            let threshold = cfg.unhealthy_threshold;
            if !self.checks_failing && threshold > 0 && self.checks_failed >= threshold {
                self.checks_failing = true;
                return Some(HealthEvent::ChecksFailing);
            }
            return None;
        }
        self.checks_failed = 0;
        self.checks_passed = self.checks_passed.saturating_add(1);
        let mut event = None;
        if self.checks_failing && self.checks_passed >= cfg.healthy_threshold.max(1) {
            self.checks_failing = false;
            event = Some(HealthEvent::ChecksPassing);
        }
        let unreachable = match self.state {
            State::Ejected { reason, .. } | State::Probing { reason, .. } => {
                reason == EjectionReason::ConsecutiveGatewayFailure
            }
            State::InService => false,
        };
        if unreachable && self.check_failed_while_ejected && !self.checks_failing {
            event = Some(self.readmit(Readmission::HealthCheck, now));
        }
        event
    }

    /// The public view.
    pub(crate) fn view(&self) -> PodHealth {
        let (ejected_until, probing, reason) = match self.state {
            State::InService => (None, false, None),
            State::Ejected { until, reason } => (Some(until), false, Some(reason)),
            State::Probing { reason, .. } => (None, true, Some(reason)),
        };
        PodHealth {
            ejected: self.is_ejected(),
            ejected_until,
            probing,
            reason,
            ejections: self.ejections,
            checks_failing: self.checks_failing,
            consecutive_errors: self.consecutive_errors,
            consecutive_gateway_failures: self.consecutive_gateway,
        }
    }
}

/// `None` for outcomes that are not failures; `Some(true)` for gateway failures (the pod was
/// not reached or did not answer), `Some(false)` for an error answer.
fn failure_kind(outcome: Outcome) -> Option<bool> {
    match outcome {
        Outcome::Success | Outcome::Cancelled => None,
        Outcome::Failed => Some(false),
        Outcome::ConnectFailed | Outcome::Reset | Outcome::Timeout => Some(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn the_cap_lets_one_pod_go_and_keeps_one() {
        let c = HealthConfig::default();
        assert_eq!(c.max_ejected(1), 0);
        assert_eq!(c.max_ejected(2), 1);
        assert_eq!(c.max_ejected(10), 1);
        assert_eq!(c.max_ejected(30), 3);
        let all = HealthConfig {
            max_ejection_percent: 100,
            ..c
        };
        assert_eq!(all.max_ejected(4), 3);
    }

    #[test]
    fn errors_in_a_row_eject_and_a_success_resets_the_count() {
        let c = HealthConfig::default();
        let mut h = Health::default();
        for i in 0..4 {
            assert_eq!(
                h.on_outcome(Ticket(i), Outcome::Failed, &c),
                Verdict::Nothing
            );
        }
        assert_eq!(
            h.on_outcome(Ticket(4), Outcome::Success, &c),
            Verdict::Nothing
        );
        assert_eq!(
            h.on_outcome(Ticket(5), Outcome::Cancelled, &c),
            Verdict::Nothing
        );
        for i in 6..10 {
            assert_eq!(
                h.on_outcome(Ticket(i), Outcome::Failed, &c),
                Verdict::Nothing
            );
        }
        assert_eq!(
            h.on_outcome(Ticket(10), Outcome::Failed, &c),
            Verdict::Eject(EjectionReason::Consecutive5xx)
        );
        let mut g = Health::default();
        g.on_outcome(Ticket(0), Outcome::ConnectFailed, &c);
        g.on_outcome(Ticket(1), Outcome::Reset, &c);
        assert_eq!(
            g.on_outcome(Ticket(2), Outcome::Timeout, &c),
            Verdict::Eject(EjectionReason::ConsecutiveGatewayFailure)
        );
    }

    #[test]
    fn ejections_grow_cap_and_decay_in_service() {
        let c = HealthConfig::default();
        let mut h = Health::default();
        let until = |e| match e {
            HealthEvent::Ejected { until, .. } => until,
            other => panic!("{other:?}"),
        };
        let reason = EjectionReason::Consecutive5xx;
        assert_eq!(until(h.eject(reason, t(0), &c)), t(30_000));
        h.expire_ejection(t(30_000));
        // A failed probe: twice as long.
        assert_eq!(until(h.eject(reason, t(30_000), &c)), t(90_000));
        for _ in 0..20 {
            h.eject(reason, t(100_000), &c);
        }
        assert_eq!(until(h.eject(reason, t(100_000), &c)), t(400_000), "capped");
        h.readmit(Readmission::Probe, t(400_000));
        // 23 ejections, then 10 base periods in service: counted as the 14th.
        let e = h.eject(reason, t(700_000), &c);
        assert!(matches!(e, HealthEvent::Ejected { nth: 14, .. }), "{e:?}");
    }

    #[test]
    fn an_ejected_pod_takes_one_probe_and_its_outcome_decides() {
        let c = HealthConfig::default();
        let mut h = Health::default();
        h.eject(EjectionReason::Consecutive5xx, t(0), &c);
        assert_eq!(h.admission(t(29_999)), Admission::No);
        assert_eq!(h.admission(t(30_000)), Admission::Probe);
        h.on_routed(Ticket(7), t(30_000));
        assert_eq!(h.admission(t(30_001)), Admission::No, "one probe at a time");
        // An older request's failure decides nothing.
        assert_eq!(
            h.on_outcome(Ticket(3), Outcome::Failed, &c),
            Verdict::Nothing
        );
        assert_eq!(
            h.on_outcome(Ticket(7), Outcome::Cancelled, &c),
            Verdict::Nothing
        );
        assert_eq!(
            h.admission(t(30_002)),
            Admission::Probe,
            "a cancel frees the probe"
        );
        h.on_routed(Ticket(8), t(30_002));
        assert_eq!(
            h.on_outcome(Ticket(8), Outcome::ConnectFailed, &c),
            Verdict::Reeject(EjectionReason::ConsecutiveGatewayFailure)
        );
        h.eject(EjectionReason::ConsecutiveGatewayFailure, t(30_003), &c);
        assert_eq!(h.admission(t(90_003)), Admission::Probe);
        h.on_routed(Ticket(9), t(90_003));
        h.forget_probe(Ticket(9));
        h.on_routed(Ticket(10), t(90_004));
        assert_eq!(
            h.on_outcome(Ticket(10), Outcome::Success, &c),
            Verdict::Readmitted
        );
    }

    #[test]
    fn checks_take_a_pod_out_and_end_only_unreachable_ejections_they_saw() {
        let c = HealthConfig::default();
        let mut h = Health::default();
        assert_eq!(h.on_check(false, t(0), &c), None);
        assert_eq!(h.on_check(false, t(1), &c), None);
        assert_eq!(
            h.on_check(false, t(2), &c),
            Some(HealthEvent::ChecksFailing)
        );
        assert_eq!(h.admission(t(2)), Admission::No);
        assert_eq!(h.on_check(true, t(3), &c), Some(HealthEvent::ChecksPassing));
        assert_eq!(h.admission(t(3)), Admission::Yes);

        // Ejected for 5xx: a passing check changes nothing.
        h.eject(EjectionReason::Consecutive5xx, t(10), &c);
        h.on_check(false, t(11), &c);
        assert_eq!(h.on_check(true, t(12), &c), None);
        assert_eq!(h.admission(t(12)), Admission::No);

        // Ejected as unreachable: a pass after a failure ends it; a pass alone does not.
        let mut g = Health::default();
        g.eject(EjectionReason::ConsecutiveGatewayFailure, t(0), &c);
        assert_eq!(g.on_check(true, t(1), &c), None);
        g.on_check(false, t(2), &c);
        assert_eq!(
            g.on_check(true, t(3), &c),
            Some(HealthEvent::Readmitted {
                by: Readmission::HealthCheck
            })
        );
        assert_eq!(g.admission(t(3)), Admission::Yes);
    }
}
