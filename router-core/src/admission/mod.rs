//! Admission under saturation: when no pod can meet a model's TTFT target, a request is queued
//! or shed instead of routed, by priority, fairly between tenants.
//!
//! ## Contract
//! - **Off unless asked for.** A model has no policy until [`crate::Router::set_admission`]
//!   gives it one; without one [`crate::Router::admit`] routes exactly as
//!   [`crate::Router::route`] does.
//! - **Room.** A pod has room for a request when it is *in time*: its predicted TTFT for the
//!   request (the `least-ttft` model's, whatever the strategy) is within the target and its
//!   engine does not report saturation by llm-d's detector's signals (a fresh snapshot with at
//!   least [`AdmissionPolicy::queue_depth_threshold`] waiting requests or KV usage at least
//!   [`AdmissionPolicy::kv_usage_threshold`]: a guard against a prediction that has gone
//!   wrong). It also has room when nothing is in front of the request there, so that holding
//!   it could only make it later: the pod is idle (nothing in flight from this router, and
//!   with a fresh snapshot nothing running or waiting in its engine), or it is predicted to
//!   start the request's prefill at once (no slot wait, no prefill backlog) and its engine is
//!   not over those thresholds. The predicted TTFT is then the request's own prefill, which
//!   only priors that overestimate can put over the target, and the model must serve such
//!   requests to learn. The model is **saturated** for the request when no candidate has room.
//! - **Routing among the pods with room.** Below saturation, with nothing queued, the request
//!   is routed as [`crate::Router::route`] would, except that `least-ttft` chooses only among
//!   the pods in time, failing those the pods with room (its cost makes it prefer a pod that
//!   starts late but stalls less; with a target to meet, that is a request lost). When every
//!   pod is in time the decision is `route`'s (the same PRNG draws).
//! - **Priority** is an integer, higher first, as the Gateway API Inference Extension's
//!   `InferenceObjective` priority: a negative priority is *sheddable*. Shells map names to it
//!   ([`Priority::parse`]: `critical` 1, `standard` 0, `sheddable` -1).
//! - A sheddable request is shed ([`ShedReason::Saturated`]) whenever it would have to wait (the
//!   model is saturated for it, or requests are queued); it never queues. Others queue, up to
//!   [`AdmissionPolicy::max_queue`] per model ([`ShedReason::QueueFull`] beyond it), each until
//!   its deadline ([`ShedReason::Deadline`], from [`crate::Router::expire_queued`]).
//! - **Dispatch** is pulled: after anything that frees capacity (a completion, a first token,
//!   an engine snapshot, a new arrival) the shell asks [`crate::Router::next_queued`] for the
//!   request to try and offers it with [`crate::Router::dispatch`], until one stays queued.
//!   Order: highest priority first; within one, tenants in turn, each tenant's requests
//!   first in, first out.
//! - **The target counts the wait.** A queued request is dispatched once a pod is predicted to
//!   start it within what is left of the target after its wait; when pods could start requests
//!   within the target but not this one within what it has left, a standard request is shed
//!   ([`ShedReason::Late`]: it would miss its target anyway, and its slot serves one that will
//!   not) and a critical one (priority > 0) is served late.
//! - **Retry-After**: a shed carries the time until the best pod's predicted TTFT would meet the
//!   target (at least a second), for the shell's `Retry-After`.

mod queue;

pub(crate) use queue::AdmissionQueue;

/// A model's admission policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdmissionPolicy {
    /// The TTFT target, ms: a request no pod is predicted to start within it waits or is shed.
    pub ttft_target_ms: u32,
    /// Requests held per model at most.
    pub max_queue: u32,
    /// Longest a request is held, ms.
    pub queue_timeout_ms: u64,
    /// An engine reporting at least this many waiting requests (fresh snapshot) has no room,
    /// whatever the prediction (llm-d's saturation detector's queue-depth threshold, default
    /// 5). 0 turns this guard off.
    pub queue_depth_threshold: u32,
    /// An engine reporting at least this KV-cache usage has no room (llm-d's default 0.8).
    pub kv_usage_threshold: f64,
}

impl Default for AdmissionPolicy {
    fn default() -> Self {
        AdmissionPolicy {
            ttft_target_ms: 2_000,
            max_queue: 256,
            queue_timeout_ms: 30_000,
            queue_depth_threshold: 5,
            kv_usage_threshold: 0.8,
        }
    }
}

/// Why a policy is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionPolicyError {
    /// No such model.
    #[error("unknown model {0:?}")]
    UnknownModel(String),
    /// A zero TTFT target.
    #[error("ttft_target_ms must be at least 1")]
    ZeroTarget,
    /// A zero queue timeout.
    #[error("queue_timeout_ms must be at least 1")]
    ZeroTimeout,
    /// A KV usage threshold outside (0, 1].
    #[error("kv_usage_threshold must be in (0, 1], got {0}")]
    KvThreshold(String),
}

impl AdmissionPolicy {
    /// Checks the values.
    pub fn validate(&self) -> Result<(), AdmissionPolicyError> {
        if self.ttft_target_ms == 0 {
            return Err(AdmissionPolicyError::ZeroTarget);
        }
        if self.queue_timeout_ms == 0 {
            return Err(AdmissionPolicyError::ZeroTimeout);
        }
        let kv = self.kv_usage_threshold;
        if !(kv > 0.0 && kv <= 1.0) {
            return Err(AdmissionPolicyError::KvThreshold(kv.to_string()));
        }
        Ok(())
    }
}

/// Named priorities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Priority;

impl Priority {
    /// `critical`.
    pub const CRITICAL: i32 = 1;
    /// `standard` (a request that names none).
    pub const STANDARD: i32 = 0;
    /// `sheddable`.
    pub const SHEDDABLE: i32 = -1;

    /// A header value: an integer, or `critical` / `standard` / `sheddable` (any case; GIE's
    /// criticality names). `None` for anything else.
    pub fn parse(value: &str) -> Option<i32> {
        let v = value.trim();
        if let Ok(n) = v.parse::<i32>() {
            return Some(n);
        }
        match v.to_ascii_lowercase().as_str() {
            "critical" => Some(Priority::CRITICAL),
            "standard" => Some(Priority::STANDARD),
            "sheddable" => Some(Priority::SHEDDABLE),
            _ => None,
        }
    }
}

/// A request held in a model's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueId(pub u64);

/// Why a request was not served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShedReason {
    /// Sheddable, and it would have had to wait.
    Saturated,
    /// The model's queue was full.
    QueueFull,
    /// It waited until its deadline.
    Deadline,
    /// It waited so long that no pod could start it within the target any more, while others
    /// could be served (a standard request; a critical one is served late instead).
    Late,
}

impl ShedReason {
    /// A short label (`saturated`, `queue_full`, `deadline`, `late`) for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::Saturated => "saturated",
            ShedReason::QueueFull => "queue_full",
            ShedReason::Deadline => "deadline",
            ShedReason::Late => "late",
        }
    }
}

/// A request turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shed {
    /// Why.
    pub reason: ShedReason,
    /// When to try again, ms (at least 1,000).
    pub retry_after_ms: u64,
}

/// What [`crate::Router::admit`] and [`crate::Router::dispatch`] did with a request.
#[derive(Clone, Debug)]
pub enum Admitted {
    /// Routed now: the decision, as [`crate::Router::route`] gives it.
    Routed(crate::Decision),
    /// Held: offer it again with [`crate::Router::dispatch`] when capacity frees.
    Queued(QueueId),
    /// Turned away.
    Shed(Shed),
}

/// A model's admission state inside the router.
#[derive(Debug, Default)]
pub(crate) struct ModelAdmission {
    pub(crate) policy: Option<AdmissionPolicy>,
    pub(crate) queue: AdmissionQueue,
    pub(crate) stats: AdmissionStats,
}

/// Counters of one model's admission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Requests routed at once by [`crate::Router::admit`] (policy on).
    pub admitted: u64,
    /// Requests queued.
    pub queued: u64,
    /// Queued requests later routed.
    pub dispatched: u64,
    /// Queued requests the shell cancelled (the client left).
    pub cancelled: u64,
    /// Requests shed because sheddable under saturation.
    pub shed_saturated: u64,
    /// Requests shed because the queue was full.
    pub shed_queue_full: u64,
    /// Queued requests shed at their deadline.
    pub shed_deadline: u64,
    /// Queued requests shed because they could no longer start within the target.
    pub shed_late: u64,
    /// Requests queued now.
    pub queue_len: u64,
}

impl AdmissionStats {
    pub(crate) fn count_shed(&mut self, reason: ShedReason) {
        match reason {
            ShedReason::Saturated => self.shed_saturated += 1,
            ShedReason::QueueFull => self.shed_queue_full += 1,
            ShedReason::Deadline => self.shed_deadline += 1,
            ShedReason::Late => self.shed_late += 1,
        }
    }
}

/// What the saturation check needs of one candidate.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PodRoom {
    /// Predicted TTFT, ms.
    pub(crate) ttft_ms: f64,
    /// Predicted wait before the request's prefill starts (slot wait and prefill backlog), ms.
    pub(crate) queue_ms: f64,
    /// Nothing in flight from this router, and (with a fresh snapshot) nothing running or
    /// waiting in its engine.
    pub(crate) idle: bool,
    /// The engine's fresh snapshot: waiting requests and KV usage.
    pub(crate) engine: Option<(u32, Option<f64>)>,
}

/// The best predicted TTFT among the candidates, ms (infinite if none is a number).
pub(crate) fn best_ttft_ms(pods: &[PodRoom]) -> f64 {
    pods.iter()
        .map(|p| p.ttft_ms)
        .filter(|t| !t.is_nan())
        .fold(f64::INFINITY, f64::min)
}

/// Whether a pod can take the request: idle, or predicted to start its prefill at once with its
/// engine not over the thresholds (either way nothing is in front of the request, so holding
/// it cannot make it faster, only later; its TTFT is then its own prefill, and a model whose
/// priors overestimate that would otherwise hold requests that meet the target and never
/// learn), or [`in_time`].
pub(crate) fn has_room(policy: &AdmissionPolicy, pod: &PodRoom, target_ms: f64) -> bool {
    pod.idle
        || (pod.queue_ms <= 0.0 && !engine_full(policy, pod))
        || in_time(policy, pod, target_ms)
}

/// Whether the pod's fresh snapshot reports saturation by llm-d's detector's signals.
fn engine_full(policy: &AdmissionPolicy, pod: &PodRoom) -> bool {
    pod.engine.is_some_and(|(waiting, kv)| {
        (policy.queue_depth_threshold > 0 && waiting >= policy.queue_depth_threshold)
            || kv.is_some_and(|kv| kv >= policy.kv_usage_threshold)
    })
}

/// Whether a pod is predicted to start the request within `target_ms` with its engine (when a
/// fresh snapshot says) under llm-d's saturation thresholds.
pub(crate) fn in_time(policy: &AdmissionPolicy, pod: &PodRoom, target_ms: f64) -> bool {
    pod.ttft_ms <= target_ms && !engine_full(policy, pod)
}

/// Whether the candidates are saturated for a request under `policy` (no pod has room within
/// the target), and then the Retry-After for it (see the module docs).
pub(crate) fn saturated(policy: &AdmissionPolicy, pods: &[PodRoom]) -> Option<u64> {
    let target = f64::from(policy.ttft_target_ms);
    if pods.iter().any(|p| has_room(policy, p, target)) {
        return None;
    }
    let best = best_ttft_ms(pods);
    let over_ms = if best.is_finite() {
        (best - target).max(0.0).ceil() as u64
    } else {
        u64::from(policy.ttft_target_ms)
    };
    Some(over_ms.max(1_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(ttft_ms: f64, engine: Option<(u32, Option<f64>)>) -> PodRoom {
        PodRoom {
            ttft_ms,
            queue_ms: 1.0,
            idle: false,
            engine,
        }
    }

    #[test]
    fn saturated_when_no_pod_is_predicted_in_time_or_every_engine_is_full() {
        let p = AdmissionPolicy::default();
        assert_eq!(
            saturated(&p, &[room(2_500.0, None), room(1_999.0, None)]),
            None
        );
        assert_eq!(
            saturated(&p, &[room(2_500.0, None), room(4_000.0, None)]),
            Some(1_000),
            "at least a second"
        );
        assert_eq!(saturated(&p, &[room(6_500.4, None)]), Some(4_501));
        // An engine over llm-d's thresholds has no room, whatever the prediction.
        assert!(saturated(&p, &[room(100.0, Some((5, Some(0.1))))]).is_some());
        assert!(saturated(&p, &[room(100.0, Some((0, Some(0.8))))]).is_some());
        assert_eq!(saturated(&p, &[room(100.0, Some((4, Some(0.79))))]), None);
        let off = AdmissionPolicy {
            queue_depth_threshold: 0,
            ..p
        };
        assert_eq!(saturated(&off, &[room(100.0, Some((50, None)))]), None);
        assert!(saturated(&p, &[room(f64::NAN, None)]).is_some());
        // An idle pod has room, whatever the prediction.
        let idle = PodRoom {
            idle: true,
            ..room(9_000.0, Some((0, Some(0.9))))
        };
        assert_eq!(saturated(&p, &[room(6_000.0, None), idle]), None);
    }

    #[test]
    fn priorities_parse_from_numbers_and_names() {
        assert_eq!(Priority::parse(" Critical "), Some(1));
        assert_eq!(Priority::parse("sheddable"), Some(-1));
        assert_eq!(Priority::parse("standard"), Some(0));
        assert_eq!(Priority::parse("-7"), Some(-7));
        assert_eq!(Priority::parse("urgent"), None);
    }

    #[test]
    fn bad_policies_are_refused() {
        let p = AdmissionPolicy::default();
        assert!(p.validate().is_ok());
        assert!(AdmissionPolicy {
            ttft_target_ms: 0,
            ..p
        }
        .validate()
        .is_err());
        assert!(AdmissionPolicy {
            kv_usage_threshold: 1.5,
            ..p
        }
        .validate()
        .is_err());
    }
}
