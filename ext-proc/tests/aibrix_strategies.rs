//! Every `routing-strategy` an AIBrix v0.7.0 user may send, through a real Envoy and
//! kvroute-ext-proc: the ones kvroute implements route (200, the strategy echoed), the ones it
//! does not answer a 400 saying so, and session-affinity's `x-session-id` brings a client back
//! to its pod.
//!
//! Run by `make test-e2e` (needs Envoy).

mod support;

use kvroute_core::Strategy;
use support::*;

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn every_aibrix_strategy_name_routes_or_says_it_is_unsupported() {
    // Engine metrics scraped quickly, so the metric strategies have snapshots to rank.
    let s = Stack::start(
        "aibrix-strategies",
        "[engine_metrics]\nscrape_interval_ms = 200\n",
        true,
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    for strategy in Strategy::ALL {
        let name = strategy.name();
        let body = completion("study", &prompt(name, 1, 600), 2, false);
        let r = s.post("/v1/completions", &[("routing-strategy", name)], &body);
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        assert_eq!(r.header("routing-strategy"), Some(name));
        let why = r.header("x-kvroute-decision").unwrap_or_default();
        assert!(why.contains("reason="), "{name}: {why}");
    }
    for name in [
        "pd",
        "slo",
        "slo-pack-load",
        "slo-least-load",
        "slo-least-load-pulling",
        "vtc-basic",
        "prefix-cache-preble",
    ] {
        let body = completion("study", &prompt(name, 1, 600), 2, false);
        let r = s.post("/v1/completions", &[("routing-strategy", name)], &body);
        assert_eq!(r.status, 400, "{name}: {}", r.text());
        let text = r.text();
        assert!(text.contains("not supported by kvroute"), "{name}: {text}");
    }
    s.expect_in_flight(0);
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn session_affinity_brings_a_session_back_to_its_pod() {
    let s = Stack::start("session-affinity", "", true);
    let header = [("routing-strategy", "session-affinity")];
    let first = s.post(
        "/v1/completions",
        &header,
        &completion("study", &prompt("session", 1, 600), 2, false),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    let session = first
        .header("x-session-id")
        .expect("a session id for the client")
        .to_owned();
    let pod = first.header("target-pod").unwrap().to_owned();
    for q in 2..8 {
        let r = s.post(
            "/v1/completions",
            &[
                ("routing-strategy", "session-affinity"),
                ("x-session-id", session.as_str()),
            ],
            &completion("study", &prompt(&format!("other-{q}"), q, 600), 2, false),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("target-pod"), Some(pod.as_str()), "q{q}");
        assert_eq!(r.header("x-session-id"), Some(session.as_str()));
        assert!(r
            .header("x-kvroute-decision")
            .unwrap_or_default()
            .contains("reason=session_affinity"));
    }
    // A session id naming no pod: a random pod, and the id of the one chosen.
    let r = s.post(
        "/v1/completions",
        &[
            ("routing-strategy", "session-affinity"),
            ("x-session-id", "bm90LWEtcG9k"),
        ],
        &completion("study", &prompt("session", 9, 600), 2, false),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r
        .header("x-session-id")
        .is_some_and(|v| v != "bm90LWEtcG9k"));
    s.expect_in_flight(0);
}
