//! The `kvroute-sim` command line: `study`, `bar`, `run`, `serve`, `replay`, `overload` and `suite`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::replay::{self, ReplayConfig};
use crate::serve::{self, ServeConfig};
use crate::workload::Scenario;

mod args;
mod overload;
mod run;
mod suite;
use args::PromptArgs;
pub use args::{EngineArgs, TokenizerArgs};

/// kvroute's simulator, fake vLLM server and load client.
#[derive(Parser, Debug)]
#[command(name = "kvroute-sim", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulate the seed study: four scenarios × the study's three strategies and least-ttft × two rounds.
    Study(StudyArgs),
    /// Hold a strategy to issue 6's bar against the study's three, phase by phase: within-SLO
    /// count ≥ the best of them, TTFT P95 ≤ 1.1× the best, token hits ≥ least-request's. Exits
    /// with 1 if a phase misses it.
    Bar(BarArgs),
    /// Simulate a JSONL trace through the router and simulated replicas.
    Run(run::RunArgs),
    /// Serve the engine model in real time as a fake vLLM server.
    Serve(ServeArgs),
    /// Send a study-shaped load to a live endpoint and report it.
    Replay(ReplayArgs),
    /// Overload the simulated replicas (the study's shape, faster than they serve it) and
    /// compare routing alone with routing plus admission: goodput, sheds, admitted TTFT.
    Overload(overload::OverloadArgs),
    /// Run every strategy on the workload suite (conversations, mixed lengths, a hot family,
    /// evictions, uneven replicas, bursts, a stale index), several seeds each, and compare
    /// least-ttft (or --candidate) with the best of the others per workload.
    Suite(suite::SuiteArgs),
}

/// What shapes a simulated study phase (shared by `study` and `bar`).
#[derive(Args, Debug)]
struct PhaseArgs {
    /// Another draw of salts and router randomness (0 = the study's); the family order stays the
    /// round's. For checking how robust a result is.
    #[arg(long, default_value_t = 0)]
    variant: u64,
    /// Another draw of the family order, question numbers and Poisson arrival times (0 = the
    /// round's); every strategy is sent the same.
    #[arg(long, default_value_t = 0)]
    order: u64,
    /// Arrival spacing: uniform (the study's) or poisson.
    #[arg(long, default_value = "uniform")]
    arrivals: String,
    /// Do not pass engine snapshots (gauge samples) to the router.
    #[arg(long)]
    no_engine_snapshots: bool,
    /// How often the engines are sampled and snapshots passed to the router, simulated ms.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    snapshot_every_ms: u64,
    /// What the router is told per request: streaming (first tokens and usage, as a C or Go
    /// proxy tells it), envoy (as kvroute-ext-proc behind Envoy: every timing for at most 4
    /// responses at once, the total time for the rest) or total-only (the total time only, as
    /// kvroute-ext-proc with [stream_timing] max_streams = 0).
    #[arg(long, default_value = "streaming")]
    feedback: String,
    /// The per-pod capacity told to the router (default: --max-num-seqs); least-ttft uses it.
    #[arg(long)]
    router_max_seqs: Option<u32>,
    /// Multiply every rate and size prior of least-ttft's TTFT model (bytes per token, prefill
    /// rate, TPOT, overhead, output tokens) by this factor, to see how the learning recovers.
    #[arg(long, default_value_t = 1.0)]
    prior_scale: f64,
    /// Replicas (pods A, B, C, ...); the study had 2.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Arrivals per second (the study's: 1.6).
    #[arg(long, default_value_t = crate::workload::STUDY_RATE)]
    rate: f64,
    /// Only this round (1 or 2).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=2))]
    round: Option<u8>,
    /// With --kv-events: how long a prompt the router sent a pod counts as cached there on top
    /// of the engine's view, simulated ms (the core's engine_view_pending_ms; 0: the view alone).
    #[arg(long, default_value_t = kvroute_core::RouterConfig::default().engine_view_pending_ms)]
    engine_view_pending_ms: u64,
    #[command(flatten)]
    prompts: PromptArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

impl PhaseArgs {
    /// The study configuration these flags give (with the default strategies), or the error
    /// printed and exit code 2.
    fn config(&self) -> Result<crate::study::StudyConfig, ExitCode> {
        let usage = |msg: String| {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        };
        let Some(arrivals) = crate::workload::ArrivalProcess::parse(&self.arrivals) else {
            return Err(usage(format!(
                "--arrivals must be poisson or uniform, got {:?}",
                self.arrivals
            )));
        };
        let Some(feedback) = crate::cluster::Feedback::parse(&self.feedback) else {
            return Err(usage(format!(
                "--feedback must be streaming, envoy or total-only, got {:?}",
                self.feedback
            )));
        };
        if self.replicas == 0 || self.replicas > 4096 {
            return Err(usage("--replicas must be between 1 and 4096".into()));
        }
        if !(self.prior_scale.is_finite() && self.prior_scale > 0.0) {
            return Err(usage("--prior-scale must be a positive number".into()));
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return Err(usage(
                "--rate must be a positive number of requests per second".into(),
            ));
        }
        let engine = self.engine.config();
        if let Err(e) = engine.validate() {
            return Err(usage(e.to_string()));
        }
        let (prompts, router_blocks, kv_events) = self.prompts.config()?;
        let mut cfg = crate::study::StudyConfig {
            engine,
            variant: self.variant,
            order: self.order,
            arrivals,
            observe_engines: !self.no_engine_snapshots,
            snapshot_every_ms: self.snapshot_every_ms,
            feedback,
            router_max_seqs: self.router_max_seqs,
            ttft_priors: crate::study::scaled_priors(self.prior_scale),
            replicas: self.replicas,
            rate: self.rate,
            prompts,
            router_blocks,
            kv_events,
            engine_view_pending_ms: self.engine_view_pending_ms,
            ..Default::default()
        };
        if let Some(r) = self.round {
            cfg.rounds = vec![r];
        }
        Ok(cfg)
    }
}

#[derive(Args, Debug)]
struct StudyArgs {
    #[command(flatten)]
    phase: PhaseArgs,
    /// Write records (JSONL), the summary (JSON) and one SVG plot per scenario here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Strategies (core spec strings), in table order (default: random least-request prefix-cache
    /// least-ttft).
    #[arg(long = "strategy", num_args = 1..)]
    strategies: Vec<String>,
    /// Print every phase's selection reasons, guard events and peak queues.
    #[arg(long)]
    verbose: bool,
    /// Phases to run in each round instead of the study's four: cold, warm-4-4, warm-6-2,
    /// hot50, hot90, eviction (cold's requests on engines too small to keep every family) and
    /// skewed4 (four warm replicas, the index placing every family on A).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    phases: Vec<String>,
}

#[derive(Args, Debug)]
struct BarArgs {
    #[command(flatten)]
    phase: PhaseArgs,
    /// The strategy held to the bar (a core spec string).
    #[arg(long, default_value = "least-ttft")]
    candidate: String,
    /// Draws of salts and router randomness: --variant and the next ones.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    draws: u64,
    /// Family orders, each with every draw: --order and the next ones.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    orders: u64,
    /// TTFT P95 allowed, as a multiple of the best baseline's.
    #[arg(long, default_value_t = crate::bar::Bar::default().ttft_ratio)]
    ttft_ratio: f64,
    /// Requests within SLO the candidate may have fewer than the best baseline.
    #[arg(long, default_value_t = 0)]
    slo_slack: usize,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to bind (0 picks a free one; the chosen port is printed).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Replica name, returned in `x-kvroute-sim-replica`.
    #[arg(long)]
    name: String,
    /// The served model name.
    #[arg(long, default_value = "study")]
    model: String,
    /// Run the engine model this many times faster than real time.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// The largest request body accepted, bytes; a larger one gets an OpenAI-style 413.
    #[arg(long, default_value_t = serve::DEFAULT_MAX_BODY_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_body_bytes: usize,
    /// Fault: answer faulted requests with this status (400–599; default 500 when
    /// --fault-rate, --fault-after or --fault-health is given without a stall or close).
    /// Alone, every inference request fails. Changeable at run time with POST /fault.
    #[arg(long, value_parser = clap::value_parser!(u16).range(400..=599))]
    fault_status: Option<u16>,
    /// Fault: fraction of inference requests faulted, 0.0–1.0, counter-based (the j-th is
    /// faulted when floor(j·rate) > floor((j−1)·rate)).
    #[arg(long)]
    fault_rate: Option<f64>,
    /// Fault: let the first N inference requests through, fault the later ones.
    #[arg(long)]
    fault_after: Option<u64>,
    /// Fault: delay a faulted request's response headers this many ms (then it proceeds, or
    /// fails with --fault-status when given).
    #[arg(long)]
    fault_stall_ms: Option<u64>,
    /// Fault: drop a faulted request's TCP connection after reading it, with no response.
    #[arg(long)]
    fault_close: bool,
    /// Fault: also fault /health and /metrics (a dead but listening engine).
    #[arg(long)]
    fault_health: bool,
    /// Publish the engine's KV-cache events as vLLM does (`--kv-events-config`): a ZMQ PUB
    /// socket bound here, e.g. tcp://127.0.0.1:5557 (port 0: a free port; `*`: every
    /// interface). The bound endpoint is printed on a second line, `kv-events on ENDPOINT`.
    #[arg(long, value_name = "ENDPOINT")]
    kv_events_endpoint: Option<String>,
    /// Also bind vLLM's replay ROUTER socket here (needs --kv-events-endpoint).
    #[arg(long, value_name = "ENDPOINT")]
    kv_events_replay_endpoint: Option<String>,
    /// The topic frame of KV-event messages (needs --kv-events-endpoint; default: empty, as
    /// vLLM).
    #[arg(long, value_name = "TOPIC")]
    kv_events_topic: Option<String>,
    /// How KV-event batches are encoded (needs --kv-events-endpoint; default: map, what current
    /// vLLM sends; positional: vLLM before PR #42892 and SGLang; map-batch: the batch as a map
    /// too).
    #[arg(long, value_name = "LAYOUT", value_parser = ["positional", "map", "map-batch"])]
    kv_events_layout: Option<String>,
    /// Engines ("ranks") behind the one port, as vLLM's --data-parallel-size (1–64): a request
    /// goes to the rank its X-data-parallel-rank header names, else to the least loaded one;
    /// /metrics labels each rank's series engine="R"; with KV events rank R publishes on the
    /// endpoints' port + R (port 0: a free port each) and prints its own `kv-events on ...
    /// rank R` line.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(serve::MAX_DATA_PARALLEL_SIZE)))]
    data_parallel_size: u32,
    #[command(flatten)]
    tokenizer: TokenizerArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

impl ServeArgs {
    /// The start-up fault spec these flags give.
    fn fault(&self) -> Result<serve::FaultSpec, String> {
        serve::FaultRequest {
            status: self.fault_status,
            rate: self.fault_rate,
            after: self.fault_after,
            stall_ms: self.fault_stall_ms,
            close: self.fault_close.then_some(true),
            health: self.fault_health.then_some(true),
        }
        .into_spec()
        .map_err(|e| format!("--fault-* flags: {e}"))
    }

    /// The KV-event publishing these flags ask for (`None`: off). The other `--kv-events-*`
    /// flags need `--kv-events-endpoint`.
    fn kv_events(&self) -> Result<Option<serve::KvEventsConfig>, String> {
        let Some(endpoint) = &self.kv_events_endpoint else {
            let given = [
                (
                    "--kv-events-replay-endpoint",
                    self.kv_events_replay_endpoint.is_some(),
                ),
                ("--kv-events-topic", self.kv_events_topic.is_some()),
                ("--kv-events-layout", self.kv_events_layout.is_some()),
            ];
            return match given.iter().find(|(_, g)| *g) {
                Some((flag, _)) => Err(format!(
                    "{flag} needs --kv-events-endpoint (the PUB socket KV events are published on)"
                )),
                None => Ok(None),
            };
        };
        if endpoint.trim().is_empty() {
            return Err("--kv-events-endpoint must not be empty".into());
        }
        let mut cfg = serve::KvEventsConfig::new(endpoint.clone());
        cfg.replay_endpoint = self.kv_events_replay_endpoint.clone();
        cfg.topic = self.kv_events_topic.clone().unwrap_or_default();
        if let Some(layout) = &self.kv_events_layout {
            // clap accepts only the three values.
            cfg.layout = serve::kv_publish::parse_layout(layout)
                .ok_or_else(|| format!("--kv-events-layout: unknown layout {layout:?}"))?;
        }
        Ok(Some(cfg))
    }
}

#[derive(Args, Debug)]
struct ReplayArgs {
    /// The endpoint (usually the gateway), `http://host:port`.
    #[arg(long)]
    url: String,
    /// cold, warm (= warm-4-4), warm-6-2, hot50 or hot90.
    #[arg(long, default_value = "hot50")]
    scenario: String,
    /// `routing-strategy` header values; each is one phase, in order.
    #[arg(long = "strategy", num_args = 1..)]
    strategies: Vec<String>,
    /// Planned arrivals per phase.
    #[arg(long, default_value_t = 96)]
    requests: usize,
    /// Arrival rate, requests per model second.
    #[arg(long, default_value_t = 1.6)]
    rate: f64,
    /// The servers' speed-up (divides inter-arrival times; measurements are scaled back).
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Round seed: the family order (102 = round 1, 103 = round 2).
    #[arg(long, default_value_t = 102)]
    seed: u64,
    /// Output tokens per request.
    #[arg(long, default_value_t = 128)]
    max_tokens: u32,
    /// Write per-request records (JSONL) here.
    #[arg(long)]
    records: Option<PathBuf>,
    /// Per-request timeout in real seconds (default 120 / speedup + 5).
    #[arg(long)]
    timeout: Option<f64>,
    /// Replica URLs to reset (and, for warm, to warm) directly before each phase.
    #[arg(long = "direct", num_args = 1..)]
    direct: Vec<String>,
    /// The model name sent in requests.
    #[arg(long, default_value = "study")]
    model: String,
    /// Do not print the per-request table.
    #[arg(long)]
    quiet: bool,
    /// Arrival spacing: uniform (the study's) or poisson.
    #[arg(long, default_value = "uniform")]
    arrivals: String,
}

/// Parses the arguments and runs the command.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Study(a) => study_cmd(a),
        Command::Bar(a) => bar_cmd(a),
        Command::Run(a) => run::run_cmd(a),
        Command::Serve(a) => serve_cmd(a),
        Command::Replay(a) => replay_cmd(a),
        Command::Overload(a) => overload::overload_cmd(a),
        Command::Suite(a) => suite::suite_cmd(a),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })
}

fn serve_cmd(a: ServeArgs) -> ExitCode {
    let fault = match a.fault() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let kv_events = match a.kv_events() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let prompts = match a.tokenizer.reader() {
        Ok(p) => p,
        Err(code) => return code,
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(c) => return c,
    };
    let cfg = ServeConfig {
        host: a.host,
        port: a.port,
        name: a.name,
        model: a.model,
        speedup: a.speedup,
        engine: a.engine.config(),
        fault,
        max_body_bytes: a.max_body_bytes,
        prompts,
        data_parallel_size: a.data_parallel_size,
    };
    match rt.block_on(serve::run(cfg, kv_events)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn replay_cmd(a: ReplayArgs) -> ExitCode {
    let scenario = match Scenario::parse(&a.scenario) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(arrivals) = crate::workload::ArrivalProcess::parse(&a.arrivals) else {
        eprintln!(
            "error: --arrivals must be poisson or uniform, got {:?}",
            a.arrivals
        );
        return ExitCode::from(2);
    };
    let cfg = ReplayConfig {
        arrivals,
        url: a.url,
        scenario,
        strategies: a.strategies,
        requests: a.requests,
        rate: a.rate,
        speedup: a.speedup,
        seed: a.seed,
        max_tokens: a.max_tokens,
        records: a.records,
        timeout_s: a.timeout,
        direct: a.direct,
        model: a.model,
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(c) => return c,
    };
    let phases = match rt.block_on(replay::run(&cfg)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    for p in &phases {
        println!(
            "== {} · strategy {} ==",
            p.summary.label, p.summary.strategy
        );
        for n in &p.notes {
            println!("note: {n}");
        }
        if !a.quiet {
            print!("{}", crate::report::request_table(&p.records));
        }
        let mut reasons = std::collections::BTreeMap::<&str, usize>::new();
        for r in &p.records {
            *reasons
                .entry(r.reason.as_deref().unwrap_or("-"))
                .or_default() += 1;
        }
        let reasons: Vec<String> = reasons.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let imbalance = p
            .records
            .iter()
            .filter(|r| r.imbalance == Some(true))
            .count();
        println!(
            "reasons (x-kvroute-decision) {} · imbalance flagged {imbalance}",
            reasons.join(" ")
        );
        let failed: Vec<_> = p.records.iter().filter(|r| !r.success).collect();
        if let Some(r) = failed.first() {
            println!(
                "{} request(s) failed; first: #{} {}",
                failed.len(),
                r.index,
                r.error.as_deref().unwrap_or("?")
            );
        }
        println!();
    }
    let rows: Vec<_> = phases.iter().map(|p| p.summary.clone()).collect();
    print!("{}", crate::report::study_table(&rows));
    if rows.iter().all(|r| r.succeeded == 0) {
        eprintln!("error: no request succeeded");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The router `run` and `suite` simulate: the core's defaults with `seed`, told the engines'
/// block size (an engine fact an operator knows and configures, as `study` tells it), then the
/// settings of `--router-config`'s file over them; or the file's error printed and exit code 2.
fn told_router(
    engine: &crate::engine::EngineConfig,
    seed: u64,
    file: Option<&std::path::Path>,
) -> Result<kvroute_core::RouterConfig, ExitCode> {
    let mut config = kvroute_core::RouterConfig {
        seed,
        ..kvroute_core::RouterConfig::default()
    };
    config.ttft.engine_block_tokens = engine.block_size;
    if let Some(path) = file {
        apply_router_file(path, &mut config)?;
    }
    Ok(config)
}

/// Applies the kvroute TOML file at `path` over `config` (`--router-config`), or prints the
/// error and returns exit code 2.
fn apply_router_file(
    path: &std::path::Path,
    config: &mut kvroute_core::RouterConfig,
) -> Result<(), ExitCode> {
    std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|text| crate::router_file::apply(&text, config).map_err(|e| e.to_string()))
        .map_err(|e| {
            eprintln!("error: --router-config {}: {e}", path.display());
            ExitCode::from(2)
        })
}

fn parse_specs(flag: &str, names: &[String]) -> Result<Vec<kvroute_core::StrategySpec>, ExitCode> {
    names
        .iter()
        .map(|n| {
            kvroute_core::StrategySpec::parse(n).map_err(|e| {
                eprintln!("error: {flag} {n:?}: {e}");
                ExitCode::from(2)
            })
        })
        .collect()
}

fn study_cmd(a: StudyArgs) -> ExitCode {
    let mut cfg = match a.phase.config() {
        Ok(c) => c,
        Err(code) => return code,
    };
    if !a.phases.is_empty() {
        let phases: Result<Vec<Scenario>, _> =
            a.phases.iter().map(|p| Scenario::parse_phase(p)).collect();
        match phases {
            Ok(p) => cfg.scenarios = Some(p),
            Err(e) => {
                eprintln!("error: --phases: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if !a.strategies.is_empty() {
        match parse_specs("--strategy", &a.strategies) {
            Ok(s) => cfg.strategies = s,
            Err(c) => return c,
        }
    }
    let cpu0 = crate::cpu::process_cpu_seconds();
    let wall = std::time::Instant::now();
    let phases = match crate::study::run_study(&cfg) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cpu = crate::cpu::process_cpu_seconds()
        .zip(cpu0)
        .map(|(b, a)| b - a);
    let rows: Vec<_> = phases.iter().map(|p| p.summary.clone()).collect();
    print!("{}", crate::report::study_table(&rows));
    let cache: Vec<_> = phases.iter().map(crate::study::cache_row).collect();
    println!();
    print!("{}", crate::report::cache_table(&cache));
    if a.verbose {
        println!();
        for p in &phases {
            println!("{}", crate::study::phase_notes(p));
        }
    }
    if let Some(dir) = &a.out {
        if let Err(e) = crate::study::write_outputs(dir, &phases) {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
        println!("wrote records, summary and plots to {}", dir.display());
    }
    match cpu {
        Some(c) => println!(
            "simulated {} phases in {c:.2} s CPU ({:.2} s wall)",
            phases.len(),
            wall.elapsed().as_secs_f64()
        ),
        None => println!(
            "simulated {} phases in {:.2} s wall",
            phases.len(),
            wall.elapsed().as_secs_f64()
        ),
    }
    ExitCode::SUCCESS
}

fn bar_cmd(a: BarArgs) -> ExitCode {
    let cfg = match a.phase.config() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let candidate = match parse_specs("--candidate", std::slice::from_ref(&a.candidate)) {
        Ok(mut s) => s.remove(0),
        Err(code) => return code,
    };
    if !(a.ttft_ratio.is_finite() && a.ttft_ratio > 0.0) {
        eprintln!("error: --ttft-ratio must be a positive number");
        return ExitCode::from(2);
    }
    let bar = crate::bar::Bar {
        slo_slack: a.slo_slack,
        ttft_ratio: a.ttft_ratio,
        ..crate::bar::Bar::default()
    };
    let mut rows = Vec::new();
    for order in cfg.order..cfg.order.saturating_add(a.orders) {
        for variant in cfg.variant..cfg.variant.saturating_add(a.draws) {
            let draw = crate::study::StudyConfig {
                variant,
                order,
                ..cfg.clone()
            };
            let label = if order == 0 {
                variant.to_string()
            } else {
                format!("{variant}/{order}")
            };
            match crate::bar::compare(&draw, &candidate) {
                Ok(r) => rows.extend(r.into_iter().map(|row| (label.clone(), row))),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    print!("{}", crate::bar::table(&candidate, &rows, &bar));
    if a.draws.saturating_mul(a.orders) > 1 {
        println!();
        print!("{}", crate::bar::summary(&candidate, &rows, &bar));
    }
    let missed = rows
        .iter()
        .filter(|(_, r)| !r.misses(&bar).is_empty())
        .count();
    let misses: usize = rows.iter().map(|(_, r)| r.misses(&bar).len()).sum();
    println!(
        "{candidate}: {misses} misses in {missed} of {} phases ({} draws × {} family orders)",
        rows.len(),
        a.draws,
        a.orders
    );
    if misses == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_and_suite_tell_least_ttft_the_engines_block_size_unless_the_file_says_otherwise() {
        let engine = crate::engine::EngineConfig {
            block_size: 64,
            ..Default::default()
        };
        let told = told_router(&engine, 5, None).unwrap();
        assert_eq!((told.ttft.engine_block_tokens, told.seed), (64, 5));
        let dir = std::env::temp_dir().join(format!("kvroute-sim-told-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("router.toml");
        std::fs::write(&file, "[ttft]\nengine_block_tokens = 16\ntie_ms = 100\n").unwrap();
        let overridden = told_router(&engine, 5, Some(&file)).unwrap();
        assert_eq!(overridden.ttft.engine_block_tokens, 16);
        assert_eq!(overridden.ttft.tie_ms, 100.0);
        std::fs::write(&file, "[ttft]\ntie_ms = 100\n").unwrap();
        let kept = told_router(&engine, 5, Some(&file)).unwrap();
        assert_eq!(
            kept.ttft.engine_block_tokens, 64,
            "a file without it keeps the engines'"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
