//! Issue 6's evidence, simulated: `least-ttft` against random, least-request and prefix-cache on
//! every phase of the study, and on variants it was not built from (4 replicas, 1.5× the
//! arrival rate, every prior off by ±50%, other salts). Skipped in debug builds like the
//! fidelity tests.
//!
//! "The bar" in a phase: least-ttft's within-SLO count ≥ the best of the three, its TTFT P95
//! ≤ 1.1× the best of the three, and its token hit rate ≥ least-request's (within 0.1 point:
//! warm phases hit 93.3% whatever the strategy).

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

/// least-ttft and the best baseline, phase by phase (printed under `name`).
fn compare(name: &str, cfg: &StudyConfig) -> Vec<Row> {
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
    let mut out = format!("-- {name}\n");
    for r in &rows {
        out.push_str(&format!(
            "{:<12} least-ttft SLO {:>2} (best other {:>2})  TTFT P95 {:.3} s (best other {:.3})  hit {:.1}% (least-request {:.1}%)\n",
            r.label, r.slo, r.best_slo, r.ttft, r.best_ttft, r.hit, r.least_request_hit
        ));
    }
    print!("{out}");
    rows
}

/// The phases of `rows` (by label prefix, e.g. `hot`) that miss the bar, with `ttft_ratio` in
/// place of 1.1, as readable lines.
fn misses(rows: &[Row], phases: &[&str], ttft_ratio: f64) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows
        .iter()
        .filter(|r| phases.iter().any(|p| r.label.starts_with(p)))
    {
        if r.slo < r.best_slo {
            out.push(format!(
                "{}: {} within SLO < {}",
                r.label, r.slo, r.best_slo
            ));
        }
        if r.ttft > ttft_ratio * r.best_ttft {
            out.push(format!(
                "{}: TTFT P95 {:.3} > {ttft_ratio} × {:.3}",
                r.label, r.ttft, r.best_ttft
            ));
        }
        if r.hit < r.least_request_hit - 0.1 {
            out.push(format!(
                "{}: hit {:.2}% < least-request's {:.2}%",
                r.label, r.hit, r.least_request_hit
            ));
        }
    }
    out
}

const ALL: [&str; 4] = ["cold", "warm", "hot50", "hot90"];
/// Every phase but warm / 1 (see [`warm_one`]).
const ALL_BUT_WARM_ONE: [&str; 4] = ["cold", "warm / 2", "hot50", "hot90"];
const WARM_AND_HOT: [&str; 3] = ["warm", "hot50", "hot90"];

/// warm / 1 is held to a TTFT P95 of 1.4× the best instead of 1.1×. Both engines hold all
/// eight families but the index knows each on one pod only, so every pod but the indexed one
/// looks cold. least-request, blind to the index, lands on the other warm engine by chance and
/// never queues (P95 0.19 s); least-ttft stays on the indexed pod unless the other is faster
/// by more than a cold prefill and the stall it would cause, and queues there briefly a few
/// times (P95 0.25–0.26 s, all 96 within SLO).
fn warm_one(rows: &[Row]) -> Vec<String> {
    misses(rows, &["warm / 1"], 1.4)
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

fn study() -> StudyConfig {
    StudyConfig::default()
}

fn assert_none(misses: Vec<String>) {
    assert!(misses.is_empty(), "{}", misses.join("\n"));
}

/// Two replicas, all eight phases: least-ttft meets the bar (warm / 1 as in [`warm_one`]) with
/// the study's salts and with three other draws of salts and router randomness; with every
/// prior 50% high it meets it in the warm and hotspot phases (cold phases run mostly before the
/// first completion teaches anything: cold / 1 76 within SLO against prefix-cache's 89).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run in release (make test-sim)"
)]
fn least_ttft_meets_the_bar_in_every_phase() {
    let mut all = Vec::new();
    for variant in 0..=3 {
        let cfg = StudyConfig { variant, ..study() };
        let rows = compare(&format!("variant {variant}"), &cfg);
        all.extend(misses(&rows, &ALL_BUT_WARM_ONE, 1.1));
        all.extend(warm_one(&rows));
    }
    let cfg = StudyConfig {
        ttft_priors: scaled_priors(1.5),
        ..study()
    };
    all.extend(misses(&compare("priors x1.5", &cfg), &WARM_AND_HOT, 1.1));
    assert_none(all);
}

/// Ranked by predicted TTFT alone (`stall_weight` 0), least-ttft misses the bar on cold
/// caches: it sends repeats to the other replica whenever that looks a few hundred ms faster,
/// and each such cold prefill stalls every decode there (cold / 1 86 within SLO against
/// prefix-cache's 89, TTFT P95 2.45 s against 2.17 s). This is what the stall charge is for.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run in release (make test-sim)"
)]
fn without_the_stall_charge_cold_caches_miss_the_bar() {
    let cfg = StudyConfig {
        ttft_priors: TtftConfig {
            stall_weight: 0.0,
            ..TtftConfig::default()
        },
        ..study()
    };
    let rows = compare("stall_weight 0", &cfg);
    assert!(!misses(&rows, &["cold"], 1.1).is_empty());
    assert_none(misses(&rows, &["hot50", "hot90"], 1.1));
}

/// Four replicas (the study's initial states spread as documented in `workload.rs`): least-ttft
/// meets the bar in all eight phases, cold included, at the study's rate and at 1.5× it, with
/// another draw of salts and with priors 50% high; except that in warm phases its TTFT P95 is
/// up to 1.16× least-request's (0.192–0.200 s against 0.173–0.175 s, a tenth of the SLO), so
/// the warm TTFT ratio is held to 1.2× there.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run in release (make test-sim)"
)]
fn four_replicas_meet_the_bar_in_every_phase() {
    let four = StudyConfig {
        replicas: 4,
        ..study()
    };
    let mut all = Vec::new();
    let cases = [
        ("4 replicas", four.clone()),
        (
            "4 replicas, variant 1",
            StudyConfig {
                variant: 1,
                ..four.clone()
            },
        ),
        (
            "4 replicas, priors x1.5",
            StudyConfig {
                ttft_priors: scaled_priors(1.5),
                ..four.clone()
            },
        ),
    ];
    for (name, cfg) in &cases {
        let rows = compare(name, cfg);
        all.extend(misses(&rows, &["cold", "hot50", "hot90"], 1.1));
        all.extend(misses(&rows, &["warm"], 1.2));
    }
    let cfg = StudyConfig {
        rate: four.rate * 1.5,
        ..four
    };
    all.extend(misses(&compare("4 replicas, rate x1.5", &cfg), &ALL, 1.1));
    assert_none(all);
}

/// 1.5× the study's rate on the study's two replicas is past their capacity (16 sequence
/// slots, ~8 s per request: about 2 requests/s): every strategy meets the SLO for at most 40 of
/// 96 requests in every phase and the best TTFT P95 is 7–12 s, so the ordering there says
/// nothing (on four replicas the same rate is tested above).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run in release (make test-sim)"
)]
fn one_and_a_half_times_the_rate_overloads_two_replicas_for_every_strategy() {
    let cfg = StudyConfig {
        rate: study().rate * 1.5,
        ..study()
    };
    for r in compare("rate x1.5", &cfg) {
        assert!(
            r.slo.max(r.best_slo) <= 40 && r.best_ttft > 5.0,
            "{}: not overloaded ({} / {} within SLO, best TTFT P95 {:.3} s)",
            r.label,
            r.slo,
            r.best_slo,
            r.best_ttft
        );
    }
}

/// Wrong priors: with every prior of the TTFT model off by 50% either way (the rates must be
/// learned), least-ttft still beats prefix-cache by a wide margin in every hotspot phase.
/// (With priors 50% high it meets the bar in the warm and hotspot phases, above. With priors at
/// half it does not: hot90 87/96 in both rounds, hot50 94 and 91 against least-request's 95,
/// warm 92 and 95 against 96; with four replicas hot90 89/96. Half the bytes per token and
/// half the prefill rate make a cold prefill look 4–6× longer than it is, and in a hotspot
/// phase no cold prefill runs to show otherwise until the hot pod's queue has grown.)
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
        compare(&format!("priors x{f}"), &cfg);
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
