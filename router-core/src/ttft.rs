//! The time-to-first-token model behind `least-ttft`.
//!
//! For a request of `P` prompt tokens on pod `p`:
//!
//! ```text
//! cached   = ⌊min(matched_blocks × block_size / bytes_per_token, P) / engine_block⌋ × engine_block
//! uncached = P − cached
//! expected = trust_p × cached + extra_p × (P − cached)     (what the engine will really reuse)
//! slot_at  = now                              if fewer than capacity_p requests are open on p
//!          = the (n − capacity_p + 1)-th earliest predicted end of p's n open requests, otherwise
//! start    = max(slot_at, latest predicted prefill end of p's open requests)   (FCFS prefill)
//! ttft     = (start − now) + overhead_p + (P − expected) / prefill_rate_p
//! end      = now + ttft + (expected_output − 1) × tpot_p
//! ```
//!
//! - `matched_blocks` is the prefix index's contiguous match for `p`; only whole engine blocks
//!   count, because an engine can only reuse whole KV blocks.
//! - Every routed request (whatever strategy routed it) records its predicted prefill end and
//!   `end` on its pod until it completes, so slot and prefill waits see all traffic and vanish
//!   with it; a request past its predicted end is assumed to need 40% of a typical decode more.
//! - The index is not the engine's cache. Completions that report `cached_tokens` teach two
//!   per-pod fractions: `trust_p`, the share of index-predicted tokens the engine really reused
//!   (prior 1; below 1 when the engine evicts), and `extra_p`, the share of the rest it reused
//!   anyway (prior 0; above 0 when the engine holds prefixes the index never saw: warm engines,
//!   other routers). Each moves by at most `learning_rate` per sample.
//! - `capacity_p` is the configured `max_seqs` (per pod or default), raised to the most running
//!   sequences an engine snapshot has shown. (It is never lowered from snapshots: a request
//!   waits a step before it runs, so "waiting > 0" says little about capacity.)
//! - Slot and prefill waits are recomputed at every estimate by replaying the pod's open
//!   requests, in issue order, through its slots and FCFS prefill with the current rates.
//! - A fresh engine snapshot (see [`EngineSnapshot`]) adds the engine's requests the router did
//!   not route itself (other router replicas) as open requests ending half a service time away:
//!   `unseen = running + waiting − own`, where `own` is the number of this router's open
//!   requests on the pod when the snapshot was recorded. (Requests routed or completed since
//!   then are in, or gone from, the open requests already, so neither is counted twice.)
//!   At most `MAX_UNSEEN` (4,096) are counted.
//! - `prefill_rate_p`, `overhead_p` and `tpot_p` start at configured priors and are learned per
//!   pod from successful completions; `bytes_per_token` and `expected_output` are learned across
//!   pods. Learning is a bounded EWMA: each sample is first clamped to within a factor
//!   `max_sample_ratio` of the current estimate, so one outlier moves an estimate by at most
//!   `learning_rate × (max_sample_ratio − 1)` of itself, and failed or cancelled requests are
//!   never learned from.
//! - Prefill rate samples come only from requests predicted to start at once (no slot wait, no
//!   prefill backlog) with at least one engine block to prefill; overhead samples from those
//!   with less than one block to prefill.
//! - Engine snapshots that carry vLLM's cumulative timing counters (where the router sees no
//!   first token, as behind Envoy) are a second source for the same per-pod rates: one
//!   prefill-rate sample per at least 4 prefills (prompt tokens computed, i.e. prefix-cache
//!   queries − hits, per second of `request_prefill_time`) and one TPOT sample per at least 64
//!   output-token gaps (`time_per_output_token`). The prefill windows are fitted together to
//!   `prefill seconds = prefills × overhead + tokens / rate` (decayed least squares), which
//!   also teaches the overhead; until they separate the two, a window's plain ratio is the rate
//!   sample. Prefills that overlap on the engine each count their whole duration, so under
//!   overlap the rate comes out low (the model then leans towards cached pods).
//! - Between snapshots that show no waiting request, what was routed to a pod is compared with
//!   what its engine scheduled: prompt bytes per scheduled token (`prefix_cache_queries`) for
//!   the router-wide bytes per token, and the engine's `prefix_cache_hits` against the indexed
//!   and other tokens routed for `trust` and `extra` (the per-request rule below, applied to
//!   the window's sums).
//! - Engine counters teach a quantity only where completions do not: a pod's prefill rate,
//!   overhead and TPOT once its completions have come without first-token times (behind
//!   Envoy), its `trust` and `extra` once they have come without cached tokens, and the bytes
//!   per token once completions have come without prompt tokens. Until the first completion,
//!   and for good once one carries the signal, the per-request samples are the source
//!   (window sums are biased where requests overlap; per-request samples are chosen where
//!   they do not).

use crate::ids::Ticket;
use crate::time::Timestamp;

/// The share of a typical decode a request is still assumed to need once it has outlived its
/// predicted end (it is running long, so its remaining time is uncertain, not zero).
const OVERRUN_TAIL: f64 = 0.4;

/// The most unseen requests (engine queue minus this router's own) one snapshot can add to an
/// estimate. The replay is linear in them; beyond a few thousand queued requests the pod is
/// hopeless anyway, and a corrupt snapshot (`waiting = 4e9`) must not cost seconds per route.
const MAX_UNSEEN: u32 = 4_096;

/// Parameters and priors of the TTFT model. Defaults are vLLM's defaults where a vLLM setting
/// exists, and round numbers for a mid-size model on one GPU otherwise; configure the engine
/// facts (`engine_block_tokens`, `max_seqs`) and let the rates be learned.
#[derive(Clone, Debug, PartialEq)]
pub struct TtftConfig {
    /// Prior prompt bytes per engine token (learned from completions that report
    /// `prompt_tokens`). Default 4.0, typical of English text with BPE tokenizers.
    pub bytes_per_token: f64,
    /// The engine's KV block size in tokens: only whole blocks are reused. Default 16 (vLLM);
    /// the study's hybrid model aligns at 1,568.
    pub engine_block_tokens: u32,
    /// Default concurrent sequences per pod (vLLM `--max-num-seqs`, default 256); override per
    /// pod with [`crate::Router::set_pod_capacity`].
    pub max_seqs: u32,
    /// Prior prefill throughput per pod, tokens/s. Default 3,000.
    pub prefill_tokens_per_s: f64,
    /// Prior time per output token per pod, ms. Default 50.
    pub tpot_ms: f64,
    /// Prior fixed part of TTFT per pod (first decode step, network), ms. Default 50.
    pub overhead_ms: f64,
    /// Prior expected output tokens per request. Default 128.
    pub output_tokens: f64,
    /// EWMA weight of one sample, in (0, 1]. Default 0.2.
    pub learning_rate: f64,
    /// A sample is clamped to `[estimate / r, estimate × r]` before it is learned. Default 3.
    pub max_sample_ratio: f64,
    /// Engine snapshots older than this are ignored, ms. Default 2,000.
    pub snapshot_max_age_ms: u64,
    /// Predictions closer than this tie, ms; ties go to the better prefix match, then the
    /// lower load, then the seeded PRNG. Default 300: predictions on a loaded engine are
    /// good to a few hundred ms, and within that, keeping a prefix where it is cached pays
    /// later.
    pub tie_ms: f64,
}

impl Default for TtftConfig {
    fn default() -> Self {
        TtftConfig {
            bytes_per_token: 4.0,
            engine_block_tokens: 16,
            max_seqs: 256,
            prefill_tokens_per_s: 3_000.0,
            tpot_ms: 50.0,
            overhead_ms: 50.0,
            output_tokens: 128.0,
            learning_rate: 0.2,
            max_sample_ratio: 3.0,
            snapshot_max_age_ms: 2_000,
            tie_ms: 300.0,
        }
    }
}

impl TtftConfig {
    /// The name of the first invalid field, if any.
    pub(crate) fn invalid_field(&self) -> Option<&'static str> {
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.bytes_per_token) {
            return Some("ttft.bytes_per_token");
        }
        if self.engine_block_tokens == 0 {
            return Some("ttft.engine_block_tokens");
        }
        if self.max_seqs == 0 {
            return Some("ttft.max_seqs");
        }
        if !positive(self.prefill_tokens_per_s) {
            return Some("ttft.prefill_tokens_per_s");
        }
        if !positive(self.tpot_ms) {
            return Some("ttft.tpot_ms");
        }
        if !(self.overhead_ms.is_finite() && self.overhead_ms >= 0.0) {
            return Some("ttft.overhead_ms");
        }
        if !positive(self.output_tokens) {
            return Some("ttft.output_tokens");
        }
        if !(positive(self.learning_rate) && self.learning_rate <= 1.0) {
            return Some("ttft.learning_rate");
        }
        if !(self.max_sample_ratio.is_finite() && self.max_sample_ratio >= 1.0) {
            return Some("ttft.max_sample_ratio");
        }
        if !(self.tie_ms.is_finite() && self.tie_ms >= 0.0) {
            return Some("ttft.tie_ms");
        }
        None
    }
}

/// A bounded exponentially weighted moving average (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Ewma {
    value: f64,
}

impl Ewma {
    pub(crate) fn new(prior: f64) -> Self {
        Ewma { value: prior }
    }

    pub(crate) fn get(self) -> f64 {
        self.value
    }

    /// Learns one sample; non-finite or non-positive samples are ignored.
    pub(crate) fn learn(&mut self, sample: f64, cfg: &TtftConfig) {
        if !(sample.is_finite() && sample > 0.0) {
            return;
        }
        let r = cfg.max_sample_ratio;
        let s = sample.clamp(self.value / r, self.value * r);
        self.value += cfg.learning_rate * (s - self.value);
    }
}

/// An engine's own view of its load, as scraped from its metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineSnapshot {
    /// Sequences running (`vllm:num_requests_running`).
    pub running: u32,
    /// Requests waiting (`vllm:num_requests_waiting`).
    pub waiting: u32,
    /// KV cache usage in [0, 1] (`vllm:kv_cache_usage_perc`), when known.
    pub kv_usage: Option<f64>,
    /// Prefix-cache queries in tokens, cumulative (`vllm:prefix_cache_queries_total`).
    pub prefix_queries: Option<u64>,
    /// Prefix-cache hits in tokens, cumulative (`vllm:prefix_cache_hits_total`).
    pub prefix_hits: Option<u64>,
    /// Seconds from scheduling to first token, summed over requests, cumulative
    /// (`vllm:request_prefill_time_seconds_sum`).
    pub prefill_seconds: Option<f64>,
    /// Requests counted in `prefill_seconds`, cumulative (`..._count`).
    pub prefills: Option<u64>,
    /// Seconds between consecutive output tokens, summed, cumulative
    /// (`vllm:time_per_output_token_seconds_sum`, or `vllm:inter_token_latency_seconds_sum`).
    pub inter_token_seconds: Option<f64>,
    /// Gaps counted in `inter_token_seconds`, cumulative (`..._count`).
    pub inter_tokens: Option<u64>,
}

/// Prefills an engine must have finished since the last prefill-rate sample before the next
/// one is taken from its counters (the prompt tokens are counted when requests are scheduled
/// and the prefill time when their first token comes: over several prefills the requests
/// straddling the window's ends weigh less).
const MIN_ENGINE_PREFILLS: u64 = 4;

/// Output-token gaps an engine must have reported since the last TPOT sample before the next
/// one is taken from its counters.
const MIN_ENGINE_TOKEN_GAPS: u64 = 64;

/// Where the last rate sample taken from an engine's counters left off.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct EngineRateBase {
    // (prefills, prefill seconds, prompt tokens computed = queries − hits)
    prefill: Option<(u64, f64, u64)>,
    // (token gaps, inter-token seconds)
    decode: Option<(u64, f64)>,
    // The engine's prefix-cache counters and the routed totals, when the engine last had no
    // waiting request.
    routed: Option<RoutedTotals>,
    fit: PrefillFit,
}

/// What was routed to a pod (cumulative, as the model saw it), beside its engine's
/// prefix-cache counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct RoutedTotals {
    /// The engine's `prefix_cache_queries` (prompt tokens scheduled).
    queries: u64,
    /// The engine's `prefix_cache_hits`.
    hits: u64,
    /// Prompt bytes routed (as estimated from the hash blocks).
    pub(crate) prompt_bytes: f64,
    /// Prompt tokens the index said the pod held, in whole engine blocks.
    pub(crate) indexed_tokens: f64,
    /// The other prompt tokens.
    pub(crate) unindexed_tokens: f64,
}

/// How much an older prefill window weighs in the fit, per newer window.
const FIT_DECAY: f64 = 0.9;

/// One window of an engine's prefill counters.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PrefillWindow {
    prefills: f64,
    tokens: f64,
    seconds: f64,
}

/// Decayed least-squares sums for `seconds = prefills × a + tokens × b` (no intercept).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct PrefillFit {
    pp: f64,
    pt: f64,
    tt: f64,
    py: f64,
    ty: f64,
}

impl PrefillFit {
    fn add(&mut self, w: PrefillWindow) {
        let d = FIT_DECAY;
        self.pp = d * self.pp + w.prefills * w.prefills;
        self.pt = d * self.pt + w.prefills * w.tokens;
        self.tt = d * self.tt + w.tokens * w.tokens;
        self.py = d * self.py + w.prefills * w.seconds;
        self.ty = d * self.ty + w.tokens * w.seconds;
    }

    /// `(a, b)` = (overhead seconds per prefill, seconds per token), when the windows separate
    /// them (the squared correlation of prefills and tokens below 0.99) and both are positive.
    fn solve(&self) -> Option<(f64, f64)> {
        let det = self.pp * self.tt - self.pt * self.pt;
        // Also false for NaN.
        let separable = det > 0.01 * self.pp * self.tt;
        if !separable {
            return None;
        }
        let a = (self.tt * self.py - self.pt * self.ty) / det;
        let b = (self.pp * self.ty - self.pt * self.py) / det;
        (a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite()).then_some((a, b))
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct ObservedEngine {
    pub(crate) snapshot: EngineSnapshot,
    pub(crate) at: Timestamp,
    // the router's own open requests on the pod when the snapshot was recorded
    pub(crate) own_open: u32,
}

/// A learned fraction in [0, 1]: a plain EWMA of samples clamped to [0, 1], so one sample
/// moves it by at most the learning rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Fraction {
    value: f64,
}

impl Fraction {
    pub(crate) fn new(prior: f64) -> Self {
        Fraction {
            value: prior.clamp(0.0, 1.0),
        }
    }

    pub(crate) fn get(self) -> f64 {
        self.value
    }

    pub(crate) fn learn(&mut self, sample: f64, cfg: &TtftConfig) {
        if sample.is_finite() {
            self.value += cfg.learning_rate * (sample.clamp(0.0, 1.0) - self.value);
        }
    }
}

/// One open request on a pod, as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct OpenRequest {
    pub(crate) ticket: Ticket,
    /// When it was routed.
    pub(crate) issued: Timestamp,
    /// Prompt tokens it was predicted to prefill.
    pub(crate) uncached_tokens: f64,
}

/// The learned state of one pod.
#[derive(Clone, Debug)]
pub(crate) struct PodModel {
    /// Configured capacity (per pod or default).
    pub(crate) max_seqs: u32,
    /// The most running sequences an engine snapshot has shown.
    pub(crate) max_running_seen: u32,
    pub(crate) prefill_tps: Ewma,
    pub(crate) tpot_ms: Ewma,
    pub(crate) overhead_ms: Ewma,
    pub(crate) trust: Fraction,
    pub(crate) extra: Fraction,
    // invariant: one entry per open ticket routed to this pod, in issue order.
    pub(crate) open: Vec<OpenRequest>,
    pub(crate) engine: Option<ObservedEngine>,
    pub(crate) engine_rates: EngineRateBase,
    pub(crate) predicted_hit_tokens: u64,
    /// What was routed to the pod, cumulative (the engine counters unused here).
    pub(crate) routed: RoutedTotals,
    /// Whether its completions report first-token times (engine counters teach its prefill
    /// rate, overhead and TPOT only when they do not).
    pub(crate) first_tokens: Reports,
    /// Whether its completions report prompt and cached tokens (engine counters teach its
    /// `trust` and `extra` only when they do not).
    pub(crate) cached_tokens: Reports,
}

impl PodModel {
    pub(crate) fn new(cfg: &TtftConfig) -> Self {
        PodModel {
            max_seqs: cfg.max_seqs,
            max_running_seen: 0,
            prefill_tps: Ewma::new(cfg.prefill_tokens_per_s),
            tpot_ms: Ewma::new(cfg.tpot_ms),
            overhead_ms: Ewma::new(cfg.overhead_ms),
            trust: Fraction::new(1.0),
            extra: Fraction::new(0.0),
            open: Vec::new(),
            engine: None,
            engine_rates: EngineRateBase::default(),
            predicted_hit_tokens: 0,
            routed: RoutedTotals::default(),
            first_tokens: Reports::Unknown,
            cached_tokens: Reports::Unknown,
        }
    }

    /// The sequence slots the model assumes.
    pub(crate) fn capacity(&self) -> u32 {
        self.max_seqs.max(self.max_running_seen).max(1)
    }

    /// Records a snapshot and learns the pod's rates from it; returns a sample of prompt bytes
    /// per engine token for the router-wide estimate, when one is due.
    pub(crate) fn observe(
        &mut self,
        snapshot: EngineSnapshot,
        at: Timestamp,
        cfg: &TtftConfig,
    ) -> Option<f64> {
        self.max_running_seen = self.max_running_seen.max(snapshot.running);
        self.learn_from_engine(&snapshot, cfg);
        let bytes_per_token = self.learn_from_routed(&snapshot, cfg);
        self.engine = Some(ObservedEngine {
            snapshot,
            at,
            own_open: u32::try_from(self.open.len()).unwrap_or(u32::MAX),
        });
        bytes_per_token
    }

    /// Compares what was routed to the pod with what its engine scheduled, between two
    /// snapshots that show no waiting request (so every request routed before each of them
    /// had been scheduled, transit aside) and over at least `MIN_ENGINE_PREFILLS` engine
    /// blocks of prompt tokens: learns `trust` (hits on the indexed tokens) and `extra` (hits
    /// beyond them) from the engine's prefix-cache hits as [`learn`] does per request, and
    /// returns the prompt bytes per scheduled token for the router-wide estimate.
    fn learn_from_routed(&mut self, s: &EngineSnapshot, cfg: &TtftConfig) -> Option<f64> {
        let (queries, hits) = (s.prefix_queries?, s.prefix_hits?);
        if s.waiting > 0 {
            return None;
        }
        let now = RoutedTotals {
            queries,
            hits,
            ..self.routed
        };
        let Some(base) = self.engine_rates.routed else {
            self.engine_rates.routed = Some(now);
            return None;
        };
        if queries < base.queries || hits < base.hits {
            self.engine_rates.routed = Some(now);
            return None;
        }
        let tokens = (queries - base.queries) as f64;
        let block = f64::from(cfg.engine_block_tokens);
        if tokens < MIN_ENGINE_PREFILLS as f64 * block {
            return None;
        }
        self.engine_rates.routed = Some(now);
        let hit = (hits - base.hits) as f64;
        let indexed = now.indexed_tokens - base.indexed_tokens;
        let unindexed = now.unindexed_tokens - base.unindexed_tokens;
        let from_engine = self.cached_tokens == Reports::Missing;
        if indexed >= block && from_engine {
            self.trust.learn(hit.min(indexed) / indexed, cfg);
        }
        if unindexed >= block && from_engine {
            self.extra.learn((hit - indexed).max(0.0) / unindexed, cfg);
        }
        let bytes = now.prompt_bytes - base.prompt_bytes;
        (bytes > 0.0).then(|| bytes / tokens)
    }

    /// Learns the pod's prefill rate and TPOT from the engine's cumulative counters: prompt
    /// tokens computed (prefix-cache queries − hits) per second of prefill time, over at least
    /// [`MIN_ENGINE_PREFILLS`] prefills; inter-token seconds per gap, over at least
    /// [`MIN_ENGINE_TOKEN_GAPS`] gaps. A counter that went down (engine restart) starts a new
    /// window without a sample.
    fn learn_from_engine(&mut self, s: &EngineSnapshot, cfg: &TtftConfig) {
        if self.first_tokens != Reports::Missing {
            return;
        }
        if let (Some(n), Some(secs), Some(q), Some(h)) = (
            s.prefills,
            s.prefill_seconds,
            s.prefix_queries,
            s.prefix_hits,
        ) {
            let now = (n, secs, q.saturating_sub(h));
            match self.engine_rates.prefill {
                Some((n0, s0, c0)) if n >= n0 && secs >= s0 && now.2 >= c0 => {
                    if n - n0 >= MIN_ENGINE_PREFILLS {
                        let window = PrefillWindow {
                            prefills: (n - n0) as f64,
                            tokens: (now.2 - c0) as f64,
                            seconds: secs - s0,
                        };
                        self.learn_prefill_window(window, cfg);
                        self.engine_rates.prefill = Some(now);
                    }
                }
                _ => self.engine_rates.prefill = Some(now),
            }
        }
        if let (Some(n), Some(secs)) = (s.inter_tokens, s.inter_token_seconds) {
            match self.engine_rates.decode {
                Some((n0, s0)) if n >= n0 && secs >= s0 => {
                    if n - n0 >= MIN_ENGINE_TOKEN_GAPS {
                        self.tpot_ms
                            .learn((secs - s0) * 1_000.0 / (n - n0) as f64, cfg);
                        self.engine_rates.decode = Some((n, secs));
                    }
                }
                _ => self.engine_rates.decode = Some((n, secs)),
            }
        }
    }

    /// Fits `seconds = prefills × overhead + tokens / rate` to the windows seen so far (least
    /// squares, older windows decaying by [`FIT_DECAY`] each) and learns the fitted rate and
    /// overhead. While the windows cannot separate the two (too few, or tokens proportional to
    /// prefills) or the fit is not positive, the window's plain ratio `tokens / seconds` is the
    /// rate sample (low by the overhead) and the overhead is left alone.
    fn learn_prefill_window(&mut self, w: PrefillWindow, cfg: &TtftConfig) {
        if !(w.seconds > 0.0 && w.seconds.is_finite()) {
            return;
        }
        let fit = &mut self.engine_rates.fit;
        fit.add(w);
        match fit.solve() {
            Some((overhead_s, s_per_token)) => {
                self.prefill_tps.learn(1.0 / s_per_token, cfg);
                self.overhead_ms.learn(overhead_s * 1_000.0, cfg);
            }
            None if w.tokens >= f64::from(cfg.engine_block_tokens) => {
                self.prefill_tps.learn(w.tokens / w.seconds, cfg);
            }
            None => {}
        }
    }

    pub(crate) fn forget_ticket(&mut self, ticket: Ticket) {
        if let Some(i) = self.open.iter().position(|o| o.ticket == ticket) {
            self.open.remove(i);
        }
    }
}

/// Learned quantities shared by all pods.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GlobalModel {
    pub(crate) bytes_per_token: Ewma,
    pub(crate) output_tokens: Ewma,
    /// Whether completions report `prompt_tokens` (engine counters teach `bytes_per_token`
    /// only when they do not).
    pub(crate) prompt_tokens: Reports,
}

/// Whether completions carry a per-request signal: unknown until the first completion; once
/// one carries it, [`Reports::Present`] for good.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Reports {
    /// No completion yet.
    #[default]
    Unknown,
    /// Completions so far came without it: engine counters are the source.
    Missing,
    /// A completion carried it: per-request samples are the source.
    Present,
}

impl Reports {
    fn note(&mut self, present: bool) {
        *self = match (*self, present) {
            (Reports::Present, _) | (_, true) => Reports::Present,
            (_, false) => Reports::Missing,
        };
    }
}

impl GlobalModel {
    pub(crate) fn new(cfg: &TtftConfig) -> Self {
        GlobalModel {
            bytes_per_token: Ewma::new(cfg.bytes_per_token),
            output_tokens: Ewma::new(cfg.output_tokens),
            prompt_tokens: Reports::Unknown,
        }
    }
}

/// One pod's predicted TTFT for one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Estimate {
    pub(crate) ttft_ms: f64,
    /// Time before this request's prefill can start (slot wait and prefill backlog), ms.
    pub(crate) queue_ms: f64,
    /// Tokens the engine is expected to reuse (index match corrected by what was learned).
    pub(crate) cached_tokens: f64,
    /// Tokens the index alone says are cached (whole engine blocks).
    pub(crate) indexed_tokens: f64,
    pub(crate) uncached_tokens: f64,
}

/// What a request looks like to the model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Job {
    pub(crate) prompt_tokens: f64,
    pub(crate) matched_bytes: f64,
}

/// Predicts the TTFT of `job` on the pod by replaying the pod's open requests through its
/// sequence slots and FCFS prefill with the current learned rates (so a wrong earlier guess
/// does not stick): each open request takes the earliest free slot at or after its issue time,
/// prefills after the requests before it, then decodes; one still open past that is assumed to need
/// [`OVERRUN_TAIL`] of a decode more. A fresh engine snapshot adds the requests the router did not route,
/// as half-done. The new request then takes the next slot and prefills after all of them.
/// `scratch` is reused space for the slot heap.
pub(crate) fn estimate(
    pod: &PodModel,
    global: &GlobalModel,
    cfg: &TtftConfig,
    job: Job,
    now: Timestamp,
    scratch: &mut Vec<u64>,
) -> Estimate {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    let block = f64::from(cfg.engine_block_tokens);
    let matched_tokens = (job.matched_bytes / global.bytes_per_token.get()).min(job.prompt_tokens);
    let indexed = (matched_tokens / block).floor() * block;
    let reusable = (job.prompt_tokens / block).floor() * block;
    let expected =
        (pod.trust.get() * indexed + pod.extra.get() * (job.prompt_tokens - indexed)).min(reusable);
    let uncached = (job.prompt_tokens - expected).max(0.0);
    let tpot = pod.tpot_ms.get();
    let decode_ms = (global.output_tokens.get() - 1.0).max(0.0) * tpot;
    let prefill_ms = |tokens: f64| tokens / pod.prefill_tps.get() * 1_000.0;
    let now_ms = now.as_millis() as f64;
    // A request still open after its predicted end has run long; assume it needs a further
    // OVERRUN_TAIL of a typical decode rather than ending this instant.
    let tail_ms = OVERRUN_TAIL * decode_ms + tpot;

    let unseen = pod
        .engine
        .filter(|e| now.millis_since(e.at) <= cfg.snapshot_max_age_ms)
        .map_or(0, |engine| {
            engine
                .snapshot
                .running
                .saturating_add(engine.snapshot.waiting)
                .saturating_sub(engine.own_open)
                .min(MAX_UNSEEN)
        });

    // Slot-free times, as a min-heap of whole microseconds. The replay takes a slot
    // `open + unseen + 1` times and every slot taken is given back later than now, so free
    // slots beyond that many are never reached: the heap holds at most that many (the same
    // result as `capacity` free slots, at a cost independent of the capacity).
    let takes = pod.open.len() + unseen as usize + 1;
    scratch.clear();
    scratch.resize((pod.capacity() as usize).min(takes), 0);
    let mut slots: BinaryHeap<Reverse<u64>> =
        std::mem::take(scratch).into_iter().map(Reverse).collect();
    let take_slot = |slots: &mut BinaryHeap<Reverse<u64>>| {
        slots.pop().map_or(0.0, |Reverse(us)| us as f64 / 1_000.0)
    };
    let mut prefill_free = 0.0f64;
    for o in &pod.open {
        let start = take_slot(&mut slots).max(o.issued.as_millis() as f64);
        let prefill_end = start.max(prefill_free) + prefill_ms(o.uncached_tokens);
        prefill_free = prefill_end;
        let end = (prefill_end + decode_ms).max(now_ms + tail_ms);
        slots.push(Reverse((end * 1_000.0) as u64));
    }
    for _ in 0..unseen {
        let end = take_slot(&mut slots).max(now_ms) + decode_ms / 2.0;
        slots.push(Reverse((end * 1_000.0) as u64));
    }
    let start = take_slot(&mut slots).max(now_ms).max(prefill_free);
    *scratch = slots.into_iter().map(|Reverse(us)| us).collect();
    let queue_ms = start - now_ms;
    let ttft_ms = queue_ms + pod.overhead_ms.get() + prefill_ms(uncached);
    Estimate {
        ttft_ms,
        queue_ms,
        cached_tokens: expected,
        indexed_tokens: indexed,
        uncached_tokens: uncached,
    }
}

/// Commits a routed request to its pod's open requests.
pub(crate) fn commit(
    pod: &mut PodModel,
    ticket: Ticket,
    est: &Estimate,
    job: &Job,
    prompt_bytes: f64,
    now: Timestamp,
) {
    let r = &mut pod.routed;
    r.prompt_bytes += prompt_bytes;
    r.indexed_tokens += est.indexed_tokens;
    r.unindexed_tokens += (job.prompt_tokens - est.indexed_tokens).max(0.0);
    pod.open.push(OpenRequest {
        ticket,
        issued: now,
        uncached_tokens: est.uncached_tokens,
    });
    pod.predicted_hit_tokens += est.cached_tokens as u64;
}

/// What the router remembers about a routed request, for learning at completion.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct TicketContext {
    pub(crate) prompt_bytes: f64,
    pub(crate) queue_ms: f64,
    pub(crate) uncached_tokens: f64,
    pub(crate) indexed_tokens: f64,
}

/// Learns from one successful completion (see the module docs for which samples count).
pub(crate) fn learn(
    pod: &mut PodModel,
    global: &mut GlobalModel,
    cfg: &TtftConfig,
    ctx: &TicketContext,
    timings: &crate::tickets::Timings,
) {
    pod.first_tokens.note(timings.first_token_ms.is_some());
    pod.cached_tokens
        .note(timings.prompt_tokens.is_some() && timings.cached_tokens.is_some());
    global.prompt_tokens.note(timings.prompt_tokens.is_some());
    if let (Some(tokens), true) = (timings.prompt_tokens, ctx.prompt_bytes > 0.0) {
        global
            .bytes_per_token
            .learn(ctx.prompt_bytes / f64::from(tokens.max(1)), cfg);
    }
    if let Some(out) = timings.output_tokens {
        global.output_tokens.learn(f64::from(out), cfg);
    }
    if let (Some(first), Some(total), Some(out)) = (
        timings.first_token_ms,
        timings.total_ms,
        timings.output_tokens,
    ) {
        if out >= 2 && total > first {
            pod.tpot_ms
                .learn((total - first) as f64 / f64::from(out - 1), cfg);
        }
    }
    if let (Some(prompt), Some(cached)) = (timings.prompt_tokens, timings.cached_tokens) {
        let (prompt, cached) = (f64::from(prompt), f64::from(cached));
        let block = f64::from(cfg.engine_block_tokens);
        let indexed = ctx.indexed_tokens.min(prompt);
        if indexed >= block {
            pod.trust.learn(cached.min(indexed) / indexed, cfg);
        }
        if prompt - indexed >= block {
            pod.extra
                .learn((cached - indexed).max(0.0) / (prompt - indexed), cfg);
        }
    }
    let Some(first) = timings.first_token_ms else {
        return;
    };
    if ctx.queue_ms > 0.0 {
        return;
    }
    let uncached = match (timings.prompt_tokens, timings.cached_tokens) {
        (Some(p), Some(c)) => f64::from(p.saturating_sub(c)),
        _ => ctx.uncached_tokens,
    };
    let first = first as f64;
    if uncached < f64::from(cfg.engine_block_tokens) {
        pod.overhead_ms.learn(first.max(1.0), cfg);
    } else {
        let prefill_ms = first - pod.overhead_ms.get();
        if prefill_ms > 1.0 {
            pod.prefill_tps.learn(uncached / prefill_ms * 1_000.0, cfg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn cfg() -> TtftConfig {
        TtftConfig {
            engine_block_tokens: 1_568,
            max_seqs: 2,
            bytes_per_token: 5.6,
            ..Default::default()
        }
    }

    #[test]
    fn cached_tokens_count_whole_engine_blocks_only() {
        let c = cfg();
        let (pod, g) = (PodModel::new(&c), GlobalModel::new(&c));
        // 5,000-token prompt; the index matched 4,977 tokens' worth: 3 whole blocks = 4,704.
        let job = Job {
            prompt_tokens: 5_000.0,
            matched_bytes: 4_977.0 * 5.6,
        };
        let e = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(e.cached_tokens, 4_704.0);
        assert_eq!(e.uncached_tokens, 296.0);
        assert_eq!(e.queue_ms, 0.0);
        assert!((e.ttft_ms - (50.0 + 296.0 / 3.0)).abs() < 1e-9);
    }

    #[test]
    fn a_full_pod_waits_for_its_earliest_slot_and_prefill_is_fcfs() {
        // max_seqs 2, prefill 3,000 tokens/s, 127 decode tokens at 50 ms = 6,350 ms.
        let c = cfg();
        let (mut pod, g) = (PodModel::new(&c), GlobalModel::new(&c));
        let open = |n, issued, uncached| OpenRequest {
            ticket: Ticket(n),
            issued: t(issued),
            uncached_tokens: uncached,
        };
        // Two requests routed at 0: the first prefills 3,000 tokens (1 s), the second none.
        pod.open = vec![open(1, 0, 3_000.0), open(2, 0, 0.0)];
        let job = Job {
            prompt_tokens: 3_000.0,
            matched_bytes: 0.0,
        };
        let e = estimate(&pod, &g, &c, job, t(1_000), &mut Vec::new());
        assert_eq!(e.queue_ms, 6_350.0, "both slots free at 1,000 + 6,350");
        assert_eq!(e.ttft_ms, 6_350.0 + 50.0 + 1_000.0);
        pod.max_seqs = 3;
        let e = estimate(&pod, &g, &c, job, t(1_000), &mut Vec::new());
        assert_eq!(
            e.queue_ms, 0.0,
            "a free slot, and earlier prefills are done by 1,000"
        );
        pod.max_seqs = 4;
        pod.open.push(open(3, 900, 3_000.0));
        let e = estimate(&pod, &g, &c, job, t(1_000), &mut Vec::new());
        assert_eq!(
            e.queue_ms, 1_000.0,
            "FCFS prefill: request 1 until 1,000, then the one routed at 900 until 2,000"
        );
        // A request still open past its predicted end holds its slot for 40% of a decode more
        // (0.4 × 6,350 + one token of 50).
        pod.max_seqs = 1;
        pod.open = vec![open(4, 0, 0.0)];
        let e = estimate(&pod, &g, &c, job, t(60_000), &mut Vec::new());
        assert_eq!(e.queue_ms, 2_590.0);
    }

    #[test]
    fn fresh_snapshots_add_unseen_load_and_stale_ones_are_ignored() {
        let c = cfg();
        let (mut pod, g) = (PodModel::new(&c), GlobalModel::new(&c));
        pod.engine = Some(ObservedEngine {
            snapshot: EngineSnapshot {
                running: 2,
                waiting: 1,
                ..Default::default()
            },
            at: t(0),
            own_open: 0,
        });
        let job = Job {
            prompt_tokens: 100.0,
            matched_bytes: 0.0,
        };
        assert!(estimate(&pod, &g, &c, job, t(1_000), &mut Vec::new()).queue_ms > 0.0);
        assert_eq!(
            estimate(&pod, &g, &c, job, t(2_001), &mut Vec::new()).queue_ms,
            0.0
        );
    }

    #[test]
    fn snapshot_load_the_router_routed_is_not_counted_twice() {
        let c = cfg(); // max_seqs 2
        let (mut pod, g) = (PodModel::new(&c), GlobalModel::new(&c));
        let open = |n| OpenRequest {
            ticket: Ticket(n),
            issued: t(0),
            uncached_tokens: 0.0,
        };
        pod.open = vec![open(1), open(2)];
        // The engine shows exactly the router's two requests.
        pod.observe(
            EngineSnapshot {
                running: 2,
                ..Default::default()
            },
            t(0),
            &c,
        );
        // One completes: a slot is free, with no phantom request left in its place.
        pod.forget_ticket(Ticket(1));
        let job = Job {
            prompt_tokens: 100.0,
            matched_bytes: 0.0,
        };
        assert_eq!(
            estimate(&pod, &g, &c, job, t(10), &mut Vec::new()).queue_ms,
            0.0
        );
        // A request routed after the snapshot fills the slot once, not twice.
        pod.open.push(open(3));
        let busy = estimate(&pod, &g, &c, job, t(10), &mut Vec::new()).queue_ms;
        pod.engine = None;
        assert_eq!(
            estimate(&pod, &g, &c, job, t(10), &mut Vec::new()).queue_ms,
            busy
        );
    }

    #[test]
    fn completions_teach_how_far_the_index_is_from_the_engine() {
        let c = cfg();
        let (mut pod, mut g) = (PodModel::new(&c), GlobalModel::new(&c));
        let job = Job {
            prompt_tokens: 5_000.0,
            matched_bytes: 0.0,
        };
        let cold = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(cold.cached_tokens, 0.0);
        // The index knew nothing, yet the engine reused 4,704 tokens (a warm engine).
        let ctx = TicketContext {
            prompt_bytes: 28_000.0,
            indexed_tokens: 0.0,
            ..Default::default()
        };
        let surprise = crate::tickets::Timings {
            prompt_tokens: Some(5_000),
            cached_tokens: Some(4_704),
            ..Default::default()
        };
        for _ in 0..10 {
            learn(&mut pod, &mut g, &c, &ctx, &surprise);
        }
        let warm = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert!(warm.cached_tokens > 3_500.0, "{warm:?}");
        assert!(warm.ttft_ms < cold.ttft_ms / 2.0);
        // The index promised 4,704 tokens and the engine had none (it evicted them).
        let (mut pod, mut g) = (PodModel::new(&c), GlobalModel::new(&c));
        let ctx = TicketContext {
            indexed_tokens: 4_704.0,
            ..ctx
        };
        let evicted = crate::tickets::Timings {
            prompt_tokens: Some(5_000),
            cached_tokens: Some(0),
            ..Default::default()
        };
        learn(&mut pod, &mut g, &c, &ctx, &evicted);
        assert!(
            (pod.trust.get() - 0.8).abs() < 1e-9,
            "one sample moves trust by the learning rate"
        );
    }

    #[test]
    fn engine_counters_teach_prefill_rate_and_tpot_without_first_tokens() {
        let c = TtftConfig {
            prefill_tokens_per_s: 1_000.0, // truth below: 8,000
            tpot_ms: 100.0,                // truth below: 25
            ..cfg()
        };
        let mut pod = PodModel::new(&c);
        // Completions came without first-token times or cached tokens (behind Envoy).
        pod.first_tokens = Reports::Missing;
        pod.cached_tokens = Reports::Missing;
        // Every second the engine finishes 4 prefills of 4,000 computed tokens (0.5 s each)
        // and 400 output-token gaps of 25 ms.
        let snap = |k: u64| EngineSnapshot {
            prefix_queries: Some(k * 20_000),
            prefix_hits: Some(k * 4_000),
            prefills: Some(k * 4),
            prefill_seconds: Some(k as f64 * 2.0),
            inter_tokens: Some(k * 400),
            inter_token_seconds: Some(k as f64 * 10.0),
            ..Default::default()
        };
        for k in 0..30 {
            pod.observe(snap(k), t(k * 1_000), &c);
        }
        assert!(
            (pod.prefill_tps.get() - 8_000.0).abs() < 100.0,
            "{:?}",
            pod.prefill_tps
        );
        assert!((pod.tpot_ms.get() - 25.0).abs() < 0.5, "{:?}", pod.tpot_ms);

        // A restart (counters back near zero) is a new window, not a sample.
        let before = (pod.prefill_tps.get(), pod.tpot_ms.get());
        pod.observe(snap(1), t(40_000), &c);
        assert_eq!((pod.prefill_tps.get(), pod.tpot_ms.get()), before);
        // Fewer than 4 prefills or 64 gaps since the last sample: no sample yet.
        let mut few = snap(1);
        few.prefills = Some(7);
        few.prefill_seconds = Some(100.0);
        few.inter_tokens = Some(450);
        few.inter_token_seconds = Some(100.0);
        pod.observe(few, t(41_000), &c);
        assert_eq!((pod.prefill_tps.get(), pod.tpot_ms.get()), before);
        // Snapshots without the timing counters teach nothing.
        let mut pod = PodModel::new(&c);
        pod.first_tokens = Reports::Missing;
        for k in 0..5 {
            pod.observe(
                EngineSnapshot {
                    running: 3,
                    prefix_queries: Some(k * 20_000),
                    ..Default::default()
                },
                t(k * 1_000),
                &c,
            );
        }
        assert_eq!(pod.prefill_tps.get(), 1_000.0);
        assert_eq!(pod.tpot_ms.get(), 100.0);
        // Where completions carry first-token times (or before any completion), the engine
        // counters teach nothing: the per-request samples are the source.
        for reports in [Reports::Unknown, Reports::Present] {
            let mut pod = PodModel::new(&c);
            pod.first_tokens = reports;
            for k in 0..30 {
                pod.observe(snap(k), t(k * 1_000), &c);
            }
            assert_eq!((pod.prefill_tps.get(), pod.tpot_ms.get()), (1_000.0, 100.0));
        }
    }

    #[test]
    fn prefill_windows_of_different_mixes_separate_overhead_from_rate() {
        let c = TtftConfig {
            prefill_tokens_per_s: 1_000.0, // truth: 16,000 tokens/s
            overhead_ms: 100.0,            // truth: 10 ms per prefill
            ..cfg()
        };
        let mut pod = PodModel::new(&c);
        // Completions came without first-token times or cached tokens (behind Envoy).
        pod.first_tokens = Reports::Missing;
        pod.cached_tokens = Reports::Missing;
        let (mut n, mut secs, mut computed) = (0u64, 0.0f64, 0u64);
        for k in 0..60u64 {
            // Four prefills per window, alternately mostly cached and cold.
            let tokens = if k % 2 == 0 { 1_200 } else { 20_000 };
            n += 4;
            computed += tokens;
            secs += 4.0 * 0.010 + tokens as f64 / 16_000.0;
            let snap = EngineSnapshot {
                prefix_queries: Some(computed),
                prefix_hits: Some(0),
                prefills: Some(n),
                prefill_seconds: Some(secs),
                ..Default::default()
            };
            pod.observe(snap, t(k * 1_000), &c);
        }
        let rate = pod.prefill_tps.get();
        let overhead = pod.overhead_ms.get();
        assert!((rate - 16_000.0).abs() < 320.0, "{rate}");
        assert!((overhead - 10.0).abs() < 1.0, "{overhead}");
    }

    #[test]
    fn routed_totals_against_engine_counters_teach_bytes_per_token_and_trust() {
        let c = cfg(); // 1,568-token blocks: a sample needs 4 × 1,568 tokens
        let mut pod = PodModel::new(&c);
        // Completions came without first-token times or cached tokens (behind Envoy).
        pod.first_tokens = Reports::Missing;
        pod.cached_tokens = Reports::Missing;
        let snap = |queries, waiting| EngineSnapshot {
            waiting,
            prefix_queries: Some(queries),
            prefix_hits: Some(0),
            ..Default::default()
        };
        assert_eq!(pod.observe(snap(0, 0), t(0), &c), None); // the first window starts
        pod.routed.prompt_bytes += 56_000.0;
        // The index promised 6,272 of those tokens; the engine had none of them.
        pod.routed.indexed_tokens += 6_272.0;
        pod.routed.unindexed_tokens += 3_728.0;
        // Routed but still queued on the engine: no sample, the window stays open.
        assert_eq!(pod.observe(snap(5_000, 2), t(1), &c), None);
        // Scheduled: 56,000 bytes for 10,000 tokens.
        assert_eq!(pod.observe(snap(10_000, 0), t(2), &c), Some(5.6));
        assert!(
            (pod.trust.get() - 0.8).abs() < 1e-9,
            "one window moves trust by the rate"
        );
        assert_eq!(pod.extra.get(), 0.0);
        // Too few tokens since: no sample yet.
        pod.routed.prompt_bytes += 4_000.0;
        assert_eq!(pod.observe(snap(11_000, 0), t(3), &c), None);
        // A restart starts a new window.
        assert_eq!(pod.observe(snap(100, 0), t(4), &c), None);
    }

    #[test]
    fn snapshots_raise_capacity_but_never_lower_it() {
        let c = TtftConfig {
            max_seqs: 4,
            ..cfg()
        };
        let mut pod = PodModel::new(&c);
        pod.observe(
            EngineSnapshot {
                running: 1,
                waiting: 3,
                ..Default::default()
            },
            t(0),
            &c,
        );
        assert_eq!(pod.capacity(), 4);
        pod.observe(
            EngineSnapshot {
                running: 12,
                waiting: 0,
                ..Default::default()
            },
            t(1),
            &c,
        );
        assert_eq!(pod.capacity(), 12);
    }

    #[test]
    fn learning_recovers_from_a_wrong_prior_and_resists_outliers() {
        let c = TtftConfig {
            prefill_tokens_per_s: 1_500.0,
            overhead_ms: 0.0,
            ..cfg()
        };
        let (mut pod, mut g) = (PodModel::new(&c), GlobalModel::new(&c));
        let ctx = TicketContext {
            prompt_bytes: 28_000.0,
            queue_ms: 0.0,
            uncached_tokens: 3_000.0,
            indexed_tokens: 0.0,
        };
        let timings = |first| crate::tickets::Timings {
            first_token_ms: Some(first),
            ..Default::default()
        };
        for _ in 0..30 {
            learn(&mut pod, &mut g, &c, &ctx, &timings(1_000)); // truth: 3,000 tokens/s
        }
        assert!(
            (pod.prefill_tps.get() - 3_000.0).abs() < 30.0,
            "{}",
            pod.prefill_tps.get()
        );
        learn(&mut pod, &mut g, &c, &ctx, &timings(1)); // absurd outlier
        assert!(
            pod.prefill_tps.get() < 3_000.0 * 1.5,
            "one outlier moved the estimate to {}",
            pod.prefill_tps.get()
        );
        let waited = TicketContext {
            queue_ms: 500.0,
            ..ctx
        };
        let before = pod.prefill_tps.get();
        learn(&mut pod, &mut g, &c, &waited, &timings(5_000));
        assert_eq!(
            pod.prefill_tps.get(),
            before,
            "queued requests say nothing about prefill speed"
        );
    }
}
