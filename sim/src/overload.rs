//! Overload: the study's request shape sent faster than the replicas can serve it, to compare
//! routing alone with routing plus admission ([`kvroute_core::Router::admit`]).
//!
//! The suite ([`suite`]): the study's `cold` and `hot50` phases at 1.5× and 2× the study's rate
//! per replica on 2 and 4 replicas, on/off bursts (3× the rate for 10 s, then 0.25× for 10 s)
//! on 2 replicas, and a mix of priorities (critical, standard and sheddable in turn) at 2× on
//! 2 replicas. Arrivals are Poisson, 96 requests per replica, the client never holds a
//! request back (overload reaches the router), and each run is repeated over seeds (salts,
//! family order and arrival times drawn anew).
//!
//! Goodput is requests within the study's SLO per second of the arrival span; a shed request
//! (429) counts as not within it. Admitted TTFT P95 is over the requests that succeeded.

use std::collections::BTreeMap;

use kvroute_core::{AdmissionPolicy, Priority, StrategySpec};

use crate::cluster::{ClusterConfig, SimError};
use crate::cluster::{PRIORITY_HEADER, TENANT_HEADER};
use crate::report::{percentile, RequestRecord};
use crate::study::{label, phase_cluster, round_seed, StudyConfig};
use crate::workload::{
    mix, Arrival, ArrivalProcess, Scenario, StudyPhase, STUDY_OUTPUT_TOKENS, STUDY_RATE,
    STUDY_REQUESTS,
};

/// How arrivals come over time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pattern {
    /// Poisson at a constant rate.
    Steady,
    /// Poisson at `on` × the rate for `period_s`, then `off` × for `period_s`, and so on.
    Bursts {
        /// Rate multiple while on.
        on: f64,
        /// Rate multiple while off.
        off: f64,
        /// Seconds of each half.
        period_s: f64,
    },
}

/// One overload workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Its name in the table.
    pub name: String,
    /// The study phase whose prompts and initial state it uses.
    pub scenario: Scenario,
    /// Replicas.
    pub replicas: usize,
    /// The rate per replica as a multiple of the study's per-replica rate.
    pub load: f64,
    /// How arrivals come.
    pub pattern: Pattern,
    /// Whether requests carry priorities (critical, standard, sheddable in turn).
    pub priorities: bool,
}

/// The suite (see the module docs).
pub fn suite() -> Vec<Workload> {
    let mut out = Vec::new();
    for scenario in [Scenario::Cold, Scenario::Hot50] {
        for replicas in [2, 4] {
            for load in [1.5, 2.0] {
                out.push(Workload {
                    name: format!("{} {load}x /{replicas}", scenario.name()),
                    scenario,
                    replicas,
                    load,
                    pattern: Pattern::Steady,
                    priorities: false,
                });
            }
        }
    }
    out.push(Workload {
        name: "cold bursts /2".into(),
        scenario: Scenario::Cold,
        replicas: 2,
        load: 1.0,
        pattern: Pattern::Bursts {
            on: 3.0,
            off: 0.25,
            period_s: 10.0,
        },
        priorities: false,
    });
    out.push(Workload {
        name: "cold 2x priorities /2".into(),
        scenario: Scenario::Cold,
        replicas: 2,
        load: 2.0,
        pattern: Pattern::Steady,
        priorities: true,
    });
    out
}

/// What a row runs: a strategy, with or without admission.
#[derive(Clone, Debug)]
pub struct Contender {
    /// Its name in the table.
    pub name: String,
    /// The routing strategy.
    pub strategy: StrategySpec,
    /// The admission policy, if any.
    pub admission: Option<AdmissionPolicy>,
}

/// The admission policy the suite runs: the study's TTFT SLO as the target, and no request
/// held longer than that (one that waited longer would miss the SLO anyway).
pub fn suite_policy() -> AdmissionPolicy {
    AdmissionPolicy {
        ttft_target_ms: 2_000,
        queue_timeout_ms: 2_000,
        ..AdmissionPolicy::default()
    }
}

/// One run's outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunStats {
    /// Planned requests.
    pub requests: usize,
    /// Requests within the SLO.
    pub within_slo: usize,
    /// Within SLO per second of the arrival span.
    pub goodput: f64,
    /// Requests answered 429 (last answer).
    pub shed: usize,
    /// TTFT P95 of the successful requests, s.
    pub admitted_ttft_p95_s: Option<f64>,
    /// Critical requests shed.
    pub critical_shed: usize,
    /// Sheddable requests that succeeded.
    pub sheddable_served: usize,
    /// Sheddable requests admitted while a critical request that was then shed waited (from
    /// its send to its 429): the bar is none.
    pub sheddable_over_critical: usize,
}

/// `n` Poisson arrival times (µs) for `pattern` at `rate` per second.
fn arrival_times(pattern: Pattern, seed: u64, n: usize, rate: f64) -> Vec<u64> {
    let mut rng = fastrand::Rng::with_seed(mix(seed ^ 0x6f76_6572));
    let mut t = 0.0f64;
    (0..n)
        .map(|i| {
            if i > 0 {
                let r = match pattern {
                    Pattern::Steady => rate,
                    Pattern::Bursts { on, off, period_s } => {
                        let on_now = ((t / period_s).floor() as u64).is_multiple_of(2);
                        rate * if on_now { on } else { off }
                    }
                };
                t += -(1.0 - rng.f64()).ln() / r;
            }
            (t * 1e6).round() as u64
        })
        .collect()
}

/// The workload's arrivals for `seed`.
fn arrivals(w: &Workload, seed: u64) -> (StudyPhase, f64) {
    let n = STUDY_REQUESTS / 2 * w.replicas;
    let rate = STUDY_RATE * w.load * w.replicas as f64 / 2.0;
    let round = round_seed(1, seed);
    let mut phase = StudyPhase::new(
        w.scenario,
        round,
        mix(round ^ 0x5eed),
        n,
        rate,
        ArrivalProcess::Uniform,
        STUDY_OUTPUT_TOKENS,
    );
    let times = arrival_times(w.pattern, round, n, rate);
    for (i, a) in phase.arrivals.iter_mut().enumerate() {
        a.at_us = times[i];
        if w.priorities {
            let p = match i % 3 {
                0 => "critical",
                1 => "standard",
                _ => "sheddable",
            };
            a.headers.insert(PRIORITY_HEADER.into(), p.into());
            a.headers.insert(
                TENANT_HEADER.into(),
                if i % 4 == 0 { "b" } else { "a" }.into(),
            );
        }
    }
    let span_s = times.last().copied().unwrap_or(0) as f64 / 1e6;
    (phase, span_s.max(1.0))
}

/// Runs one workload with one contender for one seed.
pub fn run_one(
    cfg: &StudyConfig,
    w: &Workload,
    c: &Contender,
    seed: u64,
    retries: u32,
) -> Result<RunStats, SimError> {
    let (phase, span_s) = arrivals(w, seed);
    let study = StudyConfig {
        replicas: w.replicas,
        ..cfg.clone()
    };
    let phase_seed = mix(seed ^ 0x6f76_6c64);
    let (mut cluster, _) = phase_cluster(&study, &phase, phase_seed, |cc: &mut ClusterConfig| {
        cc.admission = c.admission;
        cc.shed_retries = retries;
        cc.client_cap = usize::MAX;
    })?;
    let run = cluster.run(&phase.arrivals, &c.strategy, &label(w.scenario, 1))?;
    let timeout_s = c.admission.map_or(0.0, |p| p.queue_timeout_ms as f64 / 1e3);
    Ok(stats(&phase.arrivals, &run.records, span_s, timeout_s))
}

/// When request `r`, shed, got its 429, s: at its deadline if it expired in the queue, else
/// when it was sent (shed at once); `None` if it was not shed.
fn shed_at(r: &RequestRecord, queue_timeout_s: f64) -> Option<f64> {
    if r.status != Some(429) {
        return None;
    }
    let sent = r.sent_s?;
    let expired = r.error.as_deref() == Some("shed: deadline");
    Some(if expired {
        sent + queue_timeout_s
    } else {
        sent
    })
}

fn stats(
    arrivals: &[Arrival],
    records: &[RequestRecord],
    span_s: f64,
    queue_timeout_s: f64,
) -> RunStats {
    let within_slo = records.iter().filter(|r| r.within_slo).count();
    let ttft: Vec<f64> = records
        .iter()
        .filter(|r| r.success)
        .filter_map(|r| r.ttft_s)
        .collect();
    let priority = |i: usize| {
        arrivals[i]
            .headers
            .get(PRIORITY_HEADER)
            .and_then(|v| Priority::parse(v))
            .unwrap_or(Priority::STANDARD)
    };
    let shed = |r: &RequestRecord| r.status == Some(429);
    RunStats {
        requests: records.len(),
        within_slo,
        goodput: within_slo as f64 / span_s,
        shed: records.iter().filter(|r| shed(r)).count(),
        admitted_ttft_p95_s: percentile(&ttft, 0.95),
        critical_shed: (0..records.len())
            .filter(|&i| priority(i) > 0 && shed(&records[i]))
            .count(),
        sheddable_served: (0..records.len())
            .filter(|&i| priority(i) < 0 && records[i].success)
            .count(),
        sheddable_over_critical: (0..records.len())
            .filter(|&i| priority(i) < 0 && records[i].success)
            .filter(|&i| {
                let sent = records[i].sent_s.unwrap_or(f64::NAN);
                (0..records.len()).any(|c| {
                    priority(c) > 0
                        && records[c].sent_s.is_some_and(|from| from <= sent)
                        && shed_at(&records[c], queue_timeout_s).is_some_and(|to| sent <= to)
                })
            })
            .count(),
    }
}

/// Every workload × contender over `seeds` seeds (1..=seeds), by workload then contender.
pub fn run_suite(
    cfg: &StudyConfig,
    workloads: &[Workload],
    contenders: &[Contender],
    seeds: u64,
    retries: u32,
) -> Result<BTreeMap<(usize, usize), Vec<RunStats>>, SimError> {
    let mut out = BTreeMap::new();
    for (wi, w) in workloads.iter().enumerate() {
        for (ci, c) in contenders.iter().enumerate() {
            let runs = (1..=seeds)
                .map(|seed| run_one(cfg, w, c, seed, retries))
                .collect::<Result<Vec<_>, _>>()?;
            out.insert((wi, ci), runs);
        }
    }
    Ok(out)
}

/// The contenders of the suite's table: the study's three, least-ttft, and least-ttft with
/// `policy`.
pub fn contenders(policy: AdmissionPolicy) -> Vec<Contender> {
    let single = |name: &str| Contender {
        name: name.into(),
        strategy: StrategySpec::parse(name).expect("a known strategy"),
        admission: None,
    };
    let mut out: Vec<Contender> = ["random", "least-request", "prefix-cache", "least-ttft"]
        .into_iter()
        .map(single)
        .collect();
    out.push(Contender {
        name: "least-ttft + admission".into(),
        admission: Some(policy),
        ..single("least-ttft")
    });
    out
}

/// Whether a contender is one of the study's three (the baselines of the goodput ratio).
fn is_baseline(c: &Contender) -> bool {
    c.admission.is_none() && ["random", "least-request", "prefix-cache"].contains(&c.name.as_str())
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (n, sum) = v.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// A workload's goodput with admission over the best baseline's (means over seeds), for each
/// contender with admission.
pub fn goodput_ratios(
    workloads: &[Workload],
    contenders: &[Contender],
    results: &BTreeMap<(usize, usize), Vec<RunStats>>,
) -> Vec<(String, String, f64)> {
    let goodput = |wi: usize, ci: usize| mean(results[&(wi, ci)].iter().map(|r| r.goodput));
    let mut out = Vec::new();
    for (wi, w) in workloads.iter().enumerate() {
        let best = (0..contenders.len())
            .filter(|&ci| is_baseline(&contenders[ci]))
            .map(|ci| goodput(wi, ci))
            .fold(0.0, f64::max);
        for (ci, c) in contenders.iter().enumerate() {
            if c.admission.is_some() {
                let ratio = if best > 0.0 {
                    goodput(wi, ci) / best
                } else {
                    f64::INFINITY
                };
                out.push((w.name.clone(), c.name.clone(), ratio));
            }
        }
    }
    out
}

/// The suite's table, one row per workload and contender (means over seeds; within SLO also
/// as min–max).
pub fn render(
    workloads: &[Workload],
    contenders: &[Contender],
    results: &BTreeMap<(usize, usize), Vec<RunStats>>,
) -> String {
    use std::fmt::Write;
    let mut s = String::from(
        "| workload | contender | within SLO (min–max) | goodput req/s | shed | admitted TTFT P95 s | critical shed | sheddable served | … while a critical waited |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for (wi, w) in workloads.iter().enumerate() {
        for (ci, c) in contenders.iter().enumerate() {
            let runs = &results[&(wi, ci)];
            let within: Vec<usize> = runs.iter().map(|r| r.within_slo).collect();
            let requests = runs.first().map_or(0, |r| r.requests);
            let lo = within.iter().min().copied().unwrap_or(0);
            let hi = within.iter().max().copied().unwrap_or(0);
            let p95 = mean(runs.iter().filter_map(|r| r.admitted_ttft_p95_s));
            let pri = |v: f64| {
                if w.priorities {
                    format!("{v:.1}")
                } else {
                    "–".into()
                }
            };
            let _ = writeln!(
                s,
                "| {} | {} | {:.1} / {requests} ({lo}–{hi}) | {:.3} | {:.1}% | {:.3} | {} | {} | {} |",
                w.name,
                c.name,
                mean(within.iter().map(|&x| x as f64)),
                mean(runs.iter().map(|r| r.goodput)),
                100.0 * mean(runs.iter().map(|r| r.shed as f64 / r.requests.max(1) as f64)),
                p95,
                pri(mean(runs.iter().map(|r| r.critical_shed as f64))),
                pri(mean(runs.iter().map(|r| r.sheddable_served as f64))),
                pri(mean(runs.iter().map(|r| r.sheddable_over_critical as f64))),
            );
        }
    }
    s
}

/// One study phase run by least-ttft without and with admission ([`suite_policy`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StudyCheck {
    /// `scenario / round`.
    pub label: String,
    /// Requests routed to another pod, or answered otherwise, with admission.
    pub differ: usize,
    /// Requests shed with admission.
    pub shed: usize,
    /// Within SLO without admission.
    pub within_slo_off: usize,
    /// Within SLO with admission.
    pub within_slo_on: usize,
}

/// The study's eight phases (as `kvroute-sim study` runs them) with least-ttft, without and
/// with admission.
pub fn study_check(cfg: &StudyConfig) -> Result<Vec<StudyCheck>, SimError> {
    let spec = StrategySpec::parse("least-ttft").expect("a known strategy");
    let mut out = Vec::new();
    for (round, scenario) in crate::study::phases(cfg) {
        let (phase, phase_seed) = crate::study::study_phase(cfg, scenario, round, &spec);
        let mut runs = Vec::new();
        for admission in [None, Some(suite_policy())] {
            let (mut cluster, _) = phase_cluster(cfg, &phase, phase_seed, |cc| {
                cc.admission = admission;
            })?;
            let label = label(scenario, round);
            runs.push(cluster.run(&phase.arrivals, &spec, &label)?.records);
        }
        let within = |r: &[RequestRecord]| r.iter().filter(|x| x.within_slo).count();
        out.push(StudyCheck {
            label: label(scenario, round),
            differ: runs[0]
                .iter()
                .zip(&runs[1])
                .filter(|(a, b)| a.pod != b.pod || a.status != b.status)
                .count(),
            shed: runs[1].iter().filter(|r| r.status == Some(429)).count(),
            within_slo_off: within(&runs[0]),
            within_slo_on: within(&runs[1]),
        });
    }
    Ok(out)
}
