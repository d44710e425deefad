//! Issue 6's evidence, simulated: `least-ttft` against random, least-request and prefix-cache on
//! every phase of the study, and on variants it was not built from (1.5× the arrival rate,
//! every prior off by ±50%). Skipped in debug builds like the fidelity tests.

use kvroute_core::{Strategy, StrategySpec, TtftConfig};
use kvroute_sim::study::{run_phase, PhaseResult, StudyConfig};
use kvroute_sim::workload::Scenario;

const BASELINES: [Strategy; 3] = [
    Strategy::Random,
    Strategy::LeastRequest,
    Strategy::PrefixCache,
];

struct Row {
    label: String,
    slo: usize,
    best_slo: usize,
    ttft: f64,
    best_ttft: f64,
    hit: f64,
    least_request_hit: f64,
}

fn run(cfg: &StudyConfig, scenario: Scenario, round: u8, strategy: Strategy) -> PhaseResult {
    run_phase(cfg, scenario, round, &StrategySpec::single(strategy))
        .expect("valid study configuration")
}

/// least-ttft and the best baseline, phase by phase.
fn compare(cfg: &StudyConfig) -> Vec<Row> {
    let mut rows = Vec::new();
    for round in [1, 2] {
        for scenario in Scenario::study(round) {
            let ours = run(cfg, scenario, round, Strategy::LeastTtft);
            let base: Vec<PhaseResult> = BASELINES
                .iter()
                .map(|s| run(cfg, scenario, round, *s))
                .collect();
            let ttft = |p: &PhaseResult| p.summary.ttft_p95_s.unwrap_or(f64::INFINITY);
            let hit = |p: &PhaseResult| p.summary.token_hit.unwrap_or(0.0) * 100.0;
            rows.push(Row {
                label: kvroute_sim::study::label(scenario, round),
                slo: ours.summary.within_slo,
                best_slo: base.iter().map(|p| p.summary.within_slo).max().unwrap_or(0),
                ttft: ttft(&ours),
                best_ttft: base.iter().map(ttft).fold(f64::INFINITY, f64::min),
                hit: hit(&ours),
                least_request_hit: hit(&base[1]),
            });
        }
    }
    for r in &rows {
        println!(
            "{:<12} least-ttft SLO {:>2} (best other {:>2})  TTFT P95 {:.3} s (best other {:.3})  hit {:.1}% (least-request {:.1}%)",
            r.label, r.slo, r.best_slo, r.ttft, r.best_ttft, r.hit, r.least_request_hit
        );
    }
    rows
}

fn scaled_priors(f: f64) -> TtftConfig {
    let d = TtftConfig::default();
    TtftConfig {
        bytes_per_token: d.bytes_per_token * f,
        prefill_tokens_per_s: d.prefill_tokens_per_s * f,
        tpot_ms: d.tpot_ms * f,
        overhead_ms: d.overhead_ms * f,
        output_tokens: d.output_tokens * f,
        ..d
    }
}

/// Hotspots and skewed or balanced warm indexes: least-ttft meets the SLO at least as often as
/// the best of the three, with a TTFT P95 within 1.1× of the best, and keeps more cache hits
/// than least-request.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run in release (make test-sim)"
)]
fn least_ttft_matches_the_best_strategy_under_hotspots_and_warm_indexes() {
    let rows = compare(&StudyConfig::default());
    for r in rows.iter().filter(|r| !r.label.starts_with("cold")) {
        assert!(
            r.slo >= r.best_slo,
            "{}: {} within SLO < {}",
            r.label,
            r.slo,
            r.best_slo
        );
        assert!(
            r.ttft <= 1.1 * r.best_ttft,
            "{}: TTFT P95 {:.3} > 1.1 × {:.3}",
            r.label,
            r.ttft,
            r.best_ttft
        );
        // Within 0.1 point: warm phases hit 93.3% whatever the strategy.
        assert!(
            r.hit >= r.least_request_hit - 0.1,
            "{}: hit {:.2}% < least-request's {:.2}%",
            r.label,
            r.hit,
            r.least_request_hit
        );
    }
}

/// Cold caches: least-ttft beats random and least-request on SLO and hits. (It does not yet
/// match prefix-cache there: it sends some repeats to the other replica when the home replica
/// is busy, paying cold prefills that delay later requests; see the closing note of issue 6.)
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run in release (make test-sim)"
)]
fn least_ttft_beats_load_only_strategies_on_cold_caches() {
    let cfg = StudyConfig::default();
    for round in [1, 2] {
        let ours = run(&cfg, Scenario::Cold, round, Strategy::LeastTtft);
        for s in [Strategy::Random, Strategy::LeastRequest] {
            let other = run(&cfg, Scenario::Cold, round, s);
            assert!(
                ours.summary.within_slo > other.summary.within_slo,
                "cold / {round} vs {s}"
            );
            assert!(
                ours.summary.token_hit > other.summary.token_hit,
                "cold / {round} vs {s}"
            );
        }
    }
}

/// Wrong priors: with every prior of the TTFT model off by 50% either way (the rates must be
/// learned), least-ttft still beats prefix-cache by a wide margin in every hotspot phase.
/// (It does not keep matching the best strategy there: with priors at half, hot90 drops to
/// 85/96 against least-request's 96; see the closing note of issue 6.)
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run in release (make test-sim)"
)]
fn wrong_priors_still_beat_prefix_cache_under_hotspots() {
    let base = StudyConfig::default();
    for f in [0.5, 1.5] {
        let cfg = StudyConfig {
            ttft_priors: scaled_priors(f),
            ..base.clone()
        };
        println!("-- priors x{f}");
        compare(&cfg);
        for round in [1, 2] {
            for scenario in [Scenario::Hot50, Scenario::Hot90] {
                let ours = run(&cfg, scenario, round, Strategy::LeastTtft)
                    .summary
                    .within_slo;
                let pc = run(&cfg, scenario, round, Strategy::PrefixCache)
                    .summary
                    .within_slo;
                assert!(
                    ours >= pc + 15,
                    "priors x{f} {scenario} / {round}: {ours} vs prefix-cache {pc}"
                );
            }
        }
    }
}
