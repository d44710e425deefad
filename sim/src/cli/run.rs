//! `kvroute-sim run`: a JSONL trace through the router and simulated replicas.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::args::{EngineArgs, PromptArgs};
use super::parse_specs;
use crate::cluster::Feedback;
use crate::engine::EngineConfig;
use crate::replicas::ReplicaSpec;
use kvroute_core::RouterConfig;

/// `kvroute-sim run` flags.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The workload (JSONL; see sim/README.md).
    #[arg(long)]
    trace: PathBuf,
    /// Strategies for requests without a `routing-strategy` header; each is one run.
    #[arg(long = "strategy", num_args = 1..)]
    strategies: Vec<String>,
    /// Number of simulated replicas (named A, B, C, ...), all as the engine flags describe.
    #[arg(long, default_value_t = 2)]
    pods: usize,
    /// One replica instead of --pods, repeated: NAME, or NAME:SETTINGS with comma-separated
    /// speed=F (step times divided by F), max-num-seqs=N and kv-blocks=N over the engine
    /// flags'. The router is told each replica's max-num-seqs.
    #[arg(long = "pod", value_name = "NAME:SETTINGS", conflicts_with = "pods")]
    pod: Vec<String>,
    /// The router's seed.
    #[arg(long, default_value_t = 102)]
    seed: u64,
    /// Client in-flight cap.
    #[arg(long, default_value_t = 48)]
    client_cap: usize,
    /// What the router learns of each request: streaming (a C or Go proxy's view), envoy
    /// (kvroute-ext-proc's, timing at most 4 responses at once) or total-only (the total time).
    #[arg(long, default_value = "streaming", value_parser = ["streaming", "envoy", "total-only"])]
    feedback: String,
    /// How often the engines are sampled and snapshots passed to the router, simulated ms
    /// (kvroute-ext-proc scrapes its pods every second by default).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    snapshot_every_ms: u64,
    /// Router parameters from a kvroute TOML file: its [ttft] and [prefix_cache] sections
    /// (nothing else).
    #[arg(long, value_name = "FILE")]
    router_config: Option<PathBuf>,
    /// Write per-request records (JSONL) here.
    #[arg(long)]
    records: Option<PathBuf>,
    /// Write a TTFT-over-time SVG here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print the per-request table.
    #[arg(long)]
    verbose: bool,
    #[command(flatten)]
    prompts: PromptArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

impl RunArgs {
    /// The router's configuration: the core's defaults with `--seed`, told the engines' block
    /// size, under `--router-config`'s settings; or the error printed and exit code 2.
    fn router(&self) -> Result<RouterConfig, ExitCode> {
        let engine = self.engine.config();
        super::told_router(&engine, self.seed, self.router_config.as_deref())
    }

    /// The pods' names and the engines of those `--pod` gives settings for, or the error
    /// printed and exit code 2.
    fn replicas(&self) -> Result<(Vec<String>, BTreeMap<String, EngineConfig>), ExitCode> {
        let usage = |msg: String| {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        };
        let base = self.engine.config();
        if let Err(e) = base.validate() {
            return Err(usage(e.to_string()));
        }
        if self.pod.is_empty() {
            if self.pods == 0 || self.pods > 4096 {
                return Err(usage("--pods must be between 1 and 4096".into()));
            }
            return Ok((crate::study::pod_names(self.pods), BTreeMap::new()));
        }
        if self.pod.len() > 4096 {
            return Err(usage("at most 4096 --pod".into()));
        }
        let mut names = Vec::new();
        let mut engines = BTreeMap::new();
        for text in &self.pod {
            let spec = ReplicaSpec::parse(text).map_err(|e| usage(format!("--pod {text}: {e}")))?;
            let engine = spec.engine(&base);
            if let Err(e) = engine.validate() {
                return Err(usage(format!("--pod {text}: {e}")));
            }
            if engines.insert(spec.name.clone(), engine).is_some() {
                return Err(usage(format!("--pod {}: named twice", spec.name)));
            }
            names.push(spec.name);
        }
        Ok((names, engines))
    }
}

/// Runs the trace once per strategy and prints the reports.
pub fn run_cmd(a: RunArgs) -> ExitCode {
    let text = match std::fs::read_to_string(&a.trace) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", a.trace.display());
            return ExitCode::from(2);
        }
    };
    let trace = match crate::workload::parse_trace(&text) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {}: {e}", a.trace.display());
            return ExitCode::from(2);
        }
    };
    let (pods, pod_engines) = match a.replicas() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let (prompts, router_blocks, kv_events) = match a.prompts.config() {
        Ok(p) => p,
        Err(code) => return code,
    };
    let router = match a.router() {
        Ok(r) => r,
        Err(code) => return code,
    };
    // clap accepts only the three values.
    let feedback = Feedback::parse(&a.feedback).unwrap_or_default();
    let specs = if a.strategies.is_empty() {
        vec![kvroute_core::StrategySpec::default()]
    } else {
        match parse_specs("--strategy", &a.strategies) {
            Ok(s) => s,
            Err(c) => return c,
        }
    };
    let mut rows = Vec::new();
    let mut planned_rows = Vec::new();
    let mut calibration = Vec::new();
    let mut all = Vec::new();
    let mut series = Vec::new();
    for spec in &specs {
        let cfg = crate::cluster::ClusterConfig {
            engine: a.engine.config(),
            pod_engines: pod_engines.clone(),
            pods: pods.clone(),
            router: router.clone(),
            client_cap: a.client_cap,
            feedback,
            sample_every_us: a.snapshot_every_ms * 1_000,
            pod_events: trace.pod_events.clone(),
            prompts: prompts.clone(),
            router_blocks,
            kv_events,
            ..Default::default()
        };
        let slo = cfg.slo;
        let result = crate::cluster::Cluster::new(cfg).and_then(|mut c| {
            c.place(&trace.placements)?;
            c.run(&trace.arrivals, spec, "trace")
        });
        let run = match result {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {e}");
                // A trace that names a pod the flags do not give is a usage error.
                let usage = matches!(
                    e,
                    crate::cluster::SimError::TracePod { .. }
                        | crate::cluster::SimError::PodEvent { .. }
                );
                return if usage {
                    ExitCode::from(2)
                } else {
                    ExitCode::FAILURE
                };
            }
        };
        let name = spec.to_string();
        let mut summary = crate::report::PhaseSummary::from_records(
            "trace",
            &name,
            trace.arrivals.len(),
            &run.records,
            &pods,
            run.token_hit,
        );
        summary.output_throughput = Some(run.output_throughput);
        if a.verbose {
            println!("== trace · {name} ==");
            print!("{}", crate::report::request_table(&run.records));
        }
        let mut extra = String::new();
        let failed = run.records.iter().filter(|r| !r.success).count();
        if failed > 0 {
            extra += &format!(" · {failed} failed");
        }
        if feedback == Feedback::Envoy {
            extra += &format!(
                " · timed responses {} (at most {} at once)",
                run.timed_responses, run.peak_timed_responses
            );
        }
        println!(
            "{name}: reasons {} · imbalance events {} · peak waiting {} · {:.1} s simulated{extra}",
            run.reasons_text(),
            run.imbalance_events,
            run.peaks_text(&pods),
            run.duration_s
        );
        series.push(crate::plot::Series::from_records(
            format!("{name} ({}/{} in SLO)", summary.within_slo, summary.planned),
            &run.records,
        ));
        rows.push(summary);
        planned_rows.push(crate::report::PlannedRow::from_records(
            &name,
            trace.arrivals.len(),
            &run.records,
            &slo,
        ));
        calibration.push((name, run.ttft_calibration));
        all.extend(run.records);
    }
    println!();
    print!("{}", crate::report::study_table(&rows));
    println!();
    print!("{}", crate::report::planned_table(&planned_rows));
    println!();
    print!("{}", crate::report::calibration_table(&calibration));
    if let Some(path) = &a.records {
        if let Err(e) = crate::report::write_jsonl(path, &all) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &a.plot {
        let panel = crate::plot::Panel {
            title: format!("{}: TTFT by send time", a.trace.display()),
            series,
        };
        if let Err(e) = crate::plot::ttft_over_time(path, &[panel]) {
            eprintln!("error: cannot plot {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
