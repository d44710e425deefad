//! The router façade: one owner, `&mut self` for every change, no IO.

mod admission;
mod completion;
mod health;
mod kv_events;
mod select_step;

use std::sync::Arc;

use crate::admission::ModelAdmission;
use crate::config::{ConfigError, RouterConfig};
use crate::decision::{Decision, LoadSnapshot, MatchView, Prediction, Reason};
use crate::engine_view::EngineViews;
use crate::hash::{BlockHash, HashConfig};
use crate::health::Admission;
use crate::ids::{ModelId, PodId, Ticket};
use crate::index::PrefixIndex;
use crate::registry::{PodInfo, PodSpec, Registry, RegistryError};
use crate::select::{self, Candidate};
use crate::stats::{match_bucket, ModelStats, RouterStats};
use crate::strategy::{Strategy, StrategySpec};
use crate::tickets::TicketTable;
use crate::time::Timestamp;
use crate::token_keys::{InvalidBlockTokens, TokenKeyConfig};
use crate::ttft::{self, EngineSnapshot, Estimate, GlobalModel, Job, TicketContext};

/// One request to route.
#[derive(Clone, Copy, Debug)]
pub struct RouteRequest<'a> {
    /// The model name from the request body.
    pub model: &'a str,
    /// The strategy the request asked for; `None` uses the configured default.
    pub strategy: Option<&'a StrategySpec>,
    /// The prompt's block keys, computed outside any lock: byte-block hashes from
    /// [`Router::hash_config`], or, when [`RouteRequest::tokens`] is set, token-block keys from
    /// [`Router::token_key_config`]. Empty for requests without a prompt.
    pub hashes: &'a [BlockHash],
    /// Set when `hashes` are token-block keys: the prompt's length in tokens and the block
    /// size, so that the TTFT model counts tokens exactly (no bytes-per-token estimate).
    /// `None`: byte blocks.
    pub tokens: Option<PromptTokens>,
    /// The request's output-token limit (`max_completion_tokens` or `max_tokens`), when it
    /// sets one: least-ttft predicts its decode as at most that many tokens.
    pub max_output_tokens: Option<u32>,
    /// The Gateway API Inference Extension's subset hint: when set, only pods whose `ip:port`
    /// is listed are candidates (none of them ready and healthy: [`RouteError::NoPodInSubset`]).
    pub endpoint_subset: Option<&'a [&'a str]>,
    /// The request's `x-session-id` header (AIBrix's encoding: base64 of the pod's `ip:port`,
    /// as [`Decision::session_id`] gives it): `session-affinity` sends the request to the pod
    /// it names, and the TTFT model (`least-ttft`) counts that pod as holding the previous
    /// turn's answer.
    pub session_id: Option<&'a str>,
    /// The request's priority for [`Router::admit`]: higher first, negative sheddable (see
    /// [`crate::Priority`]); 0 by default. [`Router::route`] ignores it.
    pub priority: i32,
    /// The request's tenant for [`Router::admit`]'s fairness (requests of one priority are
    /// served tenant by tenant); `None` is one tenant of its own. [`Router::route`] ignores it.
    pub tenant: Option<&'a str>,
}

impl<'a> RouteRequest<'a> {
    /// A request for `model` with these hashes and the default strategy.
    pub fn new(model: &'a str, hashes: &'a [BlockHash]) -> Self {
        RouteRequest {
            model,
            strategy: None,
            hashes,
            tokens: None,
            max_output_tokens: None,
            endpoint_subset: None,
            session_id: None,
            priority: 0,
            tenant: None,
        }
    }

    /// The same request with token-block keys in `hashes` (see [`RouteRequest::tokens`]).
    pub fn with_tokens(self, tokens: PromptTokens) -> Self {
        RouteRequest {
            tokens: Some(tokens),
            ..self
        }
    }

    /// The same request restricted to the pods at these `ip:port` addresses (see
    /// [`RouteRequest::endpoint_subset`]).
    pub fn with_endpoint_subset(self, addresses: &'a [&'a str]) -> Self {
        RouteRequest {
            endpoint_subset: Some(addresses),
            ..self
        }
    }

    /// The same request with an output-token limit (see [`RouteRequest::max_output_tokens`]).
    pub fn with_max_output_tokens(self, limit: Option<u32>) -> Self {
        RouteRequest {
            max_output_tokens: limit,
            ..self
        }
    }

    /// The same request with a session id (see [`RouteRequest::session_id`]).
    pub fn with_session_id(self, session_id: Option<&'a str>) -> Self {
        RouteRequest { session_id, ..self }
    }

    /// The same request with a priority and a tenant (see [`RouteRequest::priority`]).
    pub fn with_priority(self, priority: i32, tenant: Option<&'a str>) -> Self {
        RouteRequest {
            priority,
            tenant,
            ..self
        }
    }

    /// The same request with an explicit strategy.
    pub fn with_strategy(self, strategy: &'a StrategySpec) -> Self {
        RouteRequest {
            strategy: Some(strategy),
            ..self
        }
    }
}

/// A tokenized prompt's size, for a request whose keys are token blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptTokens {
    /// The prompt's length in tokens (partial last block included).
    pub prompt_tokens: u32,
    /// The block size the keys were cut at ([`crate::TokenKeyConfig::block_tokens`]).
    pub block_tokens: u32,
}

/// Why a request could not be routed. The Envoy service maps both to AIBrix's responses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// No pod serves this model (AIBrix: 400 `model_not_found`).
    #[error("model does not exist")]
    UnknownModel,
    /// The model is known but none of its pods is ready and in service (AIBrix: 503).
    #[error("no ready pod for model")]
    NoReadyPod,
    /// The request named an endpoint subset and none of the model's pods in it is ready and in
    /// service (the Gateway API Inference Extension answers 503).
    #[error("no ready pod for model in the endpoint subset")]
    NoPodInSubset,
    /// [`Router::dispatch`] of a request that is not queued (dispatched, cancelled or expired
    /// before).
    #[error("the request is not queued")]
    NotQueued,
}

#[derive(Debug, Default)]
struct Scratch {
    cands: Vec<Candidate>,
    pods: Vec<PodId>,
    matched: Vec<u32>,
    order: Vec<usize>,
    totals: Vec<f64>,
    costs: Vec<f64>,
    /// least-ttft's tie-break: the engine blocks each candidate is expected to reuse.
    reuse: Vec<u32>,
    estimates: Vec<Estimate>,
    ends: Vec<u64>,
    /// Admission's view of each candidate.
    rooms: Vec<crate::admission::PodRoom>,
    /// Pods of the model left out for their health in the last `candidates` call.
    excluded: u32,
    /// By candidate: whether its match came from its engine view.
    exact: Vec<bool>,
    /// By candidate: what the AIBrix metric strategies read.
    metrics: Vec<select::PodMetrics>,
    /// Per-strategy scores (weighted specs and the metric strategies).
    scores: Vec<Option<f64>>,
    /// The candidate the request's session id names, if any.
    session: Option<usize>,
}

/// The request's size as the TTFT model sees it: with byte blocks, the prompt's length is known
/// only in hash blocks and converted at the learned bytes per token; with token blocks, exactly.
#[derive(Clone, Copy, Debug)]
struct JobSize {
    /// Prompt bytes (byte blocks; 0 for token blocks, which teach no bytes per token).
    prompt_bytes: f64,
    prompt_tokens: f64,
    /// Tokens per index block: the byte block size over the bytes per token, or the token
    /// block size.
    block_tokens: f64,
    max_output_tokens: Option<u32>,
    /// The index of the pod the request's session id names, if it is a candidate (it computed
    /// the conversation's previous turn, answer included), else `usize::MAX`. (Not an
    /// `Option<PodId>`: comparing one in optimised code reads a `None`'s unset payload, which
    /// valgrind reports in the C ABI's tests.)
    session_pod: usize,
    /// The previous turn's answer as the model expects it (the learned output length), in
    /// tokens: what the session's pod holds beyond the index's match.
    answer_tokens: f64,
    /// The `extra` a pod that may be probed is priced at ([`ttft::probe_extra`]).
    probe_extra: f64,
    /// The `extra` of the part of the prompt no candidate was sent ([`ttft::unrouted_extra`]).
    unrouted_extra: Option<f64>,
    /// The most prompt tokens any candidate was sent (its index match, and for the session's
    /// pod the previous answer), set once the block size in tokens is known.
    sent_tokens: f64,
}

impl JobSize {
    fn job(&self, c: &Candidate, exact: bool) -> Job {
        Job {
            prompt_tokens: self.prompt_tokens,
            matched_tokens: f64::from(c.matched) * self.block_tokens,
            exact,
            session_tokens: if self.session_pod == c.pod.index() {
                self.answer_tokens
            } else {
                0.0
            },
            max_output_tokens: self.max_output_tokens,
            probe_extra: self.probe_extra,
            unrouted_extra: self.unrouted_extra,
            sent_tokens: self.sent_tokens,
        }
    }
}

/// A strategy's pick, before it is committed.
#[derive(Clone, Copy, Debug)]
struct Picked {
    index: usize,
    /// The single strategy that picked, `None` for a weighted spec.
    strategy: Option<Strategy>,
    reason: Reason,
    imbalance: bool,
    /// least-ttft: the lowest-cost other candidate.
    runner_up: Option<usize>,
    total_blocks: u32,
    /// Whether the spec has session-affinity or least-ttft (the decision then carries a
    /// session id).
    session: bool,
}

/// The routing state machine. See the crate docs for the contract.
#[derive(Debug)]
pub struct Router {
    config: RouterConfig,
    hash: HashConfig,
    registry: Registry,
    index: PrefixIndex,
    views: EngineViews,
    tickets: TicketTable,
    rng: fastrand::Rng,
    // invariant: one entry per registry model, same order.
    model_stats: Vec<ModelStats>,
    unknown_model: u64,
    global: GlobalModel,
    // invariant: the latest time passed in; every call uses max(now, latest), except that an
    // engine snapshot keeps its own (scrape) time.
    latest: Timestamp,
    scratch: Scratch,
    // invariant: one entry per registry model, same order.
    admission: Vec<ModelAdmission>,
    next_queue_id: u64,
}

impl Router {
    /// A router with no pods. Fails if the configuration is invalid.
    pub fn new(config: RouterConfig) -> Result<Router, ConfigError> {
        config.validate()?;
        let hash = config.hash_config()?;
        let seed = config.seed;
        Ok(Router {
            hash,
            registry: Registry::new(seed),
            index: PrefixIndex::new(config.index_capacity, config.index_ttl_ms, seed),
            views: EngineViews::new(hash.seed()),
            tickets: TicketTable::default(),
            rng: fastrand::Rng::with_seed(crate::hash::mix64(seed ^ 0x0072_6e67)),
            model_stats: Vec::new(),
            unknown_model: 0,
            global: GlobalModel::new(&config.ttft),
            latest: Timestamp::ZERO,
            scratch: Scratch::default(),
            admission: Vec::new(),
            next_queue_id: 0,
            config,
        })
    }

    /// Applies a new configuration without losing pods, in-flight counts or open tickets. The
    /// index is kept unless the hashing (block size or hash seed) changed, in which case its
    /// hashes mean nothing any more and it is cleared; a smaller capacity evicts the oldest
    /// blocks. The PRNG is not reseeded. What the TTFT model learned is kept; its priors take
    /// the new values wherever nothing has been learned yet (a pod's rates, the bytes per
    /// token, the expected output). Pods keep the capacity they were given.
    pub fn reconfigure(&mut self, config: RouterConfig) -> Result<(), ConfigError> {
        config.validate()?;
        let hash = config.hash_config()?;
        if hash != self.hash {
            self.index.clear();
            if hash.seed() != self.hash.seed() {
                // Engine views are keyed with the seed: rebuild them from the engines.
                self.views = EngineViews::new(hash.seed());
            }
            self.hash = hash;
        }
        self.index
            .set_limits(config.index_capacity, config.index_ttl_ms);
        self.global.set_priors(&config.ttft);
        for pod in &mut self.registry.pods {
            pod.model.set_priors(&config.ttft);
        }
        self.config = config;
        Ok(())
    }

    /// The configuration in force.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// What callers need to hash prompts outside the router's lock.
    pub fn hash_config(&self) -> HashConfig {
        self.hash
    }

    /// What token keying needs for blocks of `block_tokens` tokens (the router's hash seed), to
    /// key a tokenized prompt outside the lock (see [`RouteRequest::tokens`]).
    pub fn token_key_config(
        &self,
        block_tokens: u32,
    ) -> Result<TokenKeyConfig, InvalidBlockTokens> {
        TokenKeyConfig::new(block_tokens, self.hash.seed())
    }

    fn clock(&mut self, now: Timestamp) -> Timestamp {
        self.latest = self.latest.max(now);
        self.latest
    }

    // ----- pods and models -----

    /// Adds the pod (or updates it, keeping its in-flight count) and makes it serve `model`.
    pub fn add_pod(&mut self, model: &str, spec: PodSpec<'_>) -> Result<PodId, RegistryError> {
        if model.is_empty() {
            return Err(RegistryError::EmptyModelName);
        }
        let pod = self.registry.upsert_pod(spec, &self.config.ttft)?;
        let m = self.intern_model(model)?;
        self.registry.attach(m, pod)?;
        Ok(pod)
    }

    /// Registers a model with no pods yet: requests for it get [`RouteError::NoReadyPod`]
    /// (AIBrix's 503) rather than [`RouteError::UnknownModel`] (400). Idempotent.
    pub fn add_model(&mut self, model: &str) -> Result<ModelId, RegistryError> {
        self.intern_model(model)
    }

    /// Writes the prompt's blocks to the index under `pod` for `model` at `now`, without routing
    /// a request (no ticket, no in-flight change): for recording where a prompt is known to be
    /// cached, such as engine warm-up or an external placement.
    pub fn record_prefix(
        &mut self,
        model: &str,
        pod: PodId,
        hashes: &[BlockHash],
        now: Timestamp,
    ) -> Result<(), RegistryError> {
        let now = self.clock(now);
        let m = self
            .registry
            .model_id(model)
            .ok_or_else(|| RegistryError::UnknownModel(model.to_owned()))?;
        if !self.registry.pod(pod)?.models.contains(&m) {
            return Err(RegistryError::UnknownModel(model.to_owned()));
        }
        self.index.insert(m, pod, hashes, now);
        Ok(())
    }

    /// Adds the pod or updates its address and readiness, keeping its in-flight count and
    /// models.
    pub fn upsert_pod(&mut self, spec: PodSpec<'_>) -> Result<PodId, RegistryError> {
        self.registry.upsert_pod(spec, &self.config.ttft)
    }

    /// Sets the pod's engine capacity in concurrent sequences (vLLM `--max-num-seqs`) for the
    /// TTFT model; 0 is treated as 1.
    pub fn set_pod_capacity(&mut self, pod: PodId, max_seqs: u32) -> Result<(), RegistryError> {
        self.registry.pod_mut(pod)?.model.max_seqs = max_seqs.max(1);
        Ok(())
    }

    /// Makes the pod engine `rank` of a data-parallel server (vLLM `--data-parallel-size`:
    /// several engines, each with its own KV cache and queue, behind one address), or a whole
    /// server (`None`, the default). Each rank is added as a pod of its own under its own name
    /// and the same address; decisions carry the chosen pod's rank
    /// ([`Decision::data_parallel_rank`]) for the shell to pin the request to that engine (vLLM:
    /// the `X-data-parallel-rank` header), and a session id names the rank as well as the
    /// address.
    pub fn set_pod_data_parallel_rank(
        &mut self,
        pod: PodId,
        rank: Option<u32>,
    ) -> Result<(), RegistryError> {
        self.registry.pod_mut(pod)?.data_parallel_rank = rank;
        Ok(())
    }

    /// Records the pod's engine state as scraped at `at`. The TTFT model uses it until it is
    /// older than `ttft.snapshot_max_age_ms`, adding engine load the router did not route. It
    /// ages from `at` even when other calls have passed later times since the scrape; a later
    /// `at` moves the router's clock like any call's time.
    /// Where completions do not report first-token times, cached or prompt tokens (behind
    /// Envoy), the snapshot's cumulative counters teach the pod's prefill rate, overhead,
    /// TPOT, `trust`/`extra` and the router-wide bytes per token instead (see `ttft/engine.rs`).
    pub fn observe_engine(
        &mut self,
        pod: PodId,
        snapshot: EngineSnapshot,
        at: Timestamp,
    ) -> Result<(), RegistryError> {
        // The snapshot ages from its own time, even one earlier than the latest seen.
        self.clock(at);
        let cfg = &self.config.ttft;
        let sample = self.registry.pod_mut(pod)?.model.observe(snapshot, at, cfg);
        let from_engine = self.global.prompt_tokens == ttft::Reports::Missing;
        if let (Some(bytes_per_token), true) = (sample, from_engine) {
            self.global
                .bytes_per_token
                .learn_measured(bytes_per_token, cfg);
        }
        Ok(())
    }

    /// Sets whether the pod may receive new requests. Its in-flight count is kept.
    pub fn set_pod_ready(&mut self, pod: PodId, ready: bool) -> Result<(), RegistryError> {
        self.registry.pod_mut(pod)?.ready = ready;
        Ok(())
    }

    /// Stops `pod` from serving `model` and forgets its index entries for that model.
    pub fn detach_pod(&mut self, model: &str, pod: PodId) -> Result<(), RegistryError> {
        let m = self
            .registry
            .model_id(model)
            .ok_or_else(|| RegistryError::UnknownModel(model.to_owned()))?;
        self.registry.detach(m, pod)?;
        self.index.purge_pod(pod, Some(m));
        Ok(())
    }

    /// Removes the model: its pods stop serving it (they stay, with what else they serve), its
    /// index entries are purged, and requests for it get [`RouteError::UnknownModel`] (400)
    /// until it is added again. Its open tickets complete as usual, and its statistics stay
    /// (they carry on if it comes back). Costs a walk of the index.
    pub fn remove_model(&mut self, model: &str) -> Result<(), RegistryError> {
        let m = self.registry.remove_model(model)?;
        self.index.purge_model(m);
        Ok(())
    }

    /// Removes the pod: it gets no new requests, its index entries are purged, and its open
    /// tickets become orphans (completing them is accepted and decrements nothing). Costs a
    /// walk of the index.
    pub fn remove_pod(&mut self, pod: PodId) -> Result<(), RegistryError> {
        self.registry.remove_pod(pod)?;
        self.index.purge_pod(pod, None);
        self.views.remove(pod);
        Ok(())
    }

    /// The name of a live pod.
    pub fn pod_name(&self, pod: PodId) -> Option<&str> {
        self.registry.pod(pod).ok().map(|p| &*p.name)
    }

    /// The `ip:port` of a live pod.
    pub fn pod_address(&self, pod: PodId) -> Option<&str> {
        self.registry.pod(pod).ok().map(|p| &*p.address)
    }

    /// Changes a pod's `ip:port`, keeping everything else (in-flight count, readiness, index).
    pub fn set_pod_address(&mut self, pod: PodId, address: &str) -> Result<(), RegistryError> {
        self.registry.set_address(pod, address)
    }

    /// The id of the live pod with this name.
    pub fn pod_id(&self, name: &str) -> Option<PodId> {
        self.registry.pod_id(name)
    }

    /// A live pod.
    pub fn pod(&self, pod: PodId) -> Option<PodInfo> {
        self.registry.info(pod, &self.global)
    }

    /// Every live pod, in the order they were added.
    pub fn pods(&self) -> Vec<PodInfo> {
        self.registry
            .live_pods()
            .filter_map(|p| self.registry.info(p, &self.global))
            .collect()
    }

    /// The models served (added and not removed), in the order they were first added.
    pub fn models(&self) -> Vec<Arc<str>> {
        self.registry
            .models
            .iter()
            .filter(|m| !m.removed)
            .map(|m| m.name.clone())
            .collect()
    }

    /// The live pods serving `model`, ready or not.
    pub fn model_pods(&self, model: &str) -> Vec<PodId> {
        self.registry
            .model_id(model)
            .map(|m| self.registry.models[m.index()].pods.clone())
            .unwrap_or_default()
    }

    /// The pod's in-flight count.
    pub fn in_flight(&self, pod: PodId) -> Option<u32> {
        self.registry.pod(pod).ok().map(|p| p.in_flight)
    }

    fn intern_model(&mut self, model: &str) -> Result<ModelId, RegistryError> {
        let m = self.registry.intern_model(model)?;
        if m.index() == self.model_stats.len() {
            self.model_stats.push(ModelStats::new(
                self.registry.models[m.index()].name.clone(),
            ));
            self.admission.push(ModelAdmission::default());
        }
        Ok(m)
    }

    // ----- routing -----

    /// Picks a pod for the request and commits the choice in the same call: the pod's
    /// in-flight count goes up, the prompt's blocks are written to the index under it, and a
    /// ticket is issued. There is no window between reading loads and incrementing one
    /// (AIBrix issue #2422).
    ///
    /// The index is written whatever the strategy (AIBrix writes it only for prefix-cache), so
    /// it reflects every prompt an engine was sent. It is also written when only one pod is
    /// ready (AIBrix bypasses the router then).
    pub fn route(&mut self, req: RouteRequest<'_>, now: Timestamp) -> Result<Decision, RouteError> {
        let now = self.clock(now);
        let model = self.routed_model(&req)?;
        self.ready_candidates(model, &req, now)?;
        let total_blocks = u32::try_from(req.hashes.len()).unwrap_or(u32::MAX);
        let job = self.estimates(&req, total_blocks, now, false);
        Ok(self.select_and_commit(model, &req, job, now))
    }

    /// The request's model; counts an unknown one.
    fn routed_model(&mut self, req: &RouteRequest<'_>) -> Result<ModelId, RouteError> {
        self.registry.model_id(req.model).ok_or_else(|| {
            self.unknown_model += 1;
            RouteError::UnknownModel
        })
    }

    /// Step 1 with its error: no candidate is [`RouteError::NoReadyPod`] (or
    /// [`RouteError::NoPodInSubset`]), counted.
    fn ready_candidates(
        &mut self,
        model: ModelId,
        req: &RouteRequest<'_>,
        now: Timestamp,
    ) -> Result<(), RouteError> {
        if self.candidates(model, req, now) {
            return Ok(());
        }
        self.model_stats[model.index()].no_ready_pod += 1;
        Err(if req.endpoint_subset.is_some() {
            RouteError::NoPodInSubset
        } else {
            RouteError::NoReadyPod
        })
    }

    /// Steps 3 and 4, after the candidates and estimates.
    fn select_and_commit(
        &mut self,
        model: ModelId,
        req: &RouteRequest<'_>,
        job: JobSize,
        now: Timestamp,
    ) -> Decision {
        let total_blocks = u32::try_from(req.hashes.len()).unwrap_or(u32::MAX);
        let picked = self.select(req, total_blocks, now);
        self.commit(model, req.hashes, job, picked, now)
    }

    /// Step 1: the ready pods of `model` that their health admits (in the request's endpoint
    /// subset, when it has one), with their loads and prefix matches, into the scratch
    /// candidates. False when there is none.
    fn candidates(&mut self, model: ModelId, req: &RouteRequest<'_>, now: Timestamp) -> bool {
        let s = &mut self.scratch;
        s.cands.clear();
        s.pods.clear();
        s.excluded = 0;
        for &pod in &self.registry.models[model.index()].pods {
            let p = &self.registry.pods[pod.index()];
            if !p.ready {
                continue;
            }
            if let Some(subset) = req.endpoint_subset {
                if !subset.iter().any(|a| *a == &*p.address) {
                    continue;
                }
            }
            if p.health.admission(now) == Admission::No {
                s.excluded += 1;
                continue;
            }
            s.cands.push(Candidate {
                pod,
                load: p.in_flight,
                matched: 0,
            });
            s.pods.push(pod);
        }
        if s.cands.is_empty() {
            return false;
        }
        // Engine views first; the router-side index only for the pods without a usable one.
        s.exact.clear();
        for c in &mut s.cands {
            let engine = req
                .tokens
                .and_then(|t| self.views.leading(c.pod, req.hashes, t.block_tokens));
            c.matched = engine.unwrap_or(0);
            s.exact.push(engine.is_some());
        }
        let any_exact = s.exact.iter().any(|&e| e);
        if !any_exact || s.exact.iter().any(|&e| !e) {
            self.index
                .longest_matches(model, req.hashes, &s.pods, now, &mut s.matched);
            for ((c, &m), &exact) in s.cands.iter_mut().zip(&s.matched).zip(&s.exact) {
                if !exact {
                    c.matched = m;
                }
            }
        }
        let pending_ms = self.config.engine_view_pending_ms;
        if any_exact && pending_ms > 0 {
            // What was just sent to a pod is being computed there: its engine reports the
            // blocks only once they are. Count it, for the pending window.
            self.index.longest_matches_within(
                model,
                req.hashes,
                &s.pods,
                now,
                pending_ms,
                &mut s.matched,
            );
            for ((c, &m), &exact) in s.cands.iter_mut().zip(&s.matched).zip(&s.exact) {
                if exact {
                    c.matched = c.matched.max(m);
                }
            }
        }
        true
    }

    /// Step 4: commits the pick: index write, ticket, in-flight count, the TTFT model's open
    /// request, stats, and the decision.
    fn commit(
        &mut self,
        model: ModelId,
        hashes: &[BlockHash],
        size: JobSize,
        picked: Picked,
        now: Timestamp,
    ) -> Decision {
        let Picked {
            index,
            strategy,
            reason,
            imbalance,
            runner_up,
            total_blocks,
            session,
        } = picked;
        let s = &mut self.scratch;
        let chosen = s.cands[index];
        let exact = s.exact[index];
        let loads = LoadSnapshot {
            chosen: chosen.load,
            min: s.cands.iter().map(|c| c.load).min().unwrap_or(0),
            max: s.cands.iter().map(|c| c.load).max().unwrap_or(0),
            mean: select::mean_and_sample_stddev(&s.cands).0,
            ready: s.cands.len() as u32,
        };

        let est = match s.estimates.get(index) {
            Some(e) => *e,
            None => {
                let pod = &self.registry.pods[chosen.pod.index()].model;
                ttft::estimate(
                    pod,
                    &self.global,
                    &self.config.ttft,
                    size.job(&chosen, exact),
                    now,
                    &mut s.ends,
                )
            }
        };
        self.index.insert(model, chosen.pod, hashes, now);
        if exact && chosen.matched < total_blocks {
            // The engine will store blocks: it owes a batch of events from now.
            self.views.await_blocks(chosen.pod, now);
        }
        let context = TicketContext {
            prompt_bytes: size.prompt_bytes,
            queue_ms: est.queue_ms,
            predicted_ttft_ms: est.ttft_ms,
            uncached_tokens: est.uncached_tokens,
            indexed_tokens: est.indexed_tokens,
            exact,
            first_token_learned: false,
            usage_learned: false,
        };
        let ticket = self.tickets.issue(chosen.pod, model, now, context);
        let pod = &mut self.registry.pods[chosen.pod.index()];
        let health_probe = pod.health.admission(now) == Admission::Probe;
        pod.health.on_routed(ticket, now);
        pod.in_flight += 1;
        pod.busy.set_busy(now, true);
        pod.routed += 1;
        let job = size.job(&chosen, exact);
        ttft::commit(&mut pod.model, ticket, &est, &job, size.prompt_bytes, now);
        let prediction = Prediction {
            ttft_ms: est.ttft_ms.round() as u32,
            queue_ms: est.queue_ms.round() as u32,
            cached_tokens: est.cached_tokens as u32,
            prompt_tokens: size.prompt_tokens.round() as u32,
            stall_ms: est.stall_ms.round() as u32,
            runner_up_ttft_ms: runner_up
                .and_then(|i| s.estimates.get(i))
                .map(|r| r.ttft_ms.round() as u32),
        };

        let match_percent = select::match_percent(chosen.matched, total_blocks);
        let stats = &mut self.model_stats[model.index()];
        stats.routed_by_reason[reason.index()] += 1;
        if reason.is_prefix_cache() {
            stats.decisions_by_bucket[match_bucket(match_percent)] += 1;
        }
        if imbalance {
            stats.imbalance_events += 1;
        }
        Decision {
            pod: chosen.pod,
            pod_name: pod.name.clone(),
            address: pod.address.clone(),
            model,
            ticket,
            strategy,
            reason,
            imbalance,
            match_percent,
            matched_blocks: chosen.matched,
            view: if exact {
                MatchView::Engine
            } else {
                MatchView::Index
            },
            total_blocks,
            loads,
            prediction,
            excluded: s.excluded,
            health_probe,
            session_id: session
                .then(|| select::session_affinity::encode(&pod.address, pod.data_parallel_rank)),
            data_parallel_rank: pod.data_parallel_rank,
        }
    }

    // ----- timers -----

    /// Does the time-driven work due at `now`: drops index blocks past their TTL, expires
    /// tickets older than the ticket TTL and detached tickets past their predicted end
    /// (releasing their slots), and moves pods whose ejection is over to probing. Call it at [`Router::poll_timeout`].
    pub fn handle_timeout(&mut self, now: Timestamp) {
        let now = self.clock(now);
        self.index.expire(now);
        while let Some((ticket, t)) = self.tickets.pop_expired(now, self.config.ticket_ttl_ms) {
            self.release(ticket, t.pod, t.model, t.issued, now);
            if let Ok(p) = self.registry.pod_mut(t.pod) {
                p.health.forget_probe(ticket);
            }
        }
        while let Some((ticket, t)) = self.tickets.pop_detached(now) {
            self.release(ticket, t.pod, t.model, t.issued, now);
            if let Ok(p) = self.registry.pod_mut(t.pod) {
                p.health.forget_probe(ticket);
            }
        }
        for pod in &mut self.registry.pods {
            if !pod.removed {
                pod.health.expire_ejection(now);
            }
        }
    }

    /// When [`Router::handle_timeout`] next has work, if ever. It can move earlier after
    /// [`Router::route`] and later after [`Router::complete`], [`Router::handle_timeout`],
    /// [`Router::remove_pod`] and [`Router::reconfigure`]; shells re-read it after each.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        let index = self.index.next_expiry();
        let tickets = self.tickets.next_expiry(self.config.ticket_ttl_ms);
        let detached = self.tickets.next_detached();
        let ejections = self
            .registry
            .pods
            .iter()
            .filter(|p| !p.removed)
            .filter_map(|p| p.health.ejection_end())
            .min();
        let queued = self.queue_deadline();
        [index, tickets, detached, ejections, queued]
            .into_iter()
            .flatten()
            .min()
    }

    // ----- observation -----

    /// A snapshot of every counter.
    pub fn stats(&self) -> RouterStats {
        RouterStats {
            models: self.model_stats.clone(),
            pods: self.pods(),
            index: self.index.stats(),
            tickets: crate::tickets::TicketStats {
                open: self.tickets.open_count() as u64,
                ..self.tickets.stats
            },
            unknown_model: self.unknown_model,
            prompt_bytes_per_token: self.global.bytes_per_token.get(),
        }
    }

    /// Open tickets.
    pub fn open_tickets(&self) -> usize {
        self.tickets.open_count()
    }

    /// Whether `ticket` is open: issued, and neither completed nor expired.
    pub fn is_open(&self, ticket: Ticket) -> bool {
        self.tickets.is_open(ticket)
    }

    /// The prefix index, read-only (for inspection and benchmarks).
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// Checks cross-structure invariants: Σ in-flight over live pods equals the open tickets of
    /// live pods, and the index is consistent. For tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let live_open = self
            .tickets
            .open_tickets()
            .filter(|(_, t)| self.registry.pod(t.pod).is_ok())
            .count() as u64;
        let in_flight = self.registry.total_in_flight();
        if live_open != in_flight {
            return Err(format!(
                "open tickets on live pods {live_open} != in-flight sum {in_flight}"
            ));
        }
        for pod in self.registry.live_pods() {
            let p = &self.registry.pods[pod.index()];
            if p.model.open.len() != p.in_flight as usize {
                return Err(format!(
                    "{pod}: {} predicted ends for {} in flight",
                    p.model.open.len(),
                    p.in_flight
                ));
            }
        }
        self.index.check_invariants()
    }
}
