//! Pod health through the router: ejection from outcomes, probes, caps, active checks, the
//! endpoint subset, and counters that survive a pod's removal.

mod common;

use common::{router_with_pods, t, MODEL};
use kvroute_core::{
    Completion, EjectionReason, HealthConfig, HealthEvent, Outcome, PodId, PodSpec, Readmission,
    RouteError, RouteRequest, Router, RouterConfig, Strategy, StrategySpec,
};

fn addr(r: &Router, pod: PodId) -> String {
    r.pod_address(pod).unwrap().to_owned()
}

fn least_request() -> RouterConfig {
    RouterConfig {
        seed: 1,
        default_strategy: StrategySpec::single(Strategy::LeastRequest),
        ..Default::default()
    }
}

/// Routes one request at `ms` and completes it at once with `outcome` if it went to `bad`, with
/// success otherwise. Returns the decision's pod and what the completion changed.
fn one(r: &mut Router, ms: u64, bad: PodId, outcome: Outcome) -> (PodId, Option<HealthEvent>) {
    let d = r.route(RouteRequest::new(MODEL, &[]), t(ms)).unwrap();
    let o = if d.pod == bad {
        outcome
    } else {
        Outcome::Success
    };
    let released = r.complete(d.ticket, Completion::new(o), t(ms)).unwrap();
    (d.pod, released.health)
}

#[test]
fn connect_failures_eject_a_pod_and_a_probe_readmits_it() {
    let (mut r, pods) = router_with_pods(2, least_request());
    let (bad, good) = (pods[0], pods[1]);
    // Least-request with nothing open picks either; the bad pod fails fast, so it keeps being
    // picked until it is ejected.
    let mut failures = 0;
    let mut ejected_at = None;
    for i in 0..20 {
        let (pod, event) = one(&mut r, i, bad, Outcome::ConnectFailed);
        if pod == bad {
            failures += 1;
        }
        if let Some(e) = event {
            assert_eq!(
                e,
                HealthEvent::Ejected {
                    reason: EjectionReason::ConsecutiveGatewayFailure,
                    until: t(i + 30_000),
                    nth: 1
                }
            );
            ejected_at = Some(i);
            break;
        }
    }
    assert_eq!(failures, 3, "three connect failures in a row eject");
    let at = ejected_at.unwrap();
    // Held open on the good pod, so that least-request prefers the other when it can.
    let held = r.route(RouteRequest::new(MODEL, &[]), t(at)).unwrap();
    assert_eq!(held.pod, good);
    let info = r.pod(bad).unwrap();
    assert!(info.health.ejected && !info.health.probing);
    assert_eq!(info.health.ejections, [0, 1]);
    for ms in (at + 1..at + 30_000).step_by(997) {
        let d = r.route(RouteRequest::new(MODEL, &[]), t(ms)).unwrap();
        assert_eq!(d.pod, good);
        assert_eq!(d.excluded, 1);
        assert!(d.to_string().contains(" excluded=1"));
        assert!(!d.to_string().contains("health_probe"));
        r.complete(d.ticket, Outcome::Success.into(), t(ms))
            .unwrap();
    }
    // The ejection is over: the timer moves the pod to probing, one request at a time.
    assert_eq!(r.poll_timeout(), Some(t(at + 30_000)));
    r.handle_timeout(t(at + 30_000));
    assert!(r.pod(bad).unwrap().health.probing);
    let probe = r
        .route(RouteRequest::new(MODEL, &[]), t(at + 30_000))
        .unwrap();
    assert_eq!(probe.pod, bad, "least-request: the empty pod");
    assert!(probe.health_probe && probe.to_string().contains("health_probe=1"));
    for _ in 0..3 {
        let d = r
            .route(RouteRequest::new(MODEL, &[]), t(at + 30_001))
            .unwrap();
        assert_eq!(d.pod, good, "one probe at a time");
        assert!(!d.health_probe);
    }
    let released = r
        .complete(probe.ticket, Outcome::Success.into(), t(at + 30_100))
        .unwrap();
    assert_eq!(
        released.health,
        Some(HealthEvent::Readmitted {
            by: Readmission::Probe
        })
    );
    let info = r.pod(bad).unwrap();
    assert!(!info.health.ejected && !info.health.probing);
    r.check_invariants().unwrap();
}

#[test]
fn a_failed_probe_ejects_again_for_longer() {
    let (mut r, pods) = router_with_pods(2, least_request());
    let bad = pods[0];
    let mut ms = 0;
    while !r.pod(bad).unwrap().health.ejected {
        one(&mut r, ms, bad, Outcome::Failed);
        ms += 1;
    }
    assert_eq!(r.pod(bad).unwrap().health.ejections, [1, 0], "5xx");
    let end = r.pod(bad).unwrap().health.ejected_until.unwrap();
    let held = r.route(RouteRequest::new(MODEL, &[]), t(ms)).unwrap();
    assert_eq!(held.pod, pods[1]);
    let d = r.route(RouteRequest::new(MODEL, &[]), end).unwrap();
    assert!(d.health_probe && d.pod == bad);
    let released = r.complete(d.ticket, Outcome::Failed.into(), end).unwrap();
    assert_eq!(
        released.health,
        Some(HealthEvent::Ejected {
            reason: EjectionReason::Consecutive5xx,
            until: end.add_millis(60_000),
            nth: 2
        })
    );
}

#[test]
fn cancels_and_client_errors_never_count_against_a_pod() {
    let (mut r, pods) = router_with_pods(2, least_request());
    for i in 0..50 {
        let (_, event) = one(&mut r, i, pods[0], Outcome::Cancelled);
        assert_eq!(event, None);
    }
    // Four failures, a success, four failures: never five in a row.
    let addr = r.pod_address(pods[0]).unwrap().to_owned();
    let only = [addr.as_str()];
    for (i, o) in [Outcome::Failed; 4]
        .into_iter()
        .chain([Outcome::Success])
        .chain([
            Outcome::Reset,
            Outcome::Failed,
            Outcome::Failed,
            Outcome::Failed,
        ])
        .enumerate()
    {
        let req = RouteRequest::new(MODEL, &[]).with_endpoint_subset(&only);
        let d = r.route(req, t(100)).unwrap();
        let pod = d.pod;
        let released = r.complete(d.ticket, o.into(), t(100)).unwrap();
        assert_eq!(released.health, None, "{i}: {pod}");
    }
    assert!(r.pods().iter().all(|p| !p.health.ejected));
}

#[test]
fn ejection_keeps_one_pod_of_every_model_in_service() {
    // Both pods of a model fail: the first is ejected, the second stays.
    let (mut r, pods) = router_with_pods(2, least_request());
    let mut events = vec![];
    for i in 0..40 {
        let d = r.route(RouteRequest::new(MODEL, &[]), t(i)).unwrap();
        let released = r.complete(d.ticket, Outcome::Reset.into(), t(i)).unwrap();
        events.extend(released.health);
    }
    let ejected = pods
        .iter()
        .filter(|p| r.pod(**p).unwrap().health.ejected)
        .count();
    assert_eq!(ejected, 1);
    let skipped = events
        .iter()
        .filter(|e| matches!(e, HealthEvent::EjectionSkipped { .. }))
        .count();
    // The first pod to fail `threshold` times in a row is ejected (the other had fewer); the
    // one that stays then takes every request, and its count restarts at each skipped
    // ejection: one report per `threshold` of its failures, those before the ejection
    // included, not one per failure.
    let threshold = HealthConfig::default().consecutive_gateway_failures as usize;
    assert_eq!(skipped, (40 - threshold) / threshold, "{events:?}");

    // A model of one pod never loses it.
    let (mut single, pods) = router_with_pods(1, least_request());
    for i in 0..20 {
        one(&mut single, i, pods[0], Outcome::ConnectFailed);
    }
    assert!(!single.pod(pods[0]).unwrap().health.ejected);

    // 10% of 30 pods: three at most.
    let (mut many, pods) = router_with_pods(30, least_request());
    for (i, &p) in pods.iter().enumerate().take(5) {
        for k in 0..3 {
            let at = (i * 10 + k) as u64;
            // Route to `p` directly through a one-pod subset.
            let addr = many.pod_address(p).unwrap().to_owned();
            let subset = [addr.as_str()];
            let d = many
                .route(
                    RouteRequest::new(MODEL, &[]).with_endpoint_subset(&subset),
                    t(at),
                )
                .unwrap();
            many.complete(d.ticket, Outcome::ConnectFailed.into(), t(at))
                .unwrap();
        }
    }
    let ejected = many.pods().iter().filter(|p| p.health.ejected).count();
    assert_eq!(ejected, 3);
}

#[test]
fn failing_checks_take_a_pod_out_and_a_pass_brings_it_back() {
    let (mut r, pods) = router_with_pods(2, least_request());
    let cfg = HealthConfig::default();
    for i in 0..cfg.unhealthy_threshold {
        let e = r
            .report_health_check(pods[0], false, t(u64::from(i)))
            .unwrap();
        let last = i + 1 == cfg.unhealthy_threshold;
        assert_eq!(e, last.then_some(HealthEvent::ChecksFailing));
    }
    for ms in 10..30 {
        let d = r.route(RouteRequest::new(MODEL, &[]), t(ms)).unwrap();
        assert_eq!(d.pod, pods[1]);
        assert_eq!(d.excluded, 1);
    }
    // With the other pod failing too, nothing is left.
    for _ in 0..cfg.unhealthy_threshold {
        r.report_health_check(pods[1], false, t(40)).unwrap();
    }
    assert_eq!(
        r.route(RouteRequest::new(MODEL, &[]), t(41)).unwrap_err(),
        RouteError::NoReadyPod
    );
    assert_eq!(
        r.report_health_check(pods[0], true, t(50)).unwrap(),
        Some(HealthEvent::ChecksPassing)
    );
    assert_eq!(
        r.route(RouteRequest::new(MODEL, &[]), t(51)).unwrap().pod,
        pods[0]
    );
    // An ejection for unreachability ends with a check that passes after one that failed.
    let (mut r, pods) = router_with_pods(2, least_request());
    let mut ms = 0;
    while !r.pod(pods[0]).unwrap().health.ejected {
        one(&mut r, ms, pods[0], Outcome::ConnectFailed);
        ms += 1;
    }
    assert_eq!(r.report_health_check(pods[0], true, t(ms)).unwrap(), None);
    r.report_health_check(pods[0], false, t(ms + 1000)).unwrap();
    assert_eq!(
        r.report_health_check(pods[0], true, t(ms + 2000)).unwrap(),
        Some(HealthEvent::Readmitted {
            by: Readmission::HealthCheck
        })
    );
    assert!(!r.pod(pods[0]).unwrap().health.ejected);
}

#[test]
fn an_expired_probe_lets_the_next_request_probe() {
    let config = RouterConfig {
        ticket_ttl_ms: 1_000,
        ..least_request()
    };
    let (mut r, pods) = router_with_pods(2, config);
    let mut ms = 0;
    while !r.pod(pods[0]).unwrap().health.ejected {
        one(&mut r, ms, pods[0], Outcome::Timeout);
        ms += 1;
    }
    let end = r.pod(pods[0]).unwrap().health.ejected_until.unwrap();
    let probe = r
        .route(
            RouteRequest::new(MODEL, &[]).with_endpoint_subset(&[&*addr(&r, pods[0])]),
            end,
        )
        .unwrap();
    assert!(probe.health_probe);
    let later = end.add_millis(1_000);
    // Held open on the other pod (the probe is out), so least-request prefers the probed one.
    let held = r
        .route(RouteRequest::new(MODEL, &[]), end.add_millis(999))
        .unwrap();
    assert_eq!(held.pod, pods[1]);
    r.handle_timeout(later);
    assert!(!r.is_open(probe.ticket), "expired");
    let next = r.route(RouteRequest::new(MODEL, &[]), later).unwrap();
    assert!(next.health_probe && next.pod == pods[0]);
    r.check_invariants().unwrap();
}

#[test]
fn the_endpoint_subset_restricts_the_candidates() {
    let (mut r, pods) = router_with_pods(3, least_request());
    let b = r.pod_address(pods[1]).unwrap().to_owned();
    let subset = [b.as_str(), "10.9.9.9:1"];
    for ms in 0..10 {
        let d = r
            .route(
                RouteRequest::new(MODEL, &[]).with_endpoint_subset(&subset),
                t(ms),
            )
            .unwrap();
        assert_eq!(d.pod, pods[1]);
    }
    for none in [&["10.9.9.9:1"][..], &[][..]] {
        assert_eq!(
            r.route(
                RouteRequest::new(MODEL, &[]).with_endpoint_subset(none),
                t(20)
            )
            .unwrap_err(),
            RouteError::NoPodInSubset
        );
    }
    // A pod out of service in the subset is no candidate either.
    r.set_pod_ready(pods[1], false).unwrap();
    assert_eq!(
        r.route(
            RouteRequest::new(MODEL, &[]).with_endpoint_subset(&subset),
            t(30)
        )
        .unwrap_err(),
        RouteError::NoPodInSubset
    );
}

#[test]
fn a_pod_removed_and_added_again_keeps_its_counters() {
    let (mut r, pods) = router_with_pods(2, least_request());
    let mut ms = 0;
    while !r.pod(pods[0]).unwrap().health.ejected {
        one(&mut r, ms, pods[0], Outcome::ConnectFailed);
        ms += 1;
    }
    let before = r.pod(pods[0]).unwrap();
    assert!(before.routed >= 3);
    r.remove_pod(pods[0]).unwrap();
    let again = r
        .add_pod(
            MODEL,
            PodSpec {
                name: &before.name,
                address: "10.0.0.99:8000",
                ready: true,
            },
        )
        .unwrap();
    assert_ne!(again, pods[0], "a new id");
    let info = r.pod(again).unwrap();
    assert_eq!(info.routed, before.routed);
    assert_eq!(info.health.ejections, before.health.ejections);
    assert!(!info.health.ejected, "but not its ejection");
}
