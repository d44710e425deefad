//! The seed study, simulated: four scenarios × three strategies × two rounds, each phase on
//! fresh engines and a fresh router, with the scenario's initial engine and index state.
//!
//! The study ran round 1 as random → least-request → prefix-cache and round 2 in reverse;
//! here phases are independent (fresh salts, idle engines, reset caches, a fresh router), so
//! their order does not matter: each phase's salts and router seed come from
//! [`phase_seed`].

use kvroute_core::{RouterConfig, Strategy, StrategySpec, TtftConfig};
use serde::Serialize;

use crate::cluster::{Cluster, ClusterConfig, Feedback, RouterBlocks, RunResult, SimError};
use crate::engine::EngineConfig;
use crate::prompt_tokens::PromptReader;
use crate::report::{CacheAccuracy, CacheRow, PhaseSummary};
use crate::workload::{
    mix, ArrivalProcess, Scenario, StudyPhase, ROUND_SEEDS, STUDY_FAMILIES, STUDY_OUTPUT_TOKENS,
    STUDY_RATE, STUDY_REQUESTS,
};

/// The strategies the table compares by default: the study's three, then kvroute's own.
pub const TABLE_STRATEGIES: [Strategy; 4] = [
    Strategy::Random,
    Strategy::LeastRequest,
    Strategy::PrefixCache,
    Strategy::LeastTtft,
];

/// The study's strategies, in the table's order.
pub const STUDY_STRATEGIES: [Strategy; 3] = [
    Strategy::Random,
    Strategy::LeastRequest,
    Strategy::PrefixCache,
];

/// What to simulate.
#[derive(Clone, Debug)]
pub struct StudyConfig {
    /// The replicas' engine.
    pub engine: EngineConfig,
    /// Planned arrivals per phase.
    pub requests: usize,
    /// Arrivals per second.
    pub rate: f64,
    /// Output tokens per request.
    pub output_tokens: u32,
    /// Arrival spacing.
    pub arrivals: ArrivalProcess,
    /// Strategies (spec strings accepted by the core), in table order.
    pub strategies: Vec<StrategySpec>,
    /// Rounds to run (1, 2 or both).
    pub rounds: Vec<u8>,
    /// Scenarios to run in each round (`None` = the study's four per round).
    pub scenarios: Option<Vec<Scenario>>,
    /// 0 = the study's salts and router seeds; another value draws others (the family order
    /// stays the round's).
    pub variant: u64,
    /// 0 = the round's family order (and question numbers and Poisson arrival times); another
    /// value draws others from the round's seed and it. Unlike `variant`, this changes what
    /// every strategy is sent, in the same way for each.
    pub order: u64,
    /// Whether the router gets engine snapshots (every `snapshot_every_ms`).
    pub observe_engines: bool,
    /// How often engines are sampled (and snapshots passed to the router), simulated ms.
    pub snapshot_every_ms: u64,
    /// What the router is told about each request.
    pub feedback: Feedback,
    /// The TTFT model's priors (least-ttft); the engine facts (block size, max sequences) are
    /// always taken from [`StudyConfig::engine`].
    pub ttft_priors: TtftConfig,
    /// The per-pod capacity told to the router (`None` = the engine's `max_num_seqs`).
    pub router_max_seqs: Option<u32>,
    /// Replicas (pods A, B, C, ...); the study had 2. See [`crate::workload`] for how the
    /// scenarios' initial states generalise to other counts.
    pub replicas: usize,
    /// How prompts become token ids (the built-in model by default).
    pub prompts: PromptReader,
    /// What the router's index is keyed by (`None`: token blocks with a real tokenizer, text
    /// blocks with the built-in model).
    pub router_blocks: Option<RouterBlocks>,
    /// Whether the engines' KV events feed the router's engine views
    /// ([`ClusterConfig::kv_events`]).
    pub kv_events: bool,
    /// With `kv_events`: how long a prompt the router sent a pod counts as cached there on top
    /// of its engine view ([`RouterConfig::engine_view_pending_ms`]; 0 = the view alone).
    pub engine_view_pending_ms: u64,
}

impl Default for StudyConfig {
    fn default() -> Self {
        StudyConfig {
            engine: EngineConfig::default(),
            requests: STUDY_REQUESTS,
            rate: STUDY_RATE,
            output_tokens: STUDY_OUTPUT_TOKENS,
            arrivals: ArrivalProcess::Uniform,
            strategies: TABLE_STRATEGIES
                .into_iter()
                .map(StrategySpec::single)
                .collect(),
            rounds: vec![1, 2],
            scenarios: None,
            variant: 0,
            order: 0,
            observe_engines: true,
            snapshot_every_ms: 5_000,
            feedback: Feedback::Streaming,
            ttft_priors: TtftConfig::default(),
            router_max_seqs: None,
            replicas: 2,
            prompts: PromptReader::built_in(),
            router_blocks: None,
            kv_events: false,
            engine_view_pending_ms: RouterConfig::default().engine_view_pending_ms,
        }
    }
}

/// The TTFT model's default priors with every rate and size prior (bytes per token, prefill
/// rate, TPOT, overhead, output tokens) multiplied by `factor`: the "every prior off by ±50%"
/// experiments. Other parameters keep their defaults.
pub fn scaled_priors(factor: f64) -> TtftConfig {
    let d = TtftConfig::default();
    TtftConfig {
        bytes_per_token: d.bytes_per_token * factor,
        prefill_tokens_per_s: d.prefill_tokens_per_s * factor,
        tpot_ms: d.tpot_ms * factor,
        overhead_ms: d.overhead_ms * factor,
        output_tokens: d.output_tokens * factor,
        ..d
    }
}

/// Pod names for `n` replicas: A, B, ..., Z, A1, B1, ...
pub fn pod_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let letter = char::from(b'A' + (i % 26) as u8);
            if i < 26 {
                letter.to_string()
            } else {
                format!("{letter}{}", i / 26)
            }
        })
        .collect()
}

/// One simulated phase.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseResult {
    /// The scenario.
    #[serde(serialize_with = "ser_display")]
    pub scenario: Scenario,
    /// The round (1 or 2).
    pub round: u8,
    /// The strategy.
    pub strategy: String,
    /// Its pods (A, B, ...).
    pub pods: Vec<String>,
    /// The table row.
    pub summary: PhaseSummary,
    /// The router's predicted cached tokens against the engines' (the cache table's row).
    pub cache: CacheAccuracy,
    /// Everything else the run measured.
    pub run: RunResult,
}

fn ser_display<S: serde::Serializer>(s: &Scenario, ser: S) -> Result<S::Ok, S::Error> {
    ser.collect_str(s)
}

impl PhaseResult {
    /// Requests of `family` per pod, in pod order.
    pub fn family_split(&self, family: usize) -> Vec<usize> {
        self.pods
            .iter()
            .map(|p| {
                self.run
                    .records
                    .iter()
                    .filter(|r| r.family == Some(family) && r.pod.as_deref() == Some(p))
                    .count()
            })
            .collect()
    }

    /// When the first request of `family` was sent to `pod`, s.
    pub fn first_sent_to(&self, family: usize, pod: &str) -> Option<f64> {
        self.run
            .records
            .iter()
            .find(|r| r.family == Some(family) && r.pod.as_deref() == Some(pod))
            .and_then(|r| r.sent_s)
    }
}

/// The label of a phase in the table: `scenario / round`.
pub fn label(scenario: Scenario, round: u8) -> String {
    format!("{} / {round}", scenario.name())
}

/// The seed of a phase's salts and router PRNG: a function of the round and the scenario and
/// strategy names only, so a phase simulates the same wherever it is run from.
pub fn phase_seed(scenario: Scenario, round: u8, strategy: &StrategySpec, variant: u64) -> u64 {
    let name = if variant == 0 {
        format!("{scenario}/{strategy}")
    } else {
        format!("{scenario}/{strategy}/{variant}")
    };
    mix(ROUND_SEEDS[usize::from(round.clamp(1, 2)) - 1]
        ^ xxhash_rust::xxh64::xxh64(name.as_bytes(), 0))
}

/// The seed of a round's family order: the study's (`ROUND_SEEDS`) for order 0, another
/// drawn from it and `order` otherwise.
pub fn round_seed(round: u8, order: u64) -> u64 {
    let seed = ROUND_SEEDS[usize::from(round.clamp(1, 2)) - 1];
    if order == 0 {
        seed
    } else {
        mix(seed ^ mix(order))
    }
}

/// The phase `cfg` sends in `scenario`'s round `round` to `strategy`, and its router seed.
pub fn study_phase(
    cfg: &StudyConfig,
    scenario: Scenario,
    round: u8,
    strategy: &StrategySpec,
) -> (StudyPhase, u64) {
    let seed = phase_seed(scenario, round, strategy, cfg.variant);
    let phase = StudyPhase::new(
        scenario,
        round_seed(round, cfg.order),
        seed,
        cfg.requests,
        cfg.rate,
        cfg.arrivals,
        cfg.output_tokens,
    );
    (phase, seed)
}

/// A fresh cluster for `phase` as the study runs it (router seeded with `phase_seed`, engines
/// and index primed as the scenario says), after `adjust` has had its say on the cluster's
/// configuration. Returns the pod names with it.
pub fn phase_cluster(
    cfg: &StudyConfig,
    phase: &StudyPhase,
    phase_seed: u64,
    adjust: impl FnOnce(&mut ClusterConfig),
) -> Result<(Cluster, Vec<String>), SimError> {
    let scenario = phase.scenario;
    let engine = EngineConfig {
        kv_capacity_blocks: scenario.kv_blocks(cfg.engine.kv_capacity_blocks),
        ..cfg.engine
    };
    let mut cluster_cfg = ClusterConfig {
        engine,
        router: RouterConfig {
            seed: phase_seed,
            engine_view_pending_ms: cfg.engine_view_pending_ms,
            // The engine facts an operator knows and configures; least-ttft learns the rates.
            ttft: TtftConfig {
                engine_block_tokens: engine.block_size,
                max_seqs: engine.max_num_seqs,
                ..cfg.ttft_priors.clone()
            },
            ..RouterConfig::default()
        },
        observe_engines: cfg.observe_engines,
        sample_every_us: cfg.snapshot_every_ms.max(1) * 1_000,
        feedback: cfg.feedback,
        router_max_seqs: cfg.router_max_seqs,
        pods: pod_names(scenario.replicas(cfg.replicas)),
        prompts: cfg.prompts.clone(),
        router_blocks: cfg.router_blocks,
        kv_events: cfg.kv_events,
        ..ClusterConfig::default()
    };
    adjust(&mut cluster_cfg);
    let pods = cluster_cfg.pods.clone();
    let mut cluster = Cluster::new(cluster_cfg)?;
    for family in 0..STUDY_FAMILIES {
        let prompt = phase.priming_prompt(family);
        if scenario.warm_engines() {
            for pod in 0..pods.len() {
                cluster.prime_engine(pod, &prompt)?;
            }
        } else if let Some(home) = scenario.engine_home(family, pods.len()) {
            cluster.prime_engine(home, &prompt)?;
        }
        if let Some(home) = scenario.index_home(family, pods.len()) {
            cluster.place_in_index(home, &prompt)?;
        }
    }
    Ok((cluster, pods))
}

/// Simulates one phase.
pub fn run_phase(
    cfg: &StudyConfig,
    scenario: Scenario,
    round: u8,
    strategy: &StrategySpec,
) -> Result<PhaseResult, SimError> {
    let (phase, phase_seed) = study_phase(cfg, scenario, round, strategy);
    let (mut cluster, pods) = phase_cluster(cfg, &phase, phase_seed, |_| {})?;
    let label = label(scenario, round);
    let run = cluster.run(&phase.arrivals, strategy, &label)?;
    let name = strategy.to_string();
    let mut summary = PhaseSummary::from_records(
        &label,
        &name,
        cfg.requests,
        &run.records,
        &pods,
        run.token_hit,
    );
    summary.output_throughput = Some(run.output_throughput);
    Ok(PhaseResult {
        scenario,
        round,
        strategy: name,
        pods,
        summary,
        cache: CacheAccuracy::from_records(&run.records),
        run,
    })
}

/// The (round, scenario) pairs `cfg` selects, round by round: its scenarios, or the study's
/// four of each round.
pub fn phases(cfg: &StudyConfig) -> Vec<(u8, Scenario)> {
    cfg.rounds
        .iter()
        .flat_map(|&round| {
            let scenarios = cfg
                .scenarios
                .clone()
                .unwrap_or_else(|| Scenario::study(round).to_vec());
            scenarios.into_iter().map(move |s| (round, s))
        })
        .collect()
}

/// Simulates every phase, rows in the study table's order (scenario, round, strategy).
pub fn run_study(cfg: &StudyConfig) -> Result<Vec<PhaseResult>, SimError> {
    let mut out = Vec::new();
    for (round, scenario) in phases(cfg) {
        for strategy in &cfg.strategies {
            out.push(run_phase(cfg, scenario, round, strategy)?);
        }
    }
    let rank = |p: &PhaseResult| {
        ["cold", "warm", "hot50", "hot90", "eviction", "skewed4"]
            .iter()
            .position(|n| *n == p.scenario.name())
    };
    out.sort_by_key(|p| (rank(p), p.round));
    Ok(out)
}

/// The cache table's row of a phase ([`crate::report::cache_table`]).
pub fn cache_row(p: &PhaseResult) -> CacheRow {
    CacheRow {
        label: p.summary.label.clone(),
        strategy: p.strategy.clone(),
        accuracy: p.cache,
        evictions: p.run.engines.iter().map(|e| e.evictions).sum(),
    }
}

/// The lines the table has no column for: selection reasons, guard events, peak waiting,
/// throughput and, under a hotspot, where the hot family went.
pub fn phase_notes(p: &PhaseResult) -> String {
    let pods = &p.pods;
    let mut s = format!(
        "{} {}: reasons {} · imbalance events {} · peak waiting {} · output {:.1} tok/s",
        p.summary.label,
        p.strategy,
        p.run.reasons_text(),
        p.run.imbalance_events,
        p.run.peaks_text(pods),
        p.run.output_throughput
    );
    if matches!(p.scenario, Scenario::Hot50 | Scenario::Hot90) {
        let split = p.family_split(0);
        let split: Vec<String> = split.iter().map(usize::to_string).collect();
        s.push_str(&format!(" · hot family {}", split.join(" / ")));
        if let Some(t) = pods.first().and_then(|a| p.first_sent_to(0, a)) {
            s.push_str(&format!(" (first on {} at {t:.1} s)", pods[0]));
        }
    }
    s
}

/// Writes `records.jsonl`, `summary.json` and one `ttft-SCENARIO.svg` per scenario to `dir`.
pub fn write_outputs(dir: &std::path::Path, phases: &[PhaseResult]) -> Result<(), OutputError> {
    let io = |path: &std::path::Path| {
        let path = path.display().to_string();
        move |source| OutputError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let records: Vec<_> = phases
        .iter()
        .flat_map(|p| p.run.records.iter().cloned())
        .collect();
    let rpath = dir.join("records.jsonl");
    crate::report::write_jsonl(&rpath, &records).map_err(io(&rpath))?;
    let summary: Vec<serde_json::Value> = phases
        .iter()
        .map(|p| {
            serde_json::json!({
                "scenario": p.scenario.to_string(), "round": p.round, "strategy": p.strategy,
                "summary": p.summary, "cache": p.cache, "reasons": p.run.reasons, "imbalance_events": p.run.imbalance_events,
                "peak_waiting": p.run.peak_waiting, "engines": p.run.engines, "samples": p.run.samples,
                "notes": phase_notes(p),
            })
        })
        .collect();
    let spath = dir.join("summary.json");
    let text = serde_json::to_string_pretty(&summary).unwrap_or_default();
    std::fs::write(&spath, text).map_err(io(&spath))?;
    let mut names: Vec<&'static str> = phases.iter().map(|p| p.scenario.name()).collect();
    names.dedup();
    names.sort();
    names.dedup();
    for name in names {
        let path = dir.join(format!("ttft-{name}.svg"));
        let mut rounds: Vec<u8> = phases
            .iter()
            .filter(|p| p.scenario.name() == name)
            .map(|p| p.round)
            .collect();
        rounds.dedup();
        let panels: Vec<crate::plot::Panel> = rounds
            .iter()
            .map(|&round| {
                let mine: Vec<&PhaseResult> = phases
                    .iter()
                    .filter(|p| p.scenario.name() == name && p.round == round)
                    .collect();
                let title = match mine.first() {
                    Some(p) => format!("{} / round {round}: TTFT by send time", p.scenario),
                    None => format!("{name} / round {round}"),
                };
                let series = mine
                    .iter()
                    .map(|p| {
                        let label = format!(
                            "{} ({}/{} in SLO)",
                            p.strategy, p.summary.within_slo, p.summary.planned
                        );
                        crate::plot::Series::from_records(label, &p.run.records)
                    })
                    .collect();
                crate::plot::Panel { title, series }
            })
            .collect();
        crate::plot::ttft_over_time(&path, &panels).map_err(|e| OutputError::Plot {
            path: path.display().to_string(),
            message: e,
        })?;
    }
    Ok(())
}

/// Writing study outputs failed.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A plot could not be drawn.
    #[error("cannot plot {path}: {message}")]
    Plot {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}
