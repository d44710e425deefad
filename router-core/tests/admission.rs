//! Admission under saturation: off by default, identical decisions below saturation, queueing
//! and shedding by priority, tenant turns, dispatch as capacity frees, cancels and deadlines.

mod common;

use common::{router_with_pods, study_prompt, t, MODEL};
use kvroute_core::{
    AdmissionPolicy, Admitted, BlockHash, Completion, Outcome, Priority, QueueId, RouteError,
    RouteRequest, Router, RouterConfig, ShedReason, StrategySpec, Timings,
};

fn config() -> RouterConfig {
    RouterConfig {
        seed: 11,
        ..Default::default()
    }
}

fn hashes(r: &Router, family: usize, question: u32) -> Vec<BlockHash> {
    r.hash_config()
        .hashes(study_prompt("salt", family, question).as_bytes())
}

/// Two pods of one sequence each (a second request on a pod waits for the first to end),
/// routed by least-ttft.
fn one_slot_pods(policy: Option<AdmissionPolicy>) -> Router {
    let (mut r, pods) = router_with_pods(
        2,
        RouterConfig {
            default_strategy: StrategySpec::parse("least-ttft").unwrap(),
            ..config()
        },
    );
    for p in pods {
        r.set_pod_capacity(p, 1).unwrap();
    }
    r.set_admission(MODEL, policy).unwrap();
    r
}

/// Met by an idle pod (about 2.4 s predicted for a cold study prompt), not by a busy one
/// (7.5 s and more).
fn tight() -> AdmissionPolicy {
    AdmissionPolicy {
        ttft_target_ms: 3_000,
        max_queue: 3,
        queue_timeout_ms: 5_000,
        ..AdmissionPolicy::default()
    }
}

fn routed(a: Admitted) -> kvroute_core::Decision {
    match a {
        Admitted::Routed(d) => d,
        other => panic!("expected a route, got {other:?}"),
    }
}

fn queued(a: Admitted) -> QueueId {
    match a {
        Admitted::Queued(id) => id,
        other => panic!("expected a queue, got {other:?}"),
    }
}

#[test]
fn without_a_policy_or_below_saturation_admit_is_route() {
    // The TTFT model's defaults predict about 2.4 s for a cold study prompt on an idle pod.
    let roomy = AdmissionPolicy {
        ttft_target_ms: 60_000,
        ..AdmissionPolicy::default()
    };
    for policy in [None, Some(roomy)] {
        for spec in ["prefix-cache", "least-ttft", "random", "least-request"] {
            let spec = StrategySpec::parse(spec).unwrap();
            let (mut a, _) = router_with_pods(3, config());
            let (mut b, _) = router_with_pods(3, config());
            b.set_admission(MODEL, policy).unwrap();
            let mut open = Vec::new();
            for i in 0..60u32 {
                let h = hashes(&a, (i % 5) as usize, i);
                let now = t(u64::from(i) * 3_000);
                let req = RouteRequest::new(MODEL, &h).with_strategy(&spec);
                let da = a.route(req, now).unwrap();
                let db = routed(b.admit(req, now).unwrap());
                assert_eq!((da.pod, da.reason), (db.pod, db.reason), "request {i}");
                open.push((da.ticket, db.ticket));
                if i % 2 == 1 {
                    let (ta, tb) = open.remove(0);
                    a.complete(ta, Completion::new(Outcome::Success), now)
                        .unwrap();
                    b.complete(tb, Completion::new(Outcome::Success), now)
                        .unwrap();
                }
            }
            assert_eq!(b.admission_stats(MODEL).unwrap().queued, 0);
        }
    }
}

#[test]
fn saturated_requests_queue_sheddable_ones_are_shed_and_a_full_queue_sheds() {
    let mut r = one_slot_pods(Some(tight()));
    let h = hashes(&r, 0, 0);
    let req = RouteRequest::new(MODEL, &h);
    let first = routed(r.admit(req, t(0)).unwrap());
    let second = routed(r.admit(req, t(0)).unwrap());
    assert_ne!(first.pod, second.pod, "one request per pod");
    // Both pods are busy for longer than the target.
    let sheddable = req.with_priority(Priority::SHEDDABLE, None);
    match r.admit(sheddable, t(0)).unwrap() {
        Admitted::Shed(s) => {
            assert_eq!(s.reason, ShedReason::Saturated);
            assert!(s.retry_after_ms >= 1_000);
        }
        other => panic!("{other:?}"),
    }
    let ids: Vec<QueueId> = (0..3)
        .map(|_| queued(r.admit(req, t(0)).unwrap()))
        .collect();
    match r.admit(req, t(0)).unwrap() {
        Admitted::Shed(s) => assert_eq!(s.reason, ShedReason::QueueFull),
        other => panic!("{other:?}"),
    }
    // Nothing freed: the head stays queued.
    assert_eq!(r.next_queued(MODEL), Some(ids[0]));
    assert!(matches!(
        r.dispatch(ids[0], req, t(10)).unwrap(),
        Admitted::Queued(id) if id == ids[0]
    ));
    // A completion frees a slot: the head goes there.
    r.complete(first.ticket, Completion::new(Outcome::Success), t(20))
        .unwrap();
    let d = routed(r.dispatch(ids[0], req, t(20)).unwrap());
    assert_eq!(d.pod, first.pod);
    assert_eq!(r.next_queued(MODEL), Some(ids[1]));
    assert!(matches!(
        r.dispatch(ids[1], req, t(20)).unwrap(),
        Admitted::Queued(_)
    ));
    assert_eq!(
        r.dispatch(ids[0], req, t(20)).unwrap_err(),
        RouteError::NotQueued
    );
    let s = r.admission_stats(MODEL).unwrap();
    assert_eq!(
        (
            s.admitted,
            s.queued,
            s.dispatched,
            s.shed_saturated,
            s.shed_queue_full,
            s.queue_len
        ),
        (2, 3, 1, 1, 1, 2)
    );
    // A sheddable request is shed while others wait, even if a pod frees.
    r.complete(second.ticket, Completion::new(Outcome::Success), t(30))
        .unwrap();
    assert!(matches!(
        r.admit(sheddable, t(30)).unwrap(),
        Admitted::Shed(s) if s.reason == ShedReason::Saturated
    ));
}

#[test]
fn higher_priority_first_and_tenants_take_turns() {
    let mut r = one_slot_pods(Some(AdmissionPolicy {
        max_queue: 10,
        ..tight()
    }));
    let h = hashes(&r, 0, 0);
    let req = RouteRequest::new(MODEL, &h);
    let busy = [
        routed(r.admit(req, t(0)).unwrap()),
        routed(r.admit(req, t(0)).unwrap()),
    ];
    let a1 = queued(r.admit(req.with_priority(0, Some("a")), t(1)).unwrap());
    let a2 = queued(r.admit(req.with_priority(0, Some("a")), t(2)).unwrap());
    let b1 = queued(r.admit(req.with_priority(0, Some("b")), t(3)).unwrap());
    let c1 = queued(
        r.admit(req.with_priority(Priority::CRITICAL, None), t(4))
            .unwrap(),
    );
    let mut order = Vec::new();
    let mut tickets: Vec<_> = busy.iter().map(|d| d.ticket).collect();
    let mut now = 10;
    while let Some(id) = r.next_queued(MODEL) {
        // Free one slot, then dispatch the head into it.
        let ticket = tickets.remove(0);
        r.complete(ticket, Completion::new(Outcome::Success), t(now))
            .unwrap();
        let d = routed(r.dispatch(id, req, t(now)).unwrap());
        tickets.push(d.ticket);
        order.push(id);
        now += 10;
    }
    assert_eq!(order, [c1, a1, b1, a2]);
}

#[test]
fn cancels_and_deadlines_leave_the_queue() {
    let mut r = one_slot_pods(Some(tight()));
    let h = hashes(&r, 0, 0);
    let req = RouteRequest::new(MODEL, &h);
    routed(r.admit(req, t(0)).unwrap());
    routed(r.admit(req, t(0)).unwrap());
    let gone = queued(r.admit(req, t(100)).unwrap());
    let late = queued(r.admit(req, t(200)).unwrap());
    assert!(r.cancel_queued(gone));
    assert!(!r.cancel_queued(gone), "once");
    assert_eq!(r.next_queued(MODEL), Some(late));
    assert!(r.poll_timeout().unwrap() <= t(5_200));
    let mut out = Vec::new();
    r.expire_queued(t(5_199), &mut out);
    assert!(out.is_empty());
    r.expire_queued(t(5_200), &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, late);
    assert_eq!(out[0].1.reason, ShedReason::Deadline);
    assert_eq!(r.next_queued(MODEL), None);
    let s = r.admission_stats(MODEL).unwrap();
    assert_eq!((s.cancelled, s.shed_deadline, s.queue_len), (1, 1, 0));
}

#[test]
fn queued_requests_dispatch_once_the_policy_is_removed_and_errors_take_them_out() {
    let mut r = one_slot_pods(Some(tight()));
    let h = hashes(&r, 0, 0);
    let req = RouteRequest::new(MODEL, &h);
    routed(r.admit(req, t(0)).unwrap());
    routed(r.admit(req, t(0)).unwrap());
    let a = queued(r.admit(req, t(0)).unwrap());
    let b = queued(r.admit(req, t(0)).unwrap());
    r.set_admission(MODEL, None).unwrap();
    routed(r.dispatch(a, req, t(1)).unwrap());
    for p in r.model_pods(MODEL) {
        r.set_pod_ready(p, false).unwrap();
    }
    assert_eq!(
        r.dispatch(b, req, t(2)).unwrap_err(),
        RouteError::NoReadyPod
    );
    assert_eq!(r.next_queued(MODEL), None, "answered, so no longer queued");
    assert!(r.set_admission("nope", Some(tight())).is_err());
    assert!(r
        .set_admission(
            MODEL,
            Some(AdmissionPolicy {
                ttft_target_ms: 0,
                ..tight()
            })
        )
        .is_err());
}

#[test]
fn the_target_counts_the_wait_late_standard_requests_are_shed_critical_ones_served() {
    let mut r = one_slot_pods(Some(AdmissionPolicy {
        max_queue: 10,
        ..tight()
    }));
    let h = hashes(&r, 0, 0);
    let req = RouteRequest::new(MODEL, &h);
    let busy = routed(r.admit(req, t(0)).unwrap());
    routed(r.admit(req, t(0)).unwrap());
    let standard = queued(r.admit(req, t(0)).unwrap());
    let critical = queued(
        r.admit(req.with_priority(Priority::CRITICAL, None), t(0))
            .unwrap(),
    );
    // 2.99 s later a slot frees: the freed pod (which holds the prompt) starts a request in
    // about 55 ms, more than the 10 ms either has left of its 3 s target.
    r.complete(busy.ticket, Completion::new(Outcome::Success), t(2_990))
        .unwrap();
    assert_eq!(r.next_queued(MODEL), Some(critical));
    routed(r.dispatch(critical, req, t(2_990)).unwrap());
    match r.dispatch(standard, req, t(2_990)).unwrap() {
        Admitted::Queued(_) => {} // the critical one took the slot: no room, it waits
        other => panic!("{other:?}"),
    }
    let s = r.admission_stats(MODEL).unwrap();
    assert_eq!((s.dispatched, s.shed_late), (1, 0));

    // With room and no time left, the standard request is shed.
    let mut r = one_slot_pods(Some(tight()));
    let busy = routed(r.admit(req, t(0)).unwrap());
    routed(r.admit(req, t(0)).unwrap());
    let late = queued(r.admit(req, t(0)).unwrap());
    r.complete(busy.ticket, Completion::new(Outcome::Success), t(2_990))
        .unwrap();
    match r.dispatch(late, req, t(2_990)).unwrap() {
        Admitted::Shed(s) => assert_eq!(s.reason, ShedReason::Late),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.admission_stats(MODEL).unwrap().shed_late, 1);
    assert_eq!(r.next_queued(MODEL), None);
}

#[test]
fn a_pod_that_starts_the_request_at_once_has_room_whatever_its_own_prefill() {
    // A cold study prompt is predicted at about 2.4 s on a pod with nothing in front of it:
    // over a 1 s target, but holding it could only make it later.
    let policy = AdmissionPolicy {
        ttft_target_ms: 1_000,
        ..tight()
    };
    let (mut r, pods) = router_with_pods(
        1,
        RouterConfig {
            default_strategy: StrategySpec::parse("least-ttft").unwrap(),
            ..config()
        },
    );
    r.set_pod_capacity(pods[0], 8).unwrap();
    r.set_admission(MODEL, Some(policy)).unwrap();
    let h = hashes(&r, 0, 0);
    let req = RouteRequest::new(MODEL, &h);
    let first = routed(r.admit(req, t(0)).unwrap());
    // Decoding now: a free slot and no prefill in front of the next request, but the pod
    // is not idle.
    let timings = Timings {
        first_token_ms: Some(2_000),
        ..Timings::default()
    };
    r.first_token(first.ticket, timings, t(2_000)).unwrap();
    let other = hashes(&r, 1, 0);
    let second = routed(r.admit(RouteRequest::new(MODEL, &other), t(2_100)).unwrap());
    assert_eq!(second.pod, pods[0]);
    // Behind that one's prefill, the next would start late: it waits.
    let third = hashes(&r, 2, 0);
    queued(r.admit(RouteRequest::new(MODEL, &third), t(2_100)).unwrap());
}
