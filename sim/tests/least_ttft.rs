//! Issue 6's evidence, simulated: `least-ttft` against random, least-request and prefix-cache on
//! every phase of the study, and on variants it was not built from (4 replicas, 1.5× the
//! arrival rate, every prior off by ±50%, other salts). Ignored in builds with debug assertions
//! like the fidelity tests (`make test-sim` runs them).
//!
//! "The bar" in a phase: least-ttft's within-SLO count ≥ the best of the three, its TTFT P95
//! ≤ 1.1× the best of the three, and its token hit rate ≥ least-request's (within 0.1 point:
//! warm phases hit 93.3% whatever the strategy).

use kvroute_core::{Strategy, StrategySpec, TtftConfig};
use kvroute_sim::bar::{self, Bar, BarRow};
use kvroute_sim::cluster::Feedback;
use kvroute_sim::study::{scaled_priors, StudyConfig};

/// least-ttft against the best baseline, phase by phase (printed under `name`).
fn compare(name: &str, cfg: &StudyConfig) -> Vec<BarRow> {
    let candidate = StrategySpec::single(Strategy::LeastTtft);
    let rows = bar::compare(cfg, &candidate).expect("valid study configuration");
    let numbered: Vec<(String, BarRow)> = rows
        .iter()
        .map(|r| (cfg.variant.to_string(), r.clone()))
        .collect();
    print!(
        "-- {name}\n{}",
        bar::table(&candidate, &numbered, &Bar::default())
    );
    rows
}

/// The phases of `rows` (by label prefix, e.g. `hot`) that miss `bar`, as readable lines.
fn misses_of(rows: &[BarRow], phases: &[&str], bar: &Bar) -> Vec<String> {
    rows.iter()
        .filter(|r| phases.iter().any(|p| r.label.starts_with(p)))
        .flat_map(|r| {
            r.misses(bar)
                .into_iter()
                .map(|m| format!("{}: {m}", r.label))
        })
        .collect()
}

/// [`misses_of`] the default bar, with `ttft_ratio` in place of 1.1.
fn misses(rows: &[BarRow], phases: &[&str], ttft_ratio: f64) -> Vec<String> {
    let bar = Bar {
        ttft_ratio,
        ..Bar::default()
    };
    misses_of(rows, phases, &bar)
}

const ALL: [&str; 4] = ["cold", "warm", "hot50", "hot90"];
/// Every phase but cold / 1 (see [`least_ttft_meets_the_bar_in_every_phase`]).
const ALL_BUT_COLD_ONE: [&str; 4] = ["cold / 2", "warm", "hot50", "hot90"];

fn study() -> StudyConfig {
    StudyConfig::default()
}

fn assert_none(misses: Vec<String>) {
    assert!(misses.is_empty(), "{}", misses.join("\n"));
}

/// The phases among `phases` (by label prefix) where least-ttft's means over `draws` draws of
/// `cfg` (its salts and router randomness, `StudyConfig::variant`) miss the bar, with no
/// slack: mean within-SLO count at least the mean of each draw's best other strategy, mean
/// TTFT P95 at most 1.1× theirs (except in the phases `p95_exempt` names), mean token hits at
/// least least-request's (within 0.1 point). One draw of cold / 1 swings by a request or two
/// either way; the means do not.
fn mean_misses(
    tag: &str,
    cfg: &StudyConfig,
    draws: u64,
    phases: &[&str],
    p95_exempt: &[&str],
) -> Vec<String> {
    let mut rows = Vec::new();
    for variant in 0..draws {
        let cfg = StudyConfig {
            variant,
            ..cfg.clone()
        };
        let drawn = compare(&format!("{tag}, variant {variant}"), &cfg);
        rows.extend(drawn.into_iter().map(|r| (variant.to_string(), r)));
    }
    let bar = Bar::default();
    let mut out = Vec::new();
    let means = bar::means(&rows, &bar);
    for m in means
        .iter()
        .filter(|m| phases.iter().any(|p| m.label.starts_with(p)))
    {
        if m.slo < m.best_slo {
            out.push(format!(
                "{tag} {}: mean {} within SLO < {}",
                m.label, m.slo, m.best_slo
            ));
        }
        let exempt = p95_exempt.contains(&m.label.as_str());
        if m.ttft_p95_s > bar.ttft_ratio * m.best_ttft_p95_s && !exempt {
            out.push(format!(
                "{tag} {}: mean TTFT P95 {:.3} > {} × {:.3}",
                m.label, m.ttft_p95_s, bar.ttft_ratio, m.best_ttft_p95_s
            ));
        }
        if m.hit_percent < m.least_request_hit_percent - bar.hit_slack_points {
            out.push(format!(
                "{tag} {}: mean hits {:.1}% < least-request's {:.1}%",
                m.label, m.hit_percent, m.least_request_hit_percent
            ));
        }
    }
    out
}

/// Two replicas, all eight phases: least-ttft meets the bar on the means over eight draws (the
/// study's salts and seven others), in every phase. With every prior 50% off, either way, it
/// meets it in every phase but cold / 1, which runs mostly before the first answers teach
/// anything (means over the eight draws: priors 50% high 86.0 within SLO against 87.9; at half
/// 84.9, TTFT P95 3.31 s against 2.68 s).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run by make test-sim (--ignored)"
)]
fn least_ttft_meets_the_bar_in_every_phase() {
    let mut all = mean_misses("study", &study(), 8, &ALL, &[]);
    for f in [1.5, 0.5] {
        let cfg = StudyConfig {
            ttft_priors: scaled_priors(f),
            ..study()
        };
        let tag = format!("priors x{f}");
        all.extend(mean_misses(&tag, &cfg, 8, &ALL_BUT_COLD_ONE, &[]));
    }
    assert_none(all);
}

/// Behind Envoy (`Feedback::Envoy`) kvroute-ext-proc times at most 4 responses at once, and
/// the router learns first tokens, usage and cached tokens only from those, at their
/// completion; with `[stream_timing] max_streams = 0` (`Feedback::TotalOnly`) it is told only
/// each request's total time. Both learn the rest from engine snapshots, here every simulated
/// second (kvroute-ext-proc's default scrape interval). One draw of cold / 1 swings by a request
/// or two either way, so the bar is held by the means over twelve draws (the study's salts and
/// eleven others), in every phase and with no slack: least-ttft's mean within-SLO count at least
/// the mean of each draw's best other strategy, its mean TTFT P95 at most 1.1× theirs. One
/// exception, told total times only: in warm / 2 every request is within the SLO but the TTFT
/// P95 is about 0.5 s against 0.19 s, because no single answer says that the engine the index
/// does not credit is warm, and the engine counters tell it only over windows between idle
/// queues.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run by make test-sim (--ignored)"
)]
fn behind_envoy_feedback_keeps_the_slo() {
    let mut all = Vec::new();
    for feedback in [Feedback::Envoy, Feedback::TotalOnly] {
        let cfg = StudyConfig {
            feedback,
            snapshot_every_ms: 1_000,
            ..study()
        };
        let exempt: &[&str] = match feedback {
            Feedback::TotalOnly => &["warm / 2"],
            _ => &[],
        };
        let tag = format!("{feedback:?} feedback");
        // 12 draws: over 8, told total times only, cold / 1's mean sat exactly on the best
        // other's (87.875 each), so that one request in one draw decided the test (a change
        // that was better over 24 draws and 20 family orders lost it); over 12 the best
        // other's mean is 86.5 and least-ttft's 87.8.
        all.extend(mean_misses(&tag, &cfg, 12, &ALL, exempt));
    }
    assert_none(all);
}

/// Ranked by predicted TTFT alone (`stall_weight` 0), least-ttft misses the bar on cold
/// caches: it sends repeats to the other replica whenever that looks a few hundred ms faster,
/// and each such cold prefill stalls every decode there (cold / 1 67 within SLO against
/// prefix-cache's 89, TTFT P95 4.30 s against 2.17 s). This is what the stall charge is for.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run by make test-sim (--ignored)"
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
/// another draw of salts and with every prior 50% high or 50% low.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run by make test-sim (--ignored)"
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
        (
            "4 replicas, priors x0.5",
            StudyConfig {
                ttft_priors: scaled_priors(0.5),
                ..four.clone()
            },
        ),
    ];
    for (name, cfg) in &cases {
        all.extend(misses(&compare(name, cfg), &ALL, 1.1));
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
    ignore = "simulates whole studies; run by make test-sim (--ignored)"
)]
fn one_and_a_half_times_the_rate_overloads_two_replicas_for_every_strategy() {
    let cfg = StudyConfig {
        rate: study().rate * 1.5,
        ..study()
    };
    for r in compare("rate x1.5", &cfg) {
        assert!(
            r.slo.max(r.best_slo) <= 40 && r.best_ttft_p95_s > 5.0,
            "{}: not overloaded ({} / {} within SLO, best TTFT P95 {:.3} s)",
            r.label,
            r.slo,
            r.best_slo,
            r.best_ttft_p95_s
        );
    }
}

/// Other family orders (`StudyConfig::order`) are other workloads of the study's shape, the
/// same for every strategy, and one phase of one order swings by ten requests either way
/// (cold / 1: least-ttft 78–91 within SLO over 20 orders, the best of the other three 51–92).
/// Averaged over ten orders, least-ttft keeps the ordering at the default priors and with every
/// prior 50% high or low: in every phase its mean within-SLO count is at least the best
/// baseline's mean less half a request, and its mean TTFT P95 at most 1.1× the best's.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "simulates whole studies; run by make test-sim (--ignored)"
)]
fn averaged_over_family_orders_the_ordering_holds_with_priors_off() {
    let candidate = StrategySpec::single(Strategy::LeastTtft);
    let mut all = Vec::new();
    for f in [1.0, 1.5, 0.5] {
        let mut rows = Vec::new();
        for order in 1..=10 {
            let cfg = StudyConfig {
                order,
                ttft_priors: scaled_priors(f),
                ..study()
            };
            let phases = bar::compare(&cfg, &candidate).expect("valid study configuration");
            rows.extend(phases.into_iter().map(|r| (format!("0/{order}"), r)));
        }
        print!(
            "-- priors x{f}, 10 family orders\n{}",
            bar::summary(&candidate, &rows, &Bar::default())
        );
        for m in bar::means(&rows, &Bar::default()) {
            if m.slo < m.best_slo - 0.5 {
                all.push(format!(
                    "x{f} {}: mean {} within SLO < {}",
                    m.label, m.slo, m.best_slo
                ));
            }
            if m.ttft_p95_s > 1.1 * m.best_ttft_p95_s {
                all.push(format!(
                    "x{f} {}: mean TTFT P95 {:.3} > 1.1 × {:.3}",
                    m.label, m.ttft_p95_s, m.best_ttft_p95_s
                ));
            }
        }
    }
    assert_none(all);
}
