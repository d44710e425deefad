//! The discrete-event loop: a load client, the real [`kvroute_core::Router`] and one
//! [`Engine`] per pod, on one simulated clock (µs).
//!
//! ## Contract
//! - Deterministic: the same [`ClusterConfig`], priming calls and arrivals give the same records.
//! - Every request is routed by [`Router::route`] at its send time and completed with
//!   [`Router::complete`] (with its timings) when its last token is produced, so the loads the
//!   strategies see are the real in-flight counts. What the router is told depends on
//!   [`Feedback`]: a streaming proxy's view (first tokens and usage) or Envoy's (total time).
//! - The client holds at most `client_cap` requests in flight; an arrival beyond it is sent when
//!   a slot frees (a record's `ttft_s` counts from the actual send, its `planned_ttft_s` from
//!   the planned arrival).
//! - Every `sample_every_us` the engines' running/waiting gauges are sampled and (unless
//!   `observe_engines` is off) passed to the router as engine snapshots
//!   ([`Router::observe_engine`]), as a metrics scraper would: with every gauge, counter and
//!   histogram `kvroute-sim serve` exports (times in the engine's seconds).
//! - Events at the same instant: pod events first ([`ClusterConfig::pod_events`]: pods added,
//!   removed or failing, see `cluster/pod_events.rs`), then step ends (engine order), then
//!   sends, then the sample.
//! - Replicas may differ ([`ClusterConfig::pod_engines`]); the router is told each one's
//!   `max_num_seqs` unless [`ClusterConfig::router_max_seqs`] overrides it.
//! - Each request's prompt is tokenized once, when it is sent, by [`ClusterConfig::prompts`]
//!   (the built-in model or a real tokenizer): those ids are what its engine receives and, when
//!   the router is keyed by [`RouterBlocks::Tokens`], what its index keys are cut from. A prompt
//!   the tokenizer refuses is a failed request (status 400), never routed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kvroute_core::{AdmissionPolicy, QueueId};

use kvroute_core::{
    BlockExtras, BlockHash, Completion, EngineSnapshot, KvSource, Outcome, PodId, PodSpec,
    PromptTokens, Reason, RouteRequest, Router, RouterConfig, StrategySpec, Timestamp, Timings,
    TokenKeyConfig,
};
use serde::Serialize;

use crate::engine::{BlockEvent, Engine, EngineConfig, EngineCounters, TokenEvent};
use crate::prompt_tokens::PromptReader;
use crate::report::{RequestRecord, Slo};
use crate::workload::trace::PodEvent;
use crate::workload::Arrival;

mod admission;
mod error;
mod flight;
mod kv;
mod pod_events;
mod request;
mod setup;

pub use admission::{PRIORITY_HEADER, TENANT_HEADER};
pub use error::SimError;
use flight::{Flight, Live};
use pod_events::PodStates;

/// What the router learns about each request, as a given shell would tell it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Feedback {
    /// A streaming proxy (C or Go shell): [`Router::first_token`] at the first token with the
    /// prompt and cached tokens, and a completion with every timing.
    #[default]
    Streaming,
    /// `kvroute-ext-proc` behind Envoy as shipped: at most [`ENVOY_TIMED_STREAMS`] responses
    /// at once are timed through it, and their completions carry every timing (the first
    /// token and usage are read from the response body; nothing is reported at the first
    /// token itself); the others carry the total time only. Which are timed is decided by
    /// the rule kvroute-ext-proc calls, [`kvroute_core::Prediction::timing_budget`].
    Envoy,
    /// `kvroute-ext-proc` with `[stream_timing] max_streams = 0`: completions carry the total
    /// time only; the router learns the rest from engine snapshots.
    TotalOnly,
}

/// `kvroute-ext-proc`'s default `[stream_timing] max_streams`: how many responses it times at
/// once ([`Feedback::Envoy`]), the core's default for such shells.
pub const ENVOY_TIMED_STREAMS: usize = kvroute_core::Prediction::DEFAULT_TIMED_STREAMS;

impl Feedback {
    /// Parses `streaming`, `envoy` or `total-only`.
    pub fn parse(s: &str) -> Option<Feedback> {
        match s {
            "streaming" => Some(Feedback::Streaming),
            "envoy" => Some(Feedback::Envoy),
            "total-only" => Some(Feedback::TotalOnly),
            _ => None,
        }
    }
}

/// What the router's prefix index is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterBlocks {
    /// Blocks of the prompt's text bytes (the router's hash configuration, 128 bytes by default):
    /// what kvroute-ext-proc keys a model without a tokenizer by. The TTFT model converts bytes
    /// to tokens at a learned rate.
    Text,
    /// Blocks of the engine's `block_size` tokens of the ids the engine receives (token-block
    /// keys, [`Router::token_key_config`]), with the prompt's exact token count: what
    /// kvroute-ext-proc keys a model with `[tokenizers."<model>"]` by. An index block is then
    /// an engine cache block.
    Tokens,
}

impl RouterBlocks {
    /// Parses `text` or `tokens`.
    pub fn parse(s: &str) -> Option<RouterBlocks> {
        match s {
            "text" => Some(RouterBlocks::Text),
            "tokens" => Some(RouterBlocks::Tokens),
            _ => None,
        }
    }

    /// The default for a tokenizer: token blocks with a real tokenizer, text blocks with the
    /// built-in model.
    pub fn default_for(prompts: &PromptReader) -> RouterBlocks {
        if prompts.is_built_in() {
            RouterBlocks::Text
        } else {
            RouterBlocks::Tokens
        }
    }
}

/// What a simulated cluster is made of.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Every replica's engine, unless `pod_engines` names it.
    pub engine: EngineConfig,
    /// The engines of the replicas named here instead of `engine` (replicas of different
    /// speeds and capacities). Each must name a pod of `pods` and have `engine`'s block size
    /// (the router's token keys and the KV events are cut in it).
    pub pod_engines: BTreeMap<String, EngineConfig>,
    /// Pod names, one engine each.
    pub pods: Vec<String>,
    /// The model name routed for.
    pub model: String,
    /// The router's configuration (its `seed` makes the run's random choices).
    pub router: RouterConfig,
    /// The client's in-flight cap.
    pub client_cap: usize,
    /// The SLO requests are judged against.
    pub slo: Slo,
    /// Gauge sampling period, µs.
    pub sample_every_us: u64,
    /// Time from a request's send (and routing) to its arrival in the engine's queue, µs: the
    /// gateway, the HTTP hops and the API server's tokenization. It adds to TTFT and E2E.
    pub overhead_us: u64,
    /// Whether the gauge samples are passed to the router as engine snapshots (a shell that
    /// scrapes `/metrics`); off = the router knows only what it routed.
    pub observe_engines: bool,
    /// The per-pod capacity told to the router ([`Router::set_pod_capacity`], used by
    /// `least-ttft`); `None` = each pod's engine's `max_num_seqs`, as a shell that knows its
    /// pods would.
    pub router_max_seqs: Option<u32>,
    /// What the router is told about each request.
    pub feedback: Feedback,
    /// How prompts become the token ids the engines receive (and, with token blocks, the
    /// router's keys): the built-in model by default.
    pub prompts: PromptReader,
    /// What the router's index is keyed by; `None` = [`RouterBlocks::default_for`] the
    /// tokenizer (text blocks with the built-in model, token blocks with a real tokenizer).
    pub router_blocks: Option<RouterBlocks>,
    /// Whether the engines publish KV events that feed the router's engine views, as
    /// kvroute-ext-proc's subscriber would (token blocks only): each step's events are applied
    /// as one batch when the step ends, numbered per engine from 0.
    pub kv_events: bool,
    /// The router's admission policy for the model ([`Router::admit`]; `None`: off, every
    /// request is routed at once). Requests carry their priority and tenant in the
    /// `x-kvroute-priority` and `x-kvroute-tenant` headers.
    pub admission: Option<AdmissionPolicy>,
    /// How many times a client sends a request again after a 429, `Retry-After` later.
    pub shed_retries: u32,
    /// Pods added, removed or failing during the first run, in time order (see
    /// `cluster/pod_events.rs`; not with `kv_events`).
    pub pod_events: Vec<PodEvent>,
}

impl ClusterConfig {
    /// The engine of the pod named `pod`: its `pod_engines` entry, else `engine`.
    pub fn engine_of(&self, pod: &str) -> EngineConfig {
        self.pod_engines.get(pod).copied().unwrap_or(self.engine)
    }

    /// What the router's index is keyed by (the configured choice, token blocks with KV
    /// events, or the tokenizer's default).
    pub fn router_blocks(&self) -> RouterBlocks {
        match (self.router_blocks, self.kv_events) {
            (Some(b), _) => b,
            (None, true) => RouterBlocks::Tokens,
            (None, false) => RouterBlocks::default_for(&self.prompts),
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            engine: EngineConfig::default(),
            pod_engines: BTreeMap::new(),
            pods: vec!["A".into(), "B".into()],
            model: "study".into(),
            router: RouterConfig::default(),
            client_cap: 48,
            slo: Slo::default(),
            sample_every_us: 5_000_000,
            overhead_us: 0,
            observe_engines: true,
            router_max_seqs: None,
            feedback: Feedback::Streaming,
            prompts: PromptReader::built_in(),
            router_blocks: None,
            kv_events: false,
            admission: None,
            shed_retries: 0,
            pod_events: Vec::new(),
        }
    }
}

/// The gauges at one sampling instant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GaugeSample {
    /// Seconds from the phase start.
    pub t_s: f64,
    /// Running requests per pod.
    pub running: Vec<u32>,
    /// Waiting requests per pod.
    pub waiting: Vec<u32>,
}

/// What one run produced.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// Per-request records, in arrival order.
    pub records: Vec<RequestRecord>,
    /// Token hit rate from the engines' counter deltas (hits / queries).
    pub token_hit: Option<f64>,
    /// Each engine's counter deltas over the run.
    pub engines: Vec<EngineCounters>,
    /// Gauge samples.
    pub samples: Vec<GaugeSample>,
    /// Largest sampled waiting queue per pod.
    pub peak_waiting: Vec<u32>,
    /// Decisions by reason during the run (from the router's stats).
    pub reasons: BTreeMap<String, u64>,
    /// prefix-cache imbalance-guard events during the run.
    pub imbalance_events: u64,
    /// Output tokens per second from the first send to the last token.
    pub output_throughput: f64,
    /// Simulated duration, s.
    pub duration_s: f64,
    /// [`Feedback::Envoy`]: responses timed (their completions carried every timing), and the
    /// most timed at once.
    pub timed_responses: u64,
    /// See `timed_responses`.
    pub peak_timed_responses: usize,
    /// least-ttft's predictions against the first tokens the router was told of, per pod.
    pub ttft_calibration: Vec<crate::report::PodCalibration>,
}

impl RunResult {
    /// The decisions by reason, `reason=count` separated by spaces.
    pub fn reasons_text(&self) -> String {
        let reasons: Vec<String> = self
            .reasons
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        reasons.join(" ")
    }

    /// The largest sampled waiting queue per pod, `pod=count` separated by spaces, for the
    /// pods named `pods` (in the cluster's order).
    pub fn peaks_text(&self, pods: &[String]) -> String {
        let peaks: Vec<String> = pods
            .iter()
            .zip(&self.peak_waiting)
            .map(|(p, w)| format!("{p}={w}"))
            .collect();
        peaks.join(" ")
    }
}

/// A router and its engines.
pub struct Cluster {
    config: ClusterConfig,
    router: Router,
    engines: Vec<Engine>,
    pod_ids: Vec<PodId>,
    /// [`RouterBlocks::Tokens`]: how the router's keys are cut from token ids.
    token_keys: Option<TokenKeyConfig>,
    /// [`Feedback::Envoy`]: responses being timed, timed in this run, and the most at once.
    timed_open: usize,
    timed_total: u64,
    timed_peak: usize,
    /// [`ClusterConfig::kv_events`]: each engine's next batch number, and scratch.
    kv_seq: Vec<u64>,
    kv_scratch: Vec<BlockEvent>,
    /// [`ClusterConfig::kv_events`]: each engine's cache as its published events tell it.
    published: Vec<kv::PublishedCache>,
    /// Requests the router holds: the request and its keys, to offer again.
    queued: BTreeMap<QueueId, (usize, Keyed)>,
    /// [`ClusterConfig::pod_events`]: which pods are listed and alive, and what is to come.
    pod_state: PodStates,
}

fn ts(us: u64) -> Timestamp {
    Timestamp::from_millis(us / 1000)
}

/// Pod `i`'s `ip:port`.
fn pod_address(i: usize) -> String {
    format!("127.0.{}.{}:8000", i / 250, i % 250 + 1)
}

/// A prompt as the cluster routes and serves it.
struct Keyed {
    /// The token ids its engine receives.
    ids: Vec<u32>,
    /// The router's keys.
    hashes: Vec<BlockHash>,
    /// Set when `hashes` are token-block keys.
    tokens: Option<PromptTokens>,
}

impl Cluster {
    /// Fresh engines (idle, empty caches) and a fresh router with the pods registered.
    pub fn new(config: ClusterConfig) -> Result<Cluster, SimError> {
        if config.pods.is_empty() || config.pods.len() > 4096 {
            return Err(SimError::PodCount(config.pods.len()));
        }
        if config.client_cap == 0 {
            return Err(SimError::ClientCap);
        }
        for (pod, e) in &config.pod_engines {
            if !config.pods.contains(pod) {
                return Err(SimError::UnknownPod(pod.clone()));
            }
            if e.block_size != config.engine.block_size {
                return Err(SimError::PodBlockSize {
                    pod: pod.clone(),
                    block_size: e.block_size,
                    expected: config.engine.block_size,
                });
            }
        }
        let pod_state = PodStates::new(&config)?;
        let mut router = Router::new(config.router.clone())?;
        let token_keys = match config.router_blocks() {
            RouterBlocks::Text => None,
            RouterBlocks::Tokens => Some(router.token_key_config(config.engine.block_size)?),
        };
        let mut pod_ids = Vec::new();
        let mut engines = Vec::new();
        for (i, name) in config.pods.iter().enumerate() {
            let address = pod_address(i);
            let id = router.add_pod(
                &config.model,
                PodSpec {
                    name,
                    address: &address,
                    ready: true,
                },
            )?;
            let engine_config = config.engine_of(name);
            router.set_pod_capacity(
                id,
                config.router_max_seqs.unwrap_or(engine_config.max_num_seqs),
            )?;
            pod_ids.push(id);
            let mut engine = Engine::new(engine_config)?;
            engine.record_kv_events(config.kv_events);
            engines.push(engine);
            if !pod_state.listed[i] {
                // Added later by a pod line: never routed to before.
                router.remove_pod(id)?;
            }
        }
        if config.kv_events {
            // Subscribed since the engines started with empty caches: batch 0 says so.
            for &id in &pod_ids {
                router.apply_kv_events(id, KvSource::Live, 0, &[], Timestamp::ZERO)?;
            }
        }
        router.set_admission(&config.model, config.admission)?;
        let kv_seq = vec![u64::from(config.kv_events); pod_ids.len()];
        Ok(Cluster {
            config,
            router,
            engines,
            pod_ids,
            token_keys,
            timed_open: 0,
            timed_total: 0,
            timed_peak: 0,
            published: vec![kv::PublishedCache::default(); kv_seq.len()],
            kv_seq,
            kv_scratch: Vec::new(),
            queued: BTreeMap::new(),
            pod_state,
        })
    }

    /// The router (for inspection).
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// What the router's index is keyed by.
    pub fn router_blocks(&self) -> RouterBlocks {
        if self.token_keys.is_some() {
            RouterBlocks::Tokens
        } else {
            RouterBlocks::Text
        }
    }

    /// `prompt`'s token ids and the router's keys for it.
    fn keyed(&self, prompt: &str) -> Result<Keyed, kvroute_tokens::EncodeError> {
        let ids = self.config.prompts.completion(prompt)?;
        Ok(match &self.token_keys {
            None => Keyed {
                hashes: self.router.hash_config().hashes(prompt.as_bytes()),
                tokens: None,
                ids,
            },
            Some(k) => Keyed {
                hashes: k.keys(&ids, BlockExtras::default()),
                tokens: Some(PromptTokens {
                    prompt_tokens: u32::try_from(ids.len()).unwrap_or(u32::MAX),
                    block_tokens: k.block_tokens(),
                }),
                ids,
            },
        })
    }

    /// Caches `prompt`'s blocks on engine `pod` (no time passes, no counter moves). Fails only
    /// if a real tokenizer refuses the prompt.
    pub fn prime_engine(&mut self, pod: usize, prompt: &str) -> Result<(), SimError> {
        let ids = self.config.prompts.completion(prompt)?;
        if let Some(e) = self.engines.get_mut(pod) {
            e.prime(&ids);
            self.publish_kv_events(pod, 0);
        }
        Ok(())
    }

    /// Writes `prompt` into the router's index under `pod`, the way the study's bootstrap did:
    /// by routing it while the other pods are not ready, and completing it at once. The
    /// decision counts in the router's stats; [`Cluster::run`] reports deltas. The keys are
    /// the ones a request with this prompt is routed with.
    pub fn place_in_index(&mut self, pod: usize, prompt: &str) -> Result<(), SimError> {
        let keyed = self.keyed(prompt)?;
        for (i, &id) in self.pod_ids.iter().enumerate() {
            if self.pod_state.listed[i] {
                self.router.set_pod_ready(id, i == pod)?;
            }
        }
        let spec = StrategySpec::single(kvroute_core::Strategy::LeastRequest);
        let mut request = RouteRequest::new(&self.config.model, &keyed.hashes).with_strategy(&spec);
        if let Some(t) = keyed.tokens {
            request = request.with_tokens(t);
        }
        let decision = self.router.route(request, Timestamp::ZERO);
        if let Ok(d) = decision {
            let _ = self.router.complete(
                d.ticket,
                Completion::new(Outcome::Cancelled),
                Timestamp::ZERO,
            );
        }
        for (i, &id) in self.pod_ids.iter().enumerate() {
            if self.pod_state.listed[i] {
                self.router.set_pod_ready(id, true)?;
            }
        }
        Ok(())
    }

    fn reasons_and_imbalance(&self) -> (BTreeMap<String, u64>, u64) {
        let stats = self.router.stats();
        let Some(m) = stats
            .models
            .iter()
            .find(|m| &*m.model == self.config.model.as_str())
        else {
            return (BTreeMap::new(), 0);
        };
        let reasons = Reason::ALL
            .iter()
            .map(|r| (r.as_str().to_owned(), m.routed(*r)))
            .collect();
        (reasons, m.imbalance_events)
    }

    fn snapshot(&mut self, now_us: u64, samples: &mut Vec<GaugeSample>) {
        let counters: Vec<EngineCounters> = self.engines.iter().map(Engine::counters).collect();
        for (e, (c, &id)) in counters.iter().zip(&self.pod_ids).enumerate() {
            let config = self.engines[e].config();
            let snap = EngineSnapshot {
                running: c.running,
                waiting: c.waiting,
                kv_usage: Some(c.kv_usage),
                // As vLLM's cache_config_info gives it: num_gpu_blocks × block_size.
                kv_cache_tokens: Some(
                    u64::from(config.kv_capacity_blocks) * u64::from(config.block_size),
                ),
                prefix_queries: Some(c.prefix_cache_queries),
                prefix_hits: Some(c.prefix_cache_hits),
                prefill_seconds: Some(c.prefill_time_us as f64 / 1e6),
                prefills: Some(c.prefills),
                inter_token_seconds: Some(c.inter_token_time_us as f64 / 1e6),
                inter_tokens: Some(c.inter_tokens),
                // The finished-request histograms: each counts the finished requests.
                queue_seconds: Some(c.queue_time_us as f64 / 1e6),
                queue_requests: Some(c.finished),
                decode_seconds: Some(c.decode_time_us as f64 / 1e6),
                decode_requests: Some(c.finished),
                request_prompt_tokens: Some(c.request_prompt_tokens),
                prompt_requests: Some(c.finished),
                request_generation_tokens: Some(c.request_generation_tokens),
                generation_requests: Some(c.finished),
            };
            // A dead engine cannot be scraped; a removed one is not the router's.
            if self.config.observe_engines && self.pod_state.serving(e) {
                let _ = self.router.observe_engine(id, snap, ts(now_us));
            }
        }
        samples.push(GaugeSample {
            t_s: now_us as f64 / 1e6,
            running: counters.iter().map(|c| c.running).collect(),
            waiting: counters.iter().map(|c| c.waiting).collect(),
        });
    }

    /// Runs the arrivals to completion (requests that cannot be routed or are rejected by the
    /// engine are recorded as failures). `default_strategy` applies to requests without a
    /// `routing-strategy` header; `label` and `strategy_name` go into the records.
    pub fn run(
        &mut self,
        arrivals: &[Arrival],
        default_strategy: &StrategySpec,
        label: &str,
    ) -> Result<RunResult, SimError> {
        (self.timed_total, self.timed_peak) = (0, self.timed_open);
        // Parse per-request strategies up front so a bad trace fails before anything runs.
        let mut specs: Vec<Option<StrategySpec>> = Vec::with_capacity(arrivals.len());
        for (i, a) in arrivals.iter().enumerate() {
            let spec = match a
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("routing-strategy"))
            {
                Some((_, v)) => {
                    Some(StrategySpec::parse(v).map_err(|source| SimError::Strategy {
                        index: i + 1,
                        source,
                    })?)
                }
                None => None,
            };
            specs.push(spec);
        }
        let (reasons0, imbalance0) = self.reasons_and_imbalance();
        let calibration0 = self.router.pods();
        let counters0: Vec<EngineCounters> = (0..self.engines.len())
            .map(|e| self.engine_counters(e))
            .collect();
        let n = arrivals.len();
        let mut live: Vec<Live> = (0..n).map(|_| Live::default()).collect();
        let mut records: Vec<RequestRecord> = arrivals
            .iter()
            .enumerate()
            .map(|(i, a)| RequestRecord {
                phase: label.to_owned(),
                strategy: specs[i].as_ref().unwrap_or(default_strategy).to_string(),
                index: i + 1,
                family: a.family,
                planned_s: a.at_us as f64 / 1e6,
                ..Default::default()
            })
            .collect();
        let mut busy_until: Vec<Option<u64>> = vec![None; self.engines.len()];
        let mut deferred: VecDeque<usize> = VecDeque::new();
        let mut flight = Flight::default();
        // Requests sent at their `at` (in order), and conversations' later turns: each one's
        // next turn, and the turns due after an answer ended (when, id).
        let starts: Vec<usize> = (0..n).filter(|&i| arrivals[i].follows.is_none()).collect();
        let mut next_turn: Vec<Option<usize>> = vec![None; n];
        for (i, a) in arrivals.iter().enumerate() {
            if let Some(f) = a.follows {
                next_turn[f.previous] = Some(i);
            }
        }
        let mut turns_due: BTreeSet<(u64, usize)> = BTreeSet::new();
        let mut ended: Vec<usize> = Vec::new();
        let mut next_arrival = 0usize;
        let mut next_sample = 0u64;
        let mut samples = Vec::new();
        let mut events: Vec<TokenEvent> = Vec::new();
        let mut now = 0u64;
        // Offers the requests the router holds (see `cluster/admission.rs`).
        macro_rules! pump {
            () => {
                self.pump_queue(
                    now,
                    arrivals,
                    &specs,
                    default_strategy,
                    &mut live,
                    &mut records,
                    &mut flight,
                )
            };
        }

        while flight.done < n {
            ended.extend(flight.take_ended());
            for id in ended.drain(..) {
                if let Some(next) = next_turn[id] {
                    let due = now + arrivals[next].follows.map_or(0, |f| f.think_us);
                    records[next].planned_s = due as f64 / 1e6;
                    turns_due.insert((due, next));
                }
            }
            let step_end = busy_until
                .iter()
                .enumerate()
                .filter_map(|(e, t)| t.map(|t| (t, e)))
                .min();
            let arrival = [
                starts.get(next_arrival).map(|&id| (arrivals[id].at_us, id)),
                turns_due.first().copied(),
            ]
            .into_iter()
            .flatten()
            .min();
            let arrival_at = arrival.map(|(at, _)| at);
            let pending_at = flight.pending.front().map(|p| p.0);
            let retry_at = flight.retries.first().map(|r| r.0);
            let deadline_at = self.router.queue_deadline().map(|t| t.as_millis() * 1_000);
            let pod_event_at = self.pod_state.next_at();
            if step_end.is_none()
                && arrival_at.is_none()
                && deferred.is_empty()
                && flight.pending.is_empty()
                && retry_at.is_none()
                && deadline_at.is_none()
                && pod_event_at.is_none()
            {
                // Nothing can happen any more (every remaining request failed to start).
                break;
            }
            let t_next = [
                pod_event_at,
                step_end.map(|(t, _)| t),
                pending_at,
                arrival_at,
                retry_at,
                deadline_at,
                Some(next_sample),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now);
            now = t_next.max(now);

            if pod_event_at.is_some_and(|t| t <= now) {
                self.apply_pod_events(now, &mut live, &mut records, &mut flight, &mut busy_until)?;
                pump!();
                continue;
            }
            if let Some((t, e)) = step_end.filter(|(t, _)| *t <= now) {
                busy_until[e] = None;
                events.clear();
                self.engines[e].finish_step(&mut events);
                self.publish_kv_events(e, t);
                for ev in &events {
                    let id = ev.id as usize;
                    let l = &mut live[id];
                    if l.first_us.is_none() {
                        l.first_us = Some(t);
                        let streaming = self.config.feedback == Feedback::Streaming;
                        if let (Some(ticket), true) = (l.ticket, streaming) {
                            let first = Timings {
                                first_token_ms: Some((t - l.routed_us) / 1000),
                                prompt_tokens: Some(ev.prompt_tokens),
                                cached_tokens: Some(ev.cached_tokens),
                                ..Timings::default()
                            };
                            let _ = self.router.first_token(ticket, first, ts(t));
                        }
                    }
                    l.last_us = Some(t);
                    l.generated = ev.generated;
                    l.cached = ev.cached_tokens;
                    l.prompt = ev.prompt_tokens;
                    if ev.finished {
                        flight.answered(id);
                        self.finish(&mut records[id], l, t);
                    }
                }
                busy_until[e] = self.engines[e].start_step().map(|d| t + d);
                pump!();
                while flight.in_flight < self.config.client_cap {
                    let Some(id) = deferred.pop_front() else {
                        break;
                    };
                    let spec = specs[id].as_ref().unwrap_or(default_strategy);
                    flight.sent(self.send(id, &arrivals[id], spec, now, &mut live, &mut records));
                }
                continue;
            }
            if deadline_at.is_some_and(|d| d <= now) {
                self.expire_queue(now, &mut records, &mut live, &mut flight);
                continue;
            }
            if let Some(id) = flight.due_retry(now) {
                let spec = specs[id].as_ref().unwrap_or(default_strategy);
                let sent = self.send(id, &arrivals[id], spec, now, &mut live, &mut records);
                flight.sent(sent);
                continue;
            }
            if let Some(&(_, id, pod)) = flight.pending.front().filter(|p| p.0 <= now) {
                flight.pending.pop_front();
                if !self.submit(
                    id,
                    pod,
                    &arrivals[id],
                    now,
                    &mut live,
                    &mut records,
                    &mut busy_until,
                ) {
                    flight.answered(id);
                }
                continue;
            }
            if let Some((at, id)) = arrival.filter(|&(at, _)| at <= now) {
                // A later turn leaves the due set; a request sent at its `at` the start list.
                if !turns_due.remove(&(at, id)) {
                    next_arrival += 1;
                }
                if flight.in_flight < self.config.client_cap {
                    let spec = specs[id].as_ref().unwrap_or(default_strategy);
                    flight.sent(self.send(id, &arrivals[id], spec, now, &mut live, &mut records));
                    pump!();
                } else {
                    deferred.push_back(id);
                }
                continue;
            }
            if next_sample <= now {
                self.snapshot(now, &mut samples);
                next_sample = now + self.config.sample_every_us.max(1);
                pump!();
            }
        }
        self.snapshot(now, &mut samples);

        let engines: Vec<EngineCounters> = counters0
            .iter()
            .enumerate()
            .map(|(e, c0)| {
                let c = self.engine_counters(e);
                EngineCounters {
                    prefix_cache_queries: c.prefix_cache_queries - c0.prefix_cache_queries,
                    prefix_cache_hits: c.prefix_cache_hits - c0.prefix_cache_hits,
                    steps: c.steps - c0.steps,
                    preemptions: c.preemptions - c0.preemptions,
                    evictions: c.evictions - c0.evictions,
                    prompt_tokens_computed: c.prompt_tokens_computed - c0.prompt_tokens_computed,
                    generation_tokens: c.generation_tokens - c0.generation_tokens,
                    finished: c.finished - c0.finished,
                    ..c
                }
            })
            .collect();
        let (q, h) = engines.iter().fold((0, 0), |(q, h), c| {
            (q + c.prefix_cache_queries, h + c.prefix_cache_hits)
        });
        let (reasons1, imbalance1) = self.reasons_and_imbalance();
        let reasons = reasons1
            .into_iter()
            .map(|(k, v)| {
                let before = reasons0.get(&k).copied().unwrap_or(0);
                (k, v - before)
            })
            .filter(|(_, v)| *v > 0)
            .collect();
        let first_send = live.iter().map(|l| l.sent_us).min().unwrap_or(0);
        let tokens: u64 = live.iter().map(|l| u64::from(l.generated)).sum();
        let span = now.saturating_sub(first_send) as f64 / 1e6;
        let peak_waiting = (0..self.engines.len())
            .map(|e| samples.iter().map(|s| s.waiting[e]).max().unwrap_or(0))
            .collect();
        Ok(RunResult {
            records,
            token_hit: (q > 0).then(|| h as f64 / q as f64),
            engines,
            samples,
            peak_waiting,
            reasons,
            imbalance_events: imbalance1 - imbalance0,
            output_throughput: if span > 0.0 {
                tokens as f64 / span
            } else {
                0.0
            },
            duration_s: now as f64 / 1e6,
            timed_responses: self.timed_total,
            peak_timed_responses: self.timed_peak,
            ttft_calibration: self
                .router
                .pods()
                .iter()
                .map(|p| {
                    let before = calibration0
                        .iter()
                        .find(|b| b.name == p.name)
                        .map(|b| b.ttft_calibration)
                        .unwrap_or_default();
                    crate::report::PodCalibration::between(&p.name, &before, &p.ttft_calibration)
                })
                .collect(),
        })
    }
}
