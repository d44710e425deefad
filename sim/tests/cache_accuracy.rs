//! The router's predicted cached tokens against what the engines served, and the phases that
//! test them (`study --phases eviction,skewed4`): engines that evict, and warm engines behind an
//! index that places every family on one replica. Mechanics, not exact numbers; seeded, so
//! deterministic.

use std::process::Command;

use kvroute_core::{Strategy, StrategySpec};
use kvroute_sim::cluster::RouterBlocks;
use kvroute_sim::report::CacheAccuracy;
use kvroute_sim::study::{cache_row, run_phase, PhaseResult, StudyConfig};
use kvroute_sim::workload::{Scenario, SKEWED_REPLICAS};

/// One phase with events or with the token-keyed router-side index only (so that nothing but
/// the events differs).
fn phase(scenario: Scenario, strategy: Strategy, kv_events: bool, cfg: StudyConfig) -> PhaseResult {
    phase_in(1, scenario, strategy, kv_events, cfg)
}

fn phase_in(
    round: u8,
    scenario: Scenario,
    strategy: Strategy,
    kv_events: bool,
    cfg: StudyConfig,
) -> PhaseResult {
    let cfg = StudyConfig {
        kv_events,
        router_blocks: Some(RouterBlocks::Tokens),
        ..cfg
    };
    run_phase(&cfg, scenario, round, &StrategySpec::single(strategy)).unwrap()
}

fn evicted(p: &PhaseResult) -> u64 {
    p.run.engines.iter().map(|e| e.evictions).sum()
}

/// Σ |predicted − held at routing| ÷ Σ held: how far the router's belief was from what the
/// chosen engine held when the request was routed.
fn view_error(p: &PhaseResult) -> f64 {
    let (mut err, mut held) = (0u64, 0u64);
    for r in p.run.records.iter().filter(|r| r.success) {
        let (pred, h) = (
            r.predicted_cached_tokens.unwrap(),
            r.held_cached_tokens.unwrap(),
        );
        err += u64::from(pred.abs_diff(h));
        held += u64::from(h);
    }
    err as f64 / held as f64
}

/// At the study's rate least-request and random send every family to both replicas of 24
/// blocks: the engines evict, the router-side index never hears of it, the engine views do.
/// The view alone (no pending window) predicts exactly what each engine had published when the
/// request was routed: what it held less the blocks of the step in progress (vLLM publishes a
/// step's events when the step ends; against what the engines held, measured 0.09–0.19 off,
/// request by request); the index is far off (0.46–0.53). (What the engines serve at admission,
/// about 20 s later in these queues, is another matter: sim/README.md.)
#[test]
fn the_eviction_phase_evicts_and_the_views_follow_the_engines() {
    let no_pending = || StudyConfig {
        engine_view_pending_ms: 0,
        ..StudyConfig::default()
    };
    for (round, strategy) in [1, 2]
        .into_iter()
        .flat_map(|r| [Strategy::LeastRequest, Strategy::Random].map(move |s| (r, s)))
    {
        let index = phase_in(
            round,
            Scenario::Eviction,
            strategy,
            false,
            StudyConfig::default(),
        );
        let events = phase_in(round, Scenario::Eviction, strategy, true, no_pending());
        for p in [&index, &events] {
            assert!(evicted(p) >= 20, "{} evicted", evicted(p));
            assert_eq!(cache_row(p).evictions, evicted(p));
            assert!(p.cache.requests >= 90, "{:?}", p.cache);
            assert!(p.cache.ratio().is_some(), "{:?}", p.cache);
        }
        assert_eq!(index.cache.engine_views, 0);
        assert_eq!(events.cache.engine_views, events.cache.requests);
        // Exactly what the engine had published when the request was routed, request by
        // request: the view's whole error against what the engine held is the step in progress.
        for r in &events.run.records {
            assert_eq!(
                r.predicted_cached_tokens, r.published_cached_tokens,
                "{round} {strategy:?}: request {}",
                r.index
            );
        }
        let (v, i) = (view_error(&events), view_error(&index));
        assert!(v < i, "{round} {strategy:?}: view {v:.3}, index {i:.3}");
    }
}

/// Where requests reach their engines about when they are routed (the eviction phase at half
/// the study's rate: the engines still evict, without the KV-starved queues), the predictions
/// with events, at the core's defaults, are within 5% of what the engines served, in total
/// and request by request (issue #21's bar; measured 1.000–1.015 and at most 0.015), and
/// closer than the index's, which is 16–29% off request by request (sim/README.md,
/// "Predicted and actual cached tokens"). From the views alone (no pending window) the totals
/// are closer than the index's too.
#[test]
fn with_events_predicted_cached_tokens_are_closer_to_actual() {
    let half_rate = |engine_view_pending_ms| StudyConfig {
        rate: 0.8,
        engine_view_pending_ms,
        ..StudyConfig::default()
    };
    let default_pending = StudyConfig::default().engine_view_pending_ms;
    let off = |a: &CacheAccuracy| (a.ratio().unwrap() - 1.0).abs();
    for (round, strategy) in [1, 2]
        .into_iter()
        .flat_map(|r| [Strategy::LeastRequest, Strategy::Random].map(move |s| (r, s)))
    {
        let run = |events, pending| {
            phase_in(
                round,
                Scenario::Eviction,
                strategy,
                events,
                half_rate(pending),
            )
        };
        let (index, events, view) = (
            run(false, default_pending),
            run(true, default_pending),
            run(true, 0),
        );
        for p in [&index, &events, &view] {
            assert!(evicted(p) > 0, "{round} {strategy:?}");
        }
        let ctx = format!(
            "{round} {strategy:?}: index {:?} events {:?} view alone {:?}",
            index.cache, events.cache, view.cache
        );
        assert!(
            off(&events.cache) <= 0.05 && events.cache.error_share().unwrap() <= 0.05,
            "{ctx}"
        );
        assert!(index.cache.error_share().unwrap() > 0.10, "{ctx}");
        assert!(
            events.cache.error_share() < index.cache.error_share(),
            "{ctx}"
        );
        assert!(
            view.cache.error_share() < index.cache.error_share(),
            "{ctx}"
        );
        assert!(off(&view.cache) < off(&index.cache), "{ctx}");
    }
}

/// Four warm replicas, the index placing every family on A: prefix-cache piles onto A from the
/// index and balances from the engines' events.
#[test]
fn skewed4_fools_prefix_cache_without_events_only() {
    let fooled = phase(
        Scenario::Skewed,
        Strategy::PrefixCache,
        false,
        StudyConfig::default(),
    );
    let events = phase(
        Scenario::Skewed,
        Strategy::PrefixCache,
        true,
        StudyConfig::default(),
    );
    let least_request = phase(
        Scenario::Skewed,
        Strategy::LeastRequest,
        false,
        StudyConfig::default(),
    );
    assert_eq!(fooled.pods.len(), SKEWED_REPLICAS);
    assert_eq!(fooled.summary.split.len(), SKEWED_REPLICAS);
    assert!(
        fooled.summary.split[0].1 >= 48,
        "A gets most: {:?}",
        fooled.summary
    );
    assert!(
        fooled.summary.within_slo < 70,
        "{:?}",
        fooled.summary.within_slo
    );
    assert!(events.summary.within_slo >= least_request.summary.within_slo);
    assert_eq!(events.cache.engine_views, events.cache.requests);
    // Every engine is warm and nothing is evicted: the views predict exactly what is served.
    assert_eq!(evicted(&events), 0);
    assert_eq!(events.cache.predicted, events.cache.actual);
}

#[test]
fn study_phases_prints_both_tables() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args([
            "study",
            "--phases",
            "eviction,skewed4",
            "--round",
            "1",
            "--strategy",
            "least-request",
            "--kv-events",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("| scenario / round | strategy | TTFT P95 s |"));
    assert!(stdout.contains("| predicted cached | actual cached | predicted ÷ actual |"));
    for label in ["eviction / 1", "skewed4 / 1"] {
        let rows = stdout
            .lines()
            .filter(|l| l.starts_with(&format!("| {label} | least-request |")))
            .count();
        assert_eq!(
            rows, 2,
            "a study row and a cache row for {label}:\n{stdout}"
        );
    }
    assert!(stdout.contains("| A / B / C / D |"), "{stdout}");
    assert!(stdout.contains("simulated 2 phases"), "{stdout}");
    let bad = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(["study", "--phases", "eviction,tepid"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown phase \"tepid\""));
}
