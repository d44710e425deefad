//! The workload suite (issue 25): least-ttft judged on workloads it was not tuned on.
//!
//! The study's four scenarios are where least-ttft was designed; [`WORKLOADS`] are other
//! shapes (closed-loop conversations, mixed prompt lengths, a hot family on four replicas, more
//! prefixes than the caches hold, replicas of different speeds, bursts, a stale index), each
//! drawn for several seeds. [`run_suite`] runs every workload × seed × strategy through
//! `kvroute-sim run`'s machinery (the given router configuration with the draw's seed, each
//! replica's `max_num_seqs` told to the router, the configured feedback and engine-snapshot
//! interval); [`rows`] averages the
//! seeds; [`verdicts`] says, per workload, whether a candidate is as good as the best of the
//! others.

use std::collections::BTreeMap;

use kvroute_core::{RouterConfig, StrategySpec};

use crate::cluster::{Cluster, ClusterConfig, Feedback, SimError};
use crate::engine::EngineConfig;
use crate::replicas::{ReplicaSpec, ReplicaSpecError};
use crate::report::{percentile, PhaseSummary};
use crate::workload::trace::Trace;
use crate::workload::{parse_trace, TraceError};

mod workloads;
pub use workloads::{Drawn, Workload, WORKLOADS};

/// What a suite run is made of.
#[derive(Clone, Debug)]
pub struct SuiteConfig {
    /// The workloads, in table order.
    pub workloads: Vec<Workload>,
    /// The seeds each workload is drawn for (the router is seeded with the same).
    pub seeds: Vec<u64>,
    /// The strategies, in table order.
    pub strategies: Vec<StrategySpec>,
    /// Every replica's engine before a workload's `NAME:SETTINGS`.
    pub engine: EngineConfig,
    /// The router's configuration (its seed is replaced by each draw's).
    pub router: RouterConfig,
    /// What the router learns of each request (`run --feedback`).
    pub feedback: Feedback,
    /// How often the engines are sampled and snapshots passed to the router, simulated µs
    /// (`run --snapshot-every-ms`).
    pub sample_every_us: u64,
    /// Threads to run on (at least 1).
    pub threads: usize,
}

/// Why a suite run could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// A workload drew a trace the parser refuses (a bug in the workload).
    #[error("workload {workload}, seed {seed}: {source}")]
    Trace {
        /// The workload.
        workload: &'static str,
        /// The seed.
        seed: u64,
        /// The parser's error.
        source: TraceError,
    },
    /// A workload named a replica the parser refuses (a bug in the workload).
    #[error("workload {workload}: --pod {pod}: {source}")]
    Pod {
        /// The workload.
        workload: &'static str,
        /// The replica.
        pod: String,
        /// The parser's error.
        source: ReplicaSpecError,
    },
    /// The engine settings are invalid.
    #[error("workload {workload}: {message}")]
    Engine {
        /// The workload.
        workload: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The simulation failed.
    #[error("workload {workload}, seed {seed}, {strategy}: {source}")]
    Sim {
        /// The workload.
        workload: &'static str,
        /// The seed.
        seed: u64,
        /// The strategy.
        strategy: String,
        /// The simulator's error.
        source: SimError,
    },
}

/// One workload × seed × strategy.
#[derive(Clone, Debug)]
pub struct Cell {
    /// The workload.
    pub workload: &'static str,
    /// The seed.
    pub seed: u64,
    /// The strategy, as written.
    pub strategy: String,
    /// The run's summary.
    pub summary: PhaseSummary,
    /// TTFT P50 of the successful requests, s.
    pub ttft_p50_s: Option<f64>,
    /// Prompt tokens the engines computed (prefill not served from a cache).
    pub prefill_tokens: u64,
}

/// Runs every workload × seed × strategy, on `cfg.threads` threads; cells in workload, seed,
/// strategy order.
pub fn run_suite(cfg: &SuiteConfig) -> Result<Vec<Cell>, SuiteError> {
    let mut jobs = Vec::new();
    for w in &cfg.workloads {
        let (pods, engines) = replicas(w, &cfg.engine)?;
        for &seed in &cfg.seeds {
            let drawn = w.draw(seed);
            let trace = parse_trace(&drawn.trace).map_err(|source| SuiteError::Trace {
                workload: w.name,
                seed,
                source,
            })?;
            let trace = std::sync::Arc::new(trace);
            for spec in &cfg.strategies {
                jobs.push((
                    w.name,
                    seed,
                    spec,
                    pods.clone(),
                    engines.clone(),
                    trace.clone(),
                ));
            }
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Vec<(usize, Result<Cell, SuiteError>)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..cfg.threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((workload, seed, spec, pods, engines, trace)) = jobs.get(i) else {
                            break out;
                        };
                        let cell = run_cell(cfg, workload, *seed, spec, pods, engines, trace);
                        out.push((i, cell));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a suite worker panicked"))
            .collect()
    });
    let mut cells: Vec<(usize, Result<Cell, SuiteError>)> = results.into_iter().flatten().collect();
    cells.sort_by_key(|(i, _)| *i);
    cells.into_iter().map(|(_, c)| c).collect()
}

/// A workload's pod names and the engines of those with settings.
fn replicas(
    w: &Workload,
    base: &EngineConfig,
) -> Result<(Vec<String>, BTreeMap<String, EngineConfig>), SuiteError> {
    let mut names = Vec::new();
    let mut engines = BTreeMap::new();
    // Any seed's draw has the workload's replicas.
    for text in w.draw(0).pods {
        let spec = ReplicaSpec::parse(&text).map_err(|source| SuiteError::Pod {
            workload: w.name,
            pod: text.clone(),
            source,
        })?;
        let engine = spec.engine(base);
        engine.validate().map_err(|e| SuiteError::Engine {
            workload: w.name,
            message: e.to_string(),
        })?;
        engines.insert(spec.name.clone(), engine);
        names.push(spec.name);
    }
    Ok((names, engines))
}

fn run_cell(
    cfg: &SuiteConfig,
    workload: &'static str,
    seed: u64,
    spec: &StrategySpec,
    pods: &[String],
    engines: &BTreeMap<String, EngineConfig>,
    trace: &Trace,
) -> Result<Cell, SuiteError> {
    let strategy = spec.to_string();
    let sim = |source| SuiteError::Sim {
        workload,
        seed,
        strategy: strategy.clone(),
        source,
    };
    let cluster_cfg = ClusterConfig {
        engine: cfg.engine,
        pod_engines: engines.clone(),
        pods: pods.to_vec(),
        router: RouterConfig {
            seed,
            ..cfg.router.clone()
        },
        pod_events: trace.pod_events.clone(),
        feedback: cfg.feedback,
        sample_every_us: cfg.sample_every_us,
        ..ClusterConfig::default()
    };
    let mut cluster = Cluster::new(cluster_cfg).map_err(sim)?;
    cluster.place(&trace.placements).map_err(sim)?;
    let run = cluster.run(&trace.arrivals, spec, workload).map_err(sim)?;
    let ttft: Vec<f64> = run
        .records
        .iter()
        .filter(|r| r.success)
        .filter_map(|r| r.ttft_s)
        .collect();
    Ok(Cell {
        workload,
        seed,
        summary: PhaseSummary::from_records(
            workload,
            &strategy,
            trace.arrivals.len(),
            &run.records,
            pods,
            run.token_hit,
        ),
        strategy,
        ttft_p50_s: percentile(&ttft, 0.5),
        prefill_tokens: run.engines.iter().map(|e| e.prompt_tokens_computed).sum(),
    })
}

/// One workload × strategy over the seeds.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The workload.
    pub workload: &'static str,
    /// The strategy.
    pub strategy: String,
    /// Seeds run.
    pub seeds: usize,
    /// Requests within SLO, % of those planned: mean, min and max over the seeds.
    pub slo_percent: (f64, f64, f64),
    /// Requests within SLO, % of those planned, per seed in the cells' order (for paired
    /// comparisons: every strategy is sent the same draws).
    pub slo_by_seed: Vec<(u64, f64)>,
    /// TTFT P50 and P95, s, means over the seeds (a seed without successes counts as infinite).
    pub ttft_p50_s: f64,
    /// See `ttft_p50_s`.
    pub ttft_p95_s: f64,
    /// Token hit rate, %, mean over the seeds.
    pub hit_percent: f64,
    /// Prompt tokens computed per request, mean over the seeds.
    pub prefill_per_request: f64,
}

/// The cells averaged over the seeds, one row per workload × strategy in the cells' order.
pub fn rows(cells: &[Cell]) -> Vec<Row> {
    let mut order: Vec<(&'static str, &str)> = Vec::new();
    let mut groups: BTreeMap<(&'static str, &str), Vec<&Cell>> = BTreeMap::new();
    for c in cells {
        let key = (c.workload, c.strategy.as_str());
        if !groups.contains_key(&key) {
            order.push(key);
        }
        groups.entry(key).or_default().push(c);
    }
    order
        .into_iter()
        .map(|key| {
            let group = &groups[&key];
            let n = group.len() as f64;
            let mean = |f: &dyn Fn(&Cell) -> f64| group.iter().map(|c| f(c)).sum::<f64>() / n;
            let slo = |c: &Cell| 100.0 * c.summary.within_slo as f64 / c.summary.planned as f64;
            let (lo, hi) = group
                .iter()
                .map(|c| slo(c))
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
                    (lo.min(x), hi.max(x))
                });
            Row {
                workload: key.0,
                strategy: key.1.to_owned(),
                seeds: group.len(),
                slo_percent: (mean(&slo), lo, hi),
                slo_by_seed: group.iter().map(|c| (c.seed, slo(c))).collect(),
                ttft_p50_s: mean(&|c| c.ttft_p50_s.unwrap_or(f64::INFINITY)),
                ttft_p95_s: mean(&|c| c.summary.ttft_p95_s.unwrap_or(f64::INFINITY)),
                hit_percent: mean(&|c| 100.0 * c.summary.token_hit.unwrap_or(0.0)),
                prefill_per_request: mean(&|c| {
                    c.prefill_tokens as f64 / c.summary.planned.max(1) as f64
                }),
            }
        })
        .collect()
}

/// The rows as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| workload | strategy | within SLO % mean (min–max) | TTFT P50 s | TTFT P95 s | token hit % | prefill tokens / req |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (mean, lo, hi) = r.slo_percent;
        out += &format!(
            "| {} | {} | {mean:.1} ({lo:.0}–{hi:.0}) | {:.2} | {:.2} | {:.1} | {:.0} |\n",
            r.workload,
            r.strategy,
            r.ttft_p50_s,
            r.ttft_p95_s,
            r.hit_percent,
            r.prefill_per_request
        );
    }
    out
}

/// How a candidate may trail the best of the other strategies on a workload and still pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Percentage points of mean within-SLO share.
    pub slo_points: f64,
    /// The most its mean TTFT P95 may be, as a multiple of the best other's.
    pub ttft_ratio: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance {
            slo_points: 2.0,
            ttft_ratio: 1.1,
        }
    }
}

/// A candidate against the best of the others on one workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// The workload.
    pub workload: &'static str,
    /// The candidate's mean within-SLO %, and the best other's (with its name).
    pub slo_percent: f64,
    /// See `slo_percent`.
    pub best_slo_percent: f64,
    /// See `slo_percent`.
    pub best_slo_strategy: String,
    /// The candidate's mean TTFT P95, s, and the lowest other's (with its name).
    pub ttft_p95_s: f64,
    /// See `ttft_p95_s`.
    pub best_ttft_p95_s: f64,
    /// See `ttft_p95_s`.
    pub best_ttft_strategy: String,
    /// The candidate against the best-SLO other, seed by seed.
    pub paired: Paired,
    /// Whether the candidate is within the tolerance on both.
    pub passes: bool,
}

/// A paired comparison of within-SLO shares over the seeds both were run on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Paired {
    /// Seeds the candidate had more, fewer and as many requests within SLO.
    pub wins: usize,
    /// See `wins`.
    pub losses: usize,
    /// See `wins`.
    pub ties: usize,
    /// The mean difference, percentage points (candidate − other).
    pub mean_points: f64,
    /// Half the width of its 95% confidence interval (Student's t on the paired differences;
    /// infinite with fewer than two seeds).
    pub ci95_points: f64,
}

impl Paired {
    /// Compares `candidate` with `other` on the seeds both have.
    pub fn of(candidate: &[(u64, f64)], other: &[(u64, f64)]) -> Paired {
        let diffs: Vec<f64> = candidate
            .iter()
            .filter_map(|(seed, c)| {
                let (_, o) = other.iter().find(|(s, _)| s == seed)?;
                Some(c - o)
            })
            .collect();
        let n = diffs.len();
        let mean = diffs.iter().sum::<f64>() / n.max(1) as f64;
        let ci95_points = if n < 2 {
            f64::INFINITY
        } else {
            let var = diffs.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            t95(n - 1) * (var / n as f64).sqrt()
        };
        Paired {
            wins: diffs.iter().filter(|d| **d > 0.0).count(),
            losses: diffs.iter().filter(|d| **d < 0.0).count(),
            ties: diffs.iter().filter(|d| **d == 0.0).count(),
            mean_points: mean,
            ci95_points,
        }
    }
}

/// Student's t two-sided 95% quantile for `df` degrees of freedom (the normal's 1.96 above 30).
fn t95(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    TABLE.get(df.wrapping_sub(1)).copied().unwrap_or(1.96)
}

/// Per workload with a row for `candidate` and at least one other: how it compares.
pub fn verdicts(rows: &[Row], candidate: &str, tolerance: Tolerance) -> Vec<Verdict> {
    let mut out = Vec::new();
    let mut workloads: Vec<&'static str> = rows.iter().map(|r| r.workload).collect();
    workloads.dedup();
    for w in workloads {
        let Some(c) = rows
            .iter()
            .find(|r| r.workload == w && r.strategy == candidate)
        else {
            continue;
        };
        let others: Vec<&Row> = rows
            .iter()
            .filter(|r| r.workload == w && r.strategy != candidate)
            .collect();
        let Some(best_slo) = others
            .iter()
            .max_by(|a, b| a.slo_percent.0.total_cmp(&b.slo_percent.0))
        else {
            continue;
        };
        let best_ttft = others
            .iter()
            .min_by(|a, b| a.ttft_p95_s.total_cmp(&b.ttft_p95_s))
            .unwrap_or(best_slo);
        out.push(Verdict {
            workload: w,
            slo_percent: c.slo_percent.0,
            best_slo_percent: best_slo.slo_percent.0,
            best_slo_strategy: best_slo.strategy.clone(),
            ttft_p95_s: c.ttft_p95_s,
            best_ttft_p95_s: best_ttft.ttft_p95_s,
            best_ttft_strategy: best_ttft.strategy.clone(),
            paired: Paired::of(&c.slo_by_seed, &best_slo.slo_by_seed),
            passes: c.slo_percent.0 >= best_slo.slo_percent.0 - tolerance.slo_points
                && c.ttft_p95_s <= best_ttft.ttft_p95_s * tolerance.ttft_ratio,
        });
    }
    out
}

/// The verdicts as a Markdown table.
pub fn verdict_table(candidate: &str, verdicts: &[Verdict]) -> String {
    let mut out = format!(
        "| workload | {candidate} within SLO % | best other | paired Δ points (95% CI) · seeds W/L/T | {candidate} TTFT P95 s | best other | verdict |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for v in verdicts {
        let p = v.paired;
        out += &format!(
            "| {} | {:.1} | {:.1} ({}) | {:+.1} ± {:.1} · {}/{}/{} | {:.2} | {:.2} ({}) | {} |\n",
            v.workload,
            v.slo_percent,
            v.best_slo_percent,
            v.best_slo_strategy,
            p.mean_points,
            p.ci95_points,
            p.wins,
            p.losses,
            p.ties,
            v.ttft_p95_s,
            v.best_ttft_p95_s,
            v.best_ttft_strategy,
            if v.passes { "as good" } else { "behind" }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(workload: &'static str, strategy: &str, slo: f64, p95: f64) -> Row {
        Row {
            workload,
            strategy: strategy.into(),
            seeds: 1,
            slo_percent: (slo, slo, slo),
            slo_by_seed: vec![(1, slo)],
            ttft_p50_s: p95 / 2.0,
            ttft_p95_s: p95,
            hit_percent: 0.0,
            prefill_per_request: 0.0,
        }
    }

    #[test]
    fn a_candidate_passes_within_the_tolerance_of_the_best_other_and_fails_outside_it() {
        let rows = vec![
            row("w", "random", 80.0, 3.0),
            row("w", "least-request", 90.0, 2.0),
            row("w", "least-ttft", 88.5, 2.19),
            row("v", "random", 80.0, 3.0),
            row("v", "least-ttft", 77.0, 1.0),
            row("u", "least-ttft", 99.0, 0.1),
        ];
        let v = verdicts(&rows, "least-ttft", Tolerance::default());
        assert_eq!(v.len(), 2, "u has no other strategy");
        assert!(v[0].passes, "{v:?}");
        assert_eq!(v[0].best_slo_strategy, "least-request");
        assert!(!v[1].passes, "3 points behind random on SLO");
        let strict = Tolerance {
            slo_points: 0.0,
            ttft_ratio: 1.0,
        };
        assert!(!verdicts(&rows, "least-ttft", strict)[0].passes);
    }

    #[test]
    fn paired_differences_count_seeds_and_give_a_t_interval() {
        let c = [(1, 90.0), (2, 80.0), (3, 70.0), (4, 50.0)];
        let o = [(1, 85.0), (2, 80.0), (3, 75.0), (5, 0.0)];
        let p = Paired::of(&c, &o);
        assert_eq!(
            (p.wins, p.losses, p.ties),
            (1, 1, 1),
            "seed 4 and 5 are not paired"
        );
        assert_eq!(p.mean_points, 0.0);
        // Differences 5, 0, -5: sd 5, standard error 5/sqrt(3), t(2) = 4.303.
        assert!(
            (p.ci95_points - 4.303 * 5.0 / 3f64.sqrt()).abs() < 1e-9,
            "{p:?}"
        );
        assert!(Paired::of(&c[..1], &o).ci95_points.is_infinite());
        assert_eq!(t95(7), 2.365);
        assert_eq!(t95(100), 1.96);
    }

    #[test]
    fn a_small_suite_runs_every_cell_and_averages_the_seeds() {
        let cfg = SuiteConfig {
            workloads: vec![WORKLOADS[0]],
            seeds: vec![1, 2],
            strategies: vec!["random".parse().unwrap(), "least-ttft".parse().unwrap()],
            engine: EngineConfig::default(),
            router: RouterConfig::default(),
            feedback: Feedback::default(),
            sample_every_us: 1_000_000,
            threads: 2,
        };
        let cells = run_suite(&cfg).unwrap();
        let order: Vec<(u64, &str)> = cells
            .iter()
            .map(|c| (c.seed, c.strategy.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                (1, "random"),
                (1, "least-ttft"),
                (2, "random"),
                (2, "least-ttft")
            ]
        );
        for c in &cells {
            assert!(c.summary.succeeded > 0 && c.prefill_tokens > 0, "{c:?}");
        }
        let rows = rows(&cells);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].seeds, 2);
        let (mean, lo, hi) = rows[0].slo_percent;
        assert!(lo <= mean && mean <= hi);
        assert!(table(&rows).lines().count() == 4);
    }
}
