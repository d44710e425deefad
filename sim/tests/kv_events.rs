//! `--kv-events`: the engines' KV events feed the router's engine views, so that a router
//! index skewed away from what the engines hold no longer fools prefix-cache.

use kvroute_core::{Strategy, StrategySpec};
use kvroute_sim::study::{run_phase, PhaseResult, StudyConfig};
use kvroute_sim::workload::Scenario;

fn warm_6_2(strategy: Strategy, kv_events: bool, variant: u64) -> PhaseResult {
    let cfg = StudyConfig {
        kv_events,
        variant,
        ..StudyConfig::default()
    };
    run_phase(
        &cfg,
        Scenario::Warm { on_a: 6 },
        2,
        &StrategySpec::single(strategy),
    )
    .unwrap()
}

/// The study's warm 6/2 phase: engines warm with every family, the index says six families
/// live on A. From the index, prefix-cache piles onto A; from the engines' events it sees both
/// replicas hold every family and balances like least-request. Over four draws of the study.
#[test]
fn events_stop_the_skewed_index_from_fooling_prefix_cache() {
    for variant in 0..4 {
        check_draw(variant);
    }
}

fn check_draw(variant: u64) {
    let fooled = warm_6_2(Strategy::PrefixCache, false, variant);
    let events = warm_6_2(Strategy::PrefixCache, true, variant);
    let least_request = warm_6_2(Strategy::LeastRequest, true, variant);
    assert!(fooled.summary.within_slo < 70, "{:?}", fooled.summary);
    assert!(
        events.summary.within_slo >= least_request.summary.within_slo,
        "draw {variant}: events {:?} vs least-request {:?}",
        events.summary,
        least_request.summary
    );
    let engine_views = events
        .run
        .records
        .iter()
        .filter(|r| {
            r.decision
                .as_deref()
                .is_some_and(|d| d.contains(" view=engine"))
        })
        .count();
    assert_eq!(
        engine_views,
        events.run.records.len(),
        "every decision used the views"
    );
    // least-ttft with events: at least least-request's SLO count, TTFT P95 within 10%.
    let ttft = warm_6_2(Strategy::LeastTtft, true, variant);
    assert!(ttft.summary.within_slo >= least_request.summary.within_slo);
    let (a, b) = (
        ttft.summary.ttft_p95_s.unwrap(),
        least_request.summary.ttft_p95_s.unwrap(),
    );
    assert!(
        a <= b * 1.1,
        "draw {variant}: least-ttft P95 {a} vs least-request {b}"
    );
}
