//! Configuration: a TOML file, overridden by AIBrix's environment variables, overridden by
//! command-line flags, validated into one [`Config`].
//!
//! The layering is the same at start-up and on every reload ([`ConfigSource::load`]), so a
//! SIGHUP or an edited file can never drop an override given on the command line. The
//! environment is read once at start-up ([`crate::env::EnvSnapshot`]), like AIBrix does.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvroute_core::{RouterConfig, StrategySpec, TtftConfig};
use serde::Deserialize;

use crate::discovery::{Discovery, DiscoveryError, DiscoverySection};
use crate::env::{EnvError, EnvSnapshot};
use crate::health::{HealthSection, HealthSectionError};

/// Default gRPC (ext_proc + health) listen address: loopback only.
pub const DEFAULT_GRPC_LISTEN: &str = "127.0.0.1:50052";
/// Default admin (metrics, health, readiness) listen address: loopback only.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";
/// Default largest request body routed (AIBrix's `AIBRIX_GRPC_MAX_MESSAGE_SIZE_BYTES`): 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Default time in-flight streams get to finish after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default time between two scrapes of a pod's engine metrics.
pub const DEFAULT_SCRAPE_INTERVAL: Duration = Duration::from_millis(1000);
/// Default time one scrape may take.
pub const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_millis(500);
/// Default `[stream_timing] max_streams`.
pub const DEFAULT_MAX_TIMED_STREAMS: usize = kvroute_core::Prediction::DEFAULT_TIMED_STREAMS;

/// Why a configuration was rejected. On reload the old configuration stays in force.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown keys or wrong types.
    #[error("invalid TOML in {path}: {message}")]
    Toml {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// An environment variable has a value that cannot be used.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The default routing strategy does not parse.
    #[error("invalid default routing strategy {spec:?}: {source}")]
    Strategy {
        /// The text given.
        spec: String,
        /// Why it is invalid.
        source: kvroute_core::StrategyError,
    },
    /// A router parameter is out of range.
    #[error("invalid router setting: {0}")]
    Router(#[from] kvroute_core::ConfigError),
    /// A model or pod entry is invalid.
    #[error("invalid model/pod entry: {0}")]
    Pods(String),
    /// A limit is out of range.
    #[error("invalid limit: {0}")]
    Limit(String),
    /// A `[health]` value is out of range.
    #[error(transparent)]
    Health(#[from] HealthSectionError),
    /// `[discovery]` is invalid.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// A `[tokenizers."<model>"]` section is invalid.
    #[error("invalid tokenizer: {0}")]
    Tokenizer(String),
    /// A `[kv_events."<model>"]` section (or a pod's `kv_events_*`) is invalid.
    #[error("invalid KV-event subscription: {0}")]
    KvEvents(String),
    /// `[admission]` is invalid.
    #[error(transparent)]
    Admission(#[from] crate::admission::AdmissionConfigError),
}

/// The TOML file as written. Every key is optional; see `ext-proc/README.md` for the format.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `[listen]`
    #[serde(default)]
    pub listen: ListenSection,
    /// `[routing]`
    #[serde(default)]
    pub routing: RoutingSection,
    /// `[prefix_cache]`
    #[serde(default)]
    pub prefix_cache: PrefixCacheSection,
    /// `[limits]`
    #[serde(default)]
    pub limits: LimitsSection,
    /// `[ttft]`: the `least-ttft` model's engine facts and priors.
    #[serde(default)]
    pub ttft: TtftSection,
    /// `[engine_metrics]`: scraping the pods' vLLM `/metrics`.
    #[serde(default)]
    pub engine_metrics: EngineMetricsSection,
    /// `[stream_timing]`: timing a few streaming responses through kvroute.
    #[serde(default)]
    pub stream_timing: StreamTimingSection,
    /// `[health]`: pod ejection and active checks ([`crate::health`]).
    #[serde(default)]
    pub health: HealthSection,
    /// `[discovery]`: where the pods come from ([`crate::discovery`]).
    #[serde(default)]
    pub discovery: DiscoverySection,
    /// `[models.<name>]`: the pods serving each model.
    #[serde(default)]
    pub models: BTreeMap<String, ModelSection>,
    /// `[tokenizers."<model>"]`: models whose requests are tokenized ([`crate::tokenize`]).
    #[serde(default)]
    pub tokenizers: BTreeMap<String, crate::tokenize::TokenizerSection>,
    /// `[kv_events."<model>"]`: models whose engines publish KV events ([`crate::kv_events`]).
    #[serde(default)]
    pub kv_events: BTreeMap<String, crate::kv_events::KvEventsSection>,
    /// `[admission]`: holding or shedding requests under saturation ([`crate::admission`]).
    #[serde(default)]
    pub admission: crate::admission::AdmissionSection,
}

/// `[listen]`: where the service listens. Changing these needs a restart.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenSection {
    /// ext_proc and gRPC health (default `127.0.0.1:50052`).
    pub grpc: Option<SocketAddr>,
    /// `/metrics`, `/healthz`, `/readyz` (default `127.0.0.1:9464`).
    pub admin: Option<SocketAddr>,
    /// `[listen.tls]`: TLS on the listeners ([`crate::tls`]).
    pub tls: Option<crate::tls::TlsSection>,
}

/// `[routing]`
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingSection {
    /// Strategy for requests without a `routing-strategy` header (default `prefix-cache`).
    pub default_strategy: Option<String>,
    /// Seed of the router's PRNG; random per process when absent.
    pub seed: Option<u64>,
    /// Model whose pods serve requests without a body (GET); default: the configured model
    /// whose name comes first in byte order (not the first in the file; `B` before `a`).
    pub default_model: Option<String>,
    /// Ticket safety-net lifetime in seconds (default 1800).
    pub ticket_ttl_secs: Option<u64>,
    /// Whether the configuration may serve no model at all (every request gets 400). Without
    /// it, a configuration without models is invalid (an empty file is not applied).
    pub allow_no_models: Option<bool>,
    /// Whether clients see the `target-pod`, `target-pod-ip` and `x-kvroute-decision` response
    /// headers, which reveal pod names, addresses and loads (default true, as AIBrix sends
    /// `target-pod` and `target-pod-ip`). `routing-strategy` and `request-id` are always sent.
    pub expose_pod_headers: Option<bool>,
}

/// `[prefix_cache]`, with AIBrix's names.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixCacheSection {
    /// Block size in bytes (default 128).
    pub block_size: Option<usize>,
    /// Index capacity in blocks (default 200,000).
    pub block_number: Option<usize>,
    /// Index entry lifetime in minutes (default 20).
    pub eviction_duration_mins: Option<u64>,
    /// Imbalance threshold (default 16).
    pub imbalance_abs_count: Option<u32>,
    /// `k` in `load ≤ μ + k·σ` (default 2).
    pub standard_deviation_factor: Option<f64>,
    /// Prompt hash seed; derived from the router seed when absent.
    pub hash_seed: Option<u64>,
}

/// `[limits]`
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Largest request body routed; larger bodies get 413 (default 4 MiB).
    pub max_body_bytes: Option<usize>,
    /// Seconds in-flight streams get after SIGTERM (default 30).
    pub shutdown_grace_secs: Option<u64>,
}

/// `[ttft]`: [`kvroute_core::TtftConfig`] field by field; an absent key keeps the core's
/// default (the model is documented in `router-core/src/ttft/mod.rs`, every parameter in
/// `router-core/src/ttft/config.rs`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TtftSection {
    /// The engine's KV block size in tokens (vLLM `--block-size`). Absent: the block size the
    /// engines report in `vllm:cache_config_info`, 16 until one does.
    pub engine_block_tokens: Option<u32>,
    /// Default concurrent sequences per pod (vLLM `--max-num-seqs`; default 256); a pod's
    /// `max_seqs` overrides it.
    pub max_seqs: Option<u32>,
    /// Prior prompt bytes per token (default 4.0).
    pub bytes_per_token: Option<f64>,
    /// Prior prefill throughput per pod, tokens/s (default 3,000).
    pub prefill_tokens_per_s: Option<f64>,
    /// Prior time per output token, ms (default 50).
    pub tpot_ms: Option<f64>,
    /// Prior fixed part of TTFT, ms (default 50).
    pub overhead_ms: Option<f64>,
    /// Prior expected output tokens per request (default 128).
    pub output_tokens: Option<f64>,
    /// EWMA weight of one sample, in (0, 1] (default 0.2).
    pub learning_rate: Option<f64>,
    /// Samples are clamped to within this factor of the estimate (default 3).
    pub max_sample_ratio: Option<f64>,
    /// Engine snapshots older than this are ignored, ms (default: twice
    /// `[engine_metrics] scrape_interval_ms`, so that a snapshot stays fresh until one scrape
    /// is missed; 2,000 with scraping off).
    pub snapshot_max_age_ms: Option<u64>,
    /// Predictions closer than this tie, ms (default 300).
    pub tie_ms: Option<f64>,
    /// How many times its length a prefill is charged for stalling a full pod's decodes
    /// (default 2; 0 ranks by predicted TTFT alone).
    pub stall_weight: Option<f64>,
    /// A wait on the cheapest pod from which a pod not yet probed gets the request, ms
    /// (default 500; 0 = never).
    pub explore_wait_ms: Option<f64>,
}

impl TtftSection {
    /// The core's configuration: each present key over [`TtftConfig::default`], except
    /// `snapshot_max_age_ms`, twice `scrape_interval` when it is unset and engines are scraped.
    /// Validation is the core's ([`RouterConfig::validate`]).
    pub fn to_core(&self, scrape_interval: Option<Duration>) -> TtftConfig {
        let d = TtftConfig::default();
        let max_age = scrape_interval.map_or(d.snapshot_max_age_ms, |i| {
            u64::try_from(i.as_millis().saturating_mul(2)).unwrap_or(u64::MAX)
        });
        TtftConfig {
            bytes_per_token: self.bytes_per_token.unwrap_or(d.bytes_per_token),
            engine_block_tokens: self.engine_block_tokens.unwrap_or(d.engine_block_tokens),
            max_seqs: self.max_seqs.unwrap_or(d.max_seqs),
            prefill_tokens_per_s: self.prefill_tokens_per_s.unwrap_or(d.prefill_tokens_per_s),
            tpot_ms: self.tpot_ms.unwrap_or(d.tpot_ms),
            overhead_ms: self.overhead_ms.unwrap_or(d.overhead_ms),
            output_tokens: self.output_tokens.unwrap_or(d.output_tokens),
            learning_rate: self.learning_rate.unwrap_or(d.learning_rate),
            max_sample_ratio: self.max_sample_ratio.unwrap_or(d.max_sample_ratio),
            snapshot_max_age_ms: self.snapshot_max_age_ms.unwrap_or(max_age),
            tie_ms: self.tie_ms.unwrap_or(d.tie_ms),
            stall_weight: self.stall_weight.unwrap_or(d.stall_weight),
            explore_wait_ms: self.explore_wait_ms.unwrap_or(d.explore_wait_ms),
        }
    }
}

/// `[stream_timing]`: how many streaming responses at once kvroute has Envoy pass through it
/// chunk by chunk, to learn their first token's time and their usage
/// ([`crate::stream_timing`]; needs `allow_mode_override: true` on Envoy's ext_proc filter, as
/// shipped).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamTimingSection {
    /// Most responses timed at once (default 4; 0 turns timing off).
    pub max_streams: Option<usize>,
}

/// `[engine_metrics]`: how each pod's `http://<address>/metrics` is scraped.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineMetricsSection {
    /// Time between two scrapes of a pod, ms (default 1,000; 0 turns scraping off).
    pub scrape_interval_ms: Option<u64>,
    /// Time one scrape may take, ms (default 500).
    pub scrape_timeout_ms: Option<u64>,
}

/// `[models.<name>]`
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// The pods serving the model.
    #[serde(default)]
    pub pods: Vec<PodEntry>,
    /// Whether the model may have no pods (its requests then get 503). Without it, a model
    /// with no pods is an invalid configuration: a file cut short while being written must not
    /// take a model's pods away.
    #[serde(default)]
    pub allow_no_pods: bool,
}

/// One pod: a unique name and the `ip:port` Envoy connects to.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodEntry {
    /// Unique pod name (returned in `target-pod`).
    pub name: String,
    /// `ip:port` (an IP literal, as Envoy's ORIGINAL_DST cluster requires).
    pub address: String,
    /// The pod's engine capacity in concurrent sequences (vLLM `--max-num-seqs`) for
    /// `least-ttft`; default `[ttft] max_seqs`.
    #[serde(default)]
    pub max_seqs: Option<u32>,
    /// The pod's KV-event publisher, instead of `[kv_events."<model>"] endpoint`'s template.
    #[serde(default)]
    pub kv_events_endpoint: Option<String>,
    /// The pod's KV-event replay endpoint, instead of the template's.
    #[serde(default)]
    pub kv_events_replay_endpoint: Option<String>,
    /// Engines behind the address (vLLM `--data-parallel-size`): [`crate::data_parallel`].
    #[serde(default)]
    pub data_parallel_size: Option<u32>,
}

/// Values given on the command line; they win over the file and the environment.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--grpc-listen`
    pub grpc_listen: Option<SocketAddr>,
    /// `--admin-listen`
    pub admin_listen: Option<SocketAddr>,
    /// `--default-strategy`
    pub default_strategy: Option<String>,
    /// `--max-body-bytes`
    pub max_body_bytes: Option<usize>,
    /// `--shutdown-grace-secs`
    pub shutdown_grace_secs: Option<u64>,
    /// `--seed`
    pub seed: Option<u64>,
    /// `--allow-no-models`
    pub allow_no_models: bool,
}

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// ext_proc + gRPC health listen address.
    pub grpc_listen: SocketAddr,
    /// Admin HTTP listen address.
    pub admin_listen: SocketAddr,
    /// TLS on the listeners, when configured.
    pub tls: Option<crate::tls::TlsSection>,
    /// Router parameters (default strategy included).
    pub router: RouterConfig,
    /// The default strategy as written, echoed in the `routing-strategy` response header.
    pub default_strategy_text: String,
    /// Model used for requests without a body.
    pub default_model: Option<String>,
    /// Model name → pods, sorted by model name.
    pub models: BTreeMap<String, Vec<PodEntry>>,
    /// Largest request body routed.
    pub max_body_bytes: usize,
    /// Grace period after SIGTERM.
    pub shutdown_grace: Duration,
    /// Time between two scrapes of a pod's `/metrics`; `None` = scraping off.
    pub scrape_interval: Option<Duration>,
    /// Time one scrape may take.
    pub scrape_timeout: Duration,
    /// Most streaming responses timed through kvroute at once (0 = none).
    pub max_timed_streams: usize,
    /// The active check when scraping is off: every interval, `GET` this path; `None` = off.
    pub health_check: Option<(Duration, String)>,
    /// Whether clients see `target-pod`, `target-pod-ip` and `x-kvroute-decision`.
    pub expose_pod_headers: bool,
    /// Where the pods come from (static: `models`; else discovery, and `models` is empty).
    pub discovery: Discovery,
    /// Models whose requests are tokenized, by the model name requests carry.
    pub tokenizers: BTreeMap<String, crate::tokenize::TokenizerSpec>,
    /// Models whose engines publish KV events, by router model name.
    pub kv_events: BTreeMap<String, crate::kv_events::KvEventsSpec>,
    /// Admission: the request headers read, and each router model's policy.
    pub admission: crate::admission::AdmissionConfig,
    /// `[ttft] engine_block_tokens` is not set: the engine scraper takes the block size the
    /// engines report.
    pub engine_block_from_engines: bool,
}

impl Config {
    /// Every distinct pod (by name) across models, in model then file order.
    pub fn all_pods(&self) -> Vec<&PodEntry> {
        let mut seen = std::collections::HashSet::new();
        self.models
            .values()
            .flatten()
            .filter(|p| seen.insert(p.name.as_str()))
            .collect()
    }
}

/// Where configurations come from: an optional file plus the fixed env snapshot and flags.
#[derive(Clone, Debug)]
pub struct ConfigSource {
    /// The TOML file, if any.
    pub path: Option<PathBuf>,
    /// AIBrix environment variables, read once at start-up.
    pub env: EnvSnapshot,
    /// Command-line values.
    pub overrides: Overrides,
    /// Seed used when neither the file nor the flags set one; fixed for the process so that
    /// reloads keep the prompt hashes (and so the index) valid.
    pub process_seed: u64,
}

impl ConfigSource {
    /// Reads the file (if any), applies env and flags, validates.
    pub fn load(&self) -> Result<Config, ConfigError> {
        match &self.path {
            Some(path) => {
                let bytes = std::fs::read(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                self.load_bytes(&bytes)
            }
            None => build(
                FileConfig::default(),
                &self.env,
                &self.overrides,
                self.process_seed,
            ),
        }
    }

    /// As [`ConfigSource::load`], from the file's contents as already read.
    pub fn load_bytes(&self, bytes: &[u8]) -> Result<Config, ConfigError> {
        let path = self.path.clone().unwrap_or_default();
        let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Toml {
            path: path.clone(),
            message: format!("not UTF-8: {e}"),
        })?;
        let file = parse_toml(text, &path)?;
        build(file, &self.env, &self.overrides, self.process_seed)
    }
}

/// Parses the TOML text of a configuration file.
pub fn parse_toml(text: &str, path: &Path) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Toml {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Layers file → env → flags and validates.
pub fn build(
    mut file: FileConfig,
    env: &EnvSnapshot,
    overrides: &Overrides,
    process_seed: u64,
) -> Result<Config, ConfigError> {
    apply_env(&mut file, env.values()?);
    let o = overrides;
    let default_strategy_text = o
        .default_strategy
        .clone()
        .or(file.routing.default_strategy.clone())
        .unwrap_or_else(|| StrategySpec::default().to_string());
    let default_strategy =
        StrategySpec::parse(&default_strategy_text).map_err(|source| ConfigError::Strategy {
            spec: default_strategy_text.clone(),
            source,
        })?;
    let em = &file.engine_metrics;
    let interval_ms = em
        .scrape_interval_ms
        .unwrap_or(DEFAULT_SCRAPE_INTERVAL.as_millis() as u64);
    let scrape_interval = (interval_ms > 0).then(|| Duration::from_millis(interval_ms));
    let pc = &file.prefix_cache;
    let defaults = RouterConfig::default();
    let router = RouterConfig {
        seed: o.seed.or(file.routing.seed).unwrap_or(process_seed),
        hash_seed: pc.hash_seed,
        block_size: pc.block_size.unwrap_or(defaults.block_size),
        index_capacity: pc.block_number.unwrap_or(defaults.index_capacity),
        index_ttl_ms: pc
            .eviction_duration_mins
            .map_or(defaults.index_ttl_ms, |m| m.saturating_mul(60_000)),
        engine_view_pending_ms: defaults.engine_view_pending_ms,
        ticket_ttl_ms: file
            .routing
            .ticket_ttl_secs
            .map_or(defaults.ticket_ttl_ms, |s| s.saturating_mul(1000)),
        imbalance_abs_count: pc
            .imbalance_abs_count
            .unwrap_or(defaults.imbalance_abs_count),
        stddev_factor: pc
            .standard_deviation_factor
            .unwrap_or(defaults.stddev_factor),
        default_strategy,
        ttft: file.ttft.to_core(scrape_interval),
        health: file.health.to_core()?,
    };
    router.validate()?;

    let max_body_bytes = o
        .max_body_bytes
        .or(file.limits.max_body_bytes)
        .unwrap_or(DEFAULT_MAX_BODY_BYTES);
    if max_body_bytes == 0 || max_body_bytes > 256 * 1024 * 1024 {
        return Err(ConfigError::Limit(format!(
            "max_body_bytes must be in 1..=256 MiB, got {max_body_bytes}"
        )));
    }
    let grace = o.shutdown_grace_secs.or(file.limits.shutdown_grace_secs);
    let shutdown_grace = grace.map_or(DEFAULT_SHUTDOWN_GRACE, Duration::from_secs);

    let scrape_timeout = em
        .scrape_timeout_ms
        .map_or(DEFAULT_SCRAPE_TIMEOUT, Duration::from_millis);
    if scrape_timeout.is_zero() {
        return Err(ConfigError::Limit(
            "engine_metrics.scrape_timeout_ms must be at least 1".into(),
        ));
    }

    let discovery = file.discovery.build()?;
    if !discovery.is_static() && !file.models.is_empty() {
        return Err(ConfigError::Pods(
            "[models.NAME] sections list pods, but [discovery] finds them (source = \"kubernetes\" or \"envoy\"): remove the sections".into(),
        ));
    }
    validate_models(&file.models)?;
    let allowed = o.allow_no_models || file.routing.allow_no_models == Some(true);
    if file.models.is_empty() && discovery.is_static() && !allowed {
        return Err(ConfigError::Pods(
            "no model is configured: add [models.NAME] sections, or set [routing] allow_no_models = true (--allow-no-models) to serve none".into(),
        ));
    }
    let models: BTreeMap<String, Vec<PodEntry>> =
        file.models.into_iter().map(|(m, s)| (m, s.pods)).collect();
    let default_model = file.routing.default_model.clone();
    if let Some(m) = &default_model {
        if !models.contains_key(m) {
            return Err(ConfigError::Pods(format!(
                "default_model {m:?} is not a configured model"
            )));
        }
    }
    let kv_events =
        crate::kv_events::validate(&file.kv_events, &file.tokenizers, &models, &discovery)
            .map_err(ConfigError::KvEvents)?;
    let admission = file
        .admission
        .build(discovery.is_static().then_some(&models))?;
    Ok(Config {
        grpc_listen: o
            .grpc_listen
            .or(file.listen.grpc)
            .unwrap_or_else(|| parse_addr(DEFAULT_GRPC_LISTEN)),
        admin_listen: o
            .admin_listen
            .or(file.listen.admin)
            .unwrap_or_else(|| parse_addr(DEFAULT_ADMIN_LISTEN)),
        tls: file.listen.tls.clone(),
        router,
        default_strategy_text,
        default_model,
        models,
        max_body_bytes,
        shutdown_grace,
        scrape_interval,
        scrape_timeout,
        max_timed_streams: file
            .stream_timing
            .max_streams
            .unwrap_or(DEFAULT_MAX_TIMED_STREAMS),
        health_check: file.health.check()?,
        expose_pod_headers: file.routing.expose_pod_headers.unwrap_or(true),
        discovery,
        tokenizers: file
            .tokenizers
            .iter()
            .map(|(model, section)| Ok((model.clone(), section.to_spec(model)?)))
            .collect::<Result<_, String>>()
            .map_err(ConfigError::Tokenizer)?,
        kv_events,
        admission,
        engine_block_from_engines: file.ttft.engine_block_tokens.is_none(),
    })
}

/// Writes every AIBrix variable present over the file's value.
fn apply_env(file: &mut FileConfig, v: crate::env::EnvValues) {
    let pc = &mut file.prefix_cache;
    file.routing.default_strategy = v.default_strategy.or(file.routing.default_strategy.take());
    pc.block_size = v.block_size.or(pc.block_size);
    pc.block_number = v.block_number.or(pc.block_number);
    pc.eviction_duration_mins = v.eviction_duration_mins.or(pc.eviction_duration_mins);
    pc.imbalance_abs_count = v.imbalance_abs_count.or(pc.imbalance_abs_count);
    pc.standard_deviation_factor = v.standard_deviation_factor.or(pc.standard_deviation_factor);
    pc.hash_seed = v.hash_seed.or(pc.hash_seed);
    file.limits.max_body_bytes = v.max_body_bytes.or(file.limits.max_body_bytes);
}

/// The configuration of TOML `text` with no environment, no flags and process seed 0
/// (panics if it is invalid): for tests.
#[cfg(test)]
pub(crate) fn from_toml(text: &str) -> Config {
    let file = parse_toml(text, Path::new("test.toml")).unwrap();
    let o = Overrides {
        allow_no_models: true,
        ..Default::default()
    };
    build(file, &EnvSnapshot::default(), &o, 0).unwrap()
}

fn parse_addr(s: &str) -> SocketAddr {
    // unwrap safety: only called with the constants above, checked by a unit test.
    s.parse().expect("valid default address")
}

fn validate_models(models: &BTreeMap<String, ModelSection>) -> Result<(), ConfigError> {
    let mut addresses: BTreeMap<&str, &str> = BTreeMap::new();
    let mut capacities: BTreeMap<&str, Option<u32>> = BTreeMap::new();
    for (model, section) in models {
        if model.is_empty() {
            return Err(ConfigError::Pods("empty model name".into()));
        }
        if section.pods.is_empty() && !section.allow_no_pods {
            return Err(ConfigError::Pods(format!(
                "model {model:?} has no pods: list them, or set allow_no_pods = true in [models.{model}] to answer 503 for it"
            )));
        }
        let mut names = std::collections::HashSet::new();
        for pod in &section.pods {
            if pod.name.is_empty() {
                return Err(ConfigError::Pods(format!(
                    "model {model:?}: empty pod name"
                )));
            }
            if pod.address.parse::<SocketAddr>().is_err() {
                return Err(ConfigError::Pods(format!(
                    "model {model:?}: pod {:?} address {:?} is not ip:port",
                    pod.name, pod.address
                )));
            }
            if !names.insert(pod.name.as_str()) {
                return Err(ConfigError::Pods(format!(
                    "model {model:?}: pod {:?} listed twice",
                    pod.name
                )));
            }
            if pod.max_seqs == Some(0) {
                return Err(ConfigError::Pods(format!(
                    "model {model:?}: pod {:?} max_seqs must be at least 1",
                    pod.name
                )));
            }
            if let Some(prev) = capacities.insert(pod.name.as_str(), pod.max_seqs) {
                if prev != pod.max_seqs {
                    return Err(ConfigError::Pods(format!(
                        "pod {:?} has two max_seqs ({prev:?} and {:?})",
                        pod.name, pod.max_seqs
                    )));
                }
            }
            if let Some(prev) = addresses.insert(pod.name.as_str(), pod.address.as_str()) {
                if prev != pod.address {
                    return Err(ConfigError::Pods(format!(
                        "pod {:?} has two addresses ({prev} and {})",
                        pod.name, pod.address
                    )));
                }
            }
        }
    }
    let pods = models
        .iter()
        .flat_map(|(m, s)| s.pods.iter().map(move |p| (m, p)));
    let sizes = pods.map(|(m, p)| (m.as_str(), p.name.as_str(), p.data_parallel_size));
    crate::data_parallel::validate(sizes).map_err(ConfigError::Pods)
}

#[cfg(test)]
mod tests;
