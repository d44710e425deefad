//! `kvroute-sim suite`: the workload suite ([`crate::suite`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::parse_specs;
use crate::suite::{rows, run_suite, table, verdict_table, verdicts, SuiteConfig, Tolerance};
use crate::suite::{Workload, WORKLOADS};

/// The strategies run when `--strategy` is not given.
const DEFAULT_STRATEGIES: [&str; 5] = [
    "random",
    "least-request",
    "prefix-cache",
    "session-affinity",
    "least-ttft",
];

/// `kvroute-sim suite` flags.
#[derive(Args, Debug)]
pub struct SuiteArgs {
    /// Seeds per workload (1, 2, ... N): arrival times, prompts, lengths and the router's
    /// randomness drawn anew.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1000))]
    seeds: u64,
    /// Only these workloads (repeatable; default: all).
    #[arg(long = "workload", value_name = "NAME")]
    workloads: Vec<String>,
    /// Strategies (core spec strings), in table order (default: random least-request
    /// prefix-cache session-affinity least-ttft).
    #[arg(long = "strategy", num_args = 1..)]
    strategies: Vec<String>,
    /// The strategy compared with the best of the others per workload.
    #[arg(long, default_value = "least-ttft")]
    candidate: String,
    /// Exit with 1 when the candidate is behind on a workload: below the best other's mean
    /// within-SLO share by more than --slo-points, or a mean TTFT P95 above --ttft-ratio × the
    /// lowest other's.
    #[arg(long)]
    require: bool,
    /// See --require.
    #[arg(long, default_value_t = Tolerance::default().slo_points)]
    slo_points: f64,
    /// See --require.
    #[arg(long, default_value_t = Tolerance::default().ttft_ratio)]
    ttft_ratio: f64,
    /// Router parameters from a kvroute TOML file, as `run --router-config` takes them: its
    /// [ttft] and [prefix_cache] sections (to see what a setting does on every workload).
    #[arg(long, value_name = "FILE")]
    router_config: Option<PathBuf>,
    /// What the router learns of each request, as `run --feedback` takes it: streaming (a C
    /// or Go proxy's view), envoy (kvroute-ext-proc's) or total-only.
    #[arg(long, default_value = "streaming", value_parser = ["streaming", "envoy", "total-only"])]
    feedback: String,
    /// How often the engines are sampled and snapshots passed to the router, simulated ms
    /// (kvroute-ext-proc scrapes its pods every second by default).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    snapshot_every_ms: u64,
    /// Write each workload's trace for every seed (`NAME.SEED.jsonl`) and its replicas
    /// (`NAME.pods`, the --pod values) here for `kvroute-sim run` (with --seed SEED it makes
    /// the suite's run), and print nothing else.
    #[arg(long, value_name = "DIR")]
    write: Option<PathBuf>,
    /// List the workloads and exit.
    #[arg(long)]
    list: bool,
}

/// Runs the suite and prints the table and the candidate's verdicts.
pub fn suite_cmd(a: SuiteArgs) -> ExitCode {
    let usage = |msg: String| {
        eprintln!("error: {msg}");
        ExitCode::from(2)
    };
    if a.list {
        for w in WORKLOADS {
            println!("{:<14} {:<8} {}", w.name, w.family, w.about);
        }
        return ExitCode::SUCCESS;
    }
    let mut workloads: Vec<Workload> = Vec::new();
    for name in &a.workloads {
        match WORKLOADS.iter().find(|w| w.name == name) {
            Some(w) => workloads.push(*w),
            None => {
                let known: Vec<&str> = WORKLOADS.iter().map(|w| w.name).collect();
                return usage(format!(
                    "--workload {name:?}: no such workload (known: {})",
                    known.join(", ")
                ));
            }
        }
    }
    if workloads.is_empty() {
        workloads = WORKLOADS.to_vec();
    }
    if let Some(dir) = &a.write {
        return write(dir, &workloads, a.seeds);
    }
    if !(a.ttft_ratio.is_finite() && a.ttft_ratio >= 1.0) {
        return usage("--ttft-ratio must be a number ≥ 1".into());
    }
    if !(a.slo_points.is_finite() && a.slo_points >= 0.0) {
        return usage("--slo-points must be a number ≥ 0".into());
    }
    let names: Vec<String> = if a.strategies.is_empty() {
        DEFAULT_STRATEGIES.iter().map(|s| (*s).to_owned()).collect()
    } else {
        a.strategies.clone()
    };
    let strategies = match parse_specs("--strategy", &names) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let candidate = match parse_specs("--candidate", std::slice::from_ref(&a.candidate)) {
        Ok(mut c) => c.remove(0).to_string(),
        Err(code) => return code,
    };
    let engine = crate::engine::EngineConfig::default();
    let seed = kvroute_core::RouterConfig::default().seed;
    let router = match super::told_router(&engine, seed, a.router_config.as_deref()) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let cfg = SuiteConfig {
        router,
        workloads,
        seeds: (1..=a.seeds).collect(),
        strategies,
        engine,
        // clap accepts only the three values.
        feedback: crate::cluster::Feedback::parse(&a.feedback).unwrap_or_default(),
        sample_every_us: a.snapshot_every_ms * 1_000,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let cells = match run_suite(&cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rows = rows(&cells);
    println!(
        "{} workloads × {} seeds × {} strategies",
        cfg.workloads.len(),
        cfg.seeds.len(),
        cfg.strategies.len()
    );
    println!();
    print!("{}", table(&rows));
    let tolerance = Tolerance {
        slo_points: a.slo_points,
        ttft_ratio: a.ttft_ratio,
    };
    let verdicts = verdicts(&rows, &candidate, tolerance);
    if verdicts.is_empty() {
        return ExitCode::SUCCESS;
    }
    println!();
    print!("{}", verdict_table(&candidate, &verdicts));
    let behind = verdicts.iter().filter(|v| !v.passes).count();
    println!();
    println!(
        "{candidate}: as good as the best other on {} of {} workloads (within {} points of SLO share, TTFT P95 ≤ {}×)",
        verdicts.len() - behind,
        verdicts.len(),
        tolerance.slo_points,
        tolerance.ttft_ratio
    );
    if a.require && behind > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Writes each workload's traces for seeds 1..=`seeds` and its replicas into `dir`.
fn write(dir: &std::path::Path, workloads: &[Workload], seeds: u64) -> ExitCode {
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        for w in workloads {
            for seed in 1..=seeds {
                let drawn = w.draw(seed);
                std::fs::write(dir.join(format!("{}.{seed}.jsonl", w.name)), &drawn.trace)?;
                if seed == 1 {
                    std::fs::write(
                        dir.join(format!("{}.pods", w.name)),
                        drawn.pods.join("\n") + "\n",
                    )?;
                }
            }
        }
        Ok(())
    });
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}
