//! The time-to-first-token model behind `least-ttft`.
//!
//! For a request of `P` prompt tokens on pod `p`:
//!
//! ```text
//! cached   = ⌊min(matched_blocks × block_size / bytes_per_token, P) / engine_block⌋ × engine_block
//! uncached = P − cached
//! slot_at  = now                              if fewer than max_seqs requests are open on p
//!          = the (n − max_seqs + 1)-th earliest predicted end of p's n open requests, otherwise
//! start    = max(slot_at, prefill_busy_until_p)        (prefill is FCFS behind earlier prefills)
//! ttft     = (start − now) + overhead_p + uncached / prefill_rate_p
//! end      = now + ttft + (expected_output − 1) × tpot_p
//! ```
//!
//! - `matched_blocks` is the prefix index's contiguous match for `p`; only whole engine blocks
//!   count, because an engine can only reuse whole KV blocks.
//! - Every routed request (whatever strategy routed it) records its predicted `end` on its pod,
//!   so slot waits see all traffic; a request past its predicted end counts as ending now.
//! - A fresh engine snapshot (see [`EngineSnapshot`]) adds the engine's requests the router did
//!   not route itself (other router replicas) as open requests ending half a service time away.
//! - `prefill_rate_p`, `overhead_p` and `tpot_p` start at configured priors and are learned per
//!   pod from successful completions; `bytes_per_token` and `expected_output` are learned across
//!   pods. Learning is a bounded EWMA: each sample is first clamped to within a factor
//!   `max_sample_ratio` of the current estimate, so one outlier moves an estimate by at most
//!   `learning_rate × (max_sample_ratio − 1)` of itself, and failed or cancelled requests are
//!   never learned from.
//! - Prefill rate samples come only from requests predicted to start at once (no slot wait, no
//!   prefill backlog) with at least one engine block to prefill; overhead samples from those
//!   with less than one block to prefill.

use crate::ids::Ticket;
use crate::time::Timestamp;

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
    /// lower load, then the seeded PRNG. Default 1.
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
            tie_ms: 1.0,
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
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct ObservedEngine {
    pub(crate) snapshot: EngineSnapshot,
    pub(crate) at: Timestamp,
    // requests routed to the pod since the snapshot was taken
    pub(crate) routed_since: u32,
}

/// The learned state of one pod.
#[derive(Clone, Debug)]
pub(crate) struct PodModel {
    pub(crate) max_seqs: u32,
    pub(crate) prefill_tps: Ewma,
    pub(crate) tpot_ms: Ewma,
    pub(crate) overhead_ms: Ewma,
    // invariant: one entry per open ticket routed to this pod.
    pub(crate) ends: Vec<(Ticket, Timestamp)>,
    pub(crate) prefill_busy_until: Timestamp,
    pub(crate) engine: Option<ObservedEngine>,
    pub(crate) predicted_hit_tokens: u64,
}

impl PodModel {
    pub(crate) fn new(cfg: &TtftConfig) -> Self {
        PodModel {
            max_seqs: cfg.max_seqs,
            prefill_tps: Ewma::new(cfg.prefill_tokens_per_s),
            tpot_ms: Ewma::new(cfg.tpot_ms),
            overhead_ms: Ewma::new(cfg.overhead_ms),
            ends: Vec::new(),
            prefill_busy_until: Timestamp::ZERO,
            engine: None,
            predicted_hit_tokens: 0,
        }
    }

    pub(crate) fn forget_ticket(&mut self, ticket: Ticket) {
        if let Some(i) = self.ends.iter().position(|(t, _)| *t == ticket) {
            self.ends.swap_remove(i);
        }
    }
}

/// Learned quantities shared by all pods.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GlobalModel {
    pub(crate) bytes_per_token: Ewma,
    pub(crate) output_tokens: Ewma,
}

impl GlobalModel {
    pub(crate) fn new(cfg: &TtftConfig) -> Self {
        GlobalModel {
            bytes_per_token: Ewma::new(cfg.bytes_per_token),
            output_tokens: Ewma::new(cfg.output_tokens),
        }
    }
}

/// One pod's predicted TTFT for one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Estimate {
    pub(crate) ttft_ms: f64,
    /// Time before this request's prefill can start (slot wait and prefill backlog), ms.
    pub(crate) queue_ms: f64,
    pub(crate) cached_tokens: f64,
    pub(crate) uncached_tokens: f64,
    pub(crate) end: Timestamp,
}

/// What a request looks like to the model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Job {
    pub(crate) prompt_tokens: f64,
    pub(crate) matched_bytes: f64,
}

/// Predicts the TTFT of `job` on the pod. `scratch` is reused space for the open requests'
/// end times.
pub(crate) fn estimate(
    pod: &PodModel,
    global: &GlobalModel,
    cfg: &TtftConfig,
    job: Job,
    now: Timestamp,
    scratch: &mut Vec<u64>,
) -> Estimate {
    let block = f64::from(cfg.engine_block_tokens);
    let matched_tokens = (job.matched_bytes / global.bytes_per_token.get()).min(job.prompt_tokens);
    let cached = (matched_tokens / block).floor() * block;
    let uncached = (job.prompt_tokens - cached).max(0.0);
    let service_ms = (global.output_tokens.get() - 1.0).max(0.0) * pod.tpot_ms.get();

    scratch.clear();
    scratch.extend(
        pod.ends
            .iter()
            .map(|(_, end)| end.as_millis().max(now.as_millis())),
    );
    if let Some(engine) = pod
        .engine
        .filter(|e| now.millis_since(e.at) <= cfg.snapshot_max_age_ms)
    {
        let engine_load = (engine.snapshot.running + engine.snapshot.waiting)
            .saturating_add(engine.routed_since) as usize;
        let unseen = engine_load.saturating_sub(scratch.len());
        let half_service = now.as_millis() + (service_ms / 2.0) as u64;
        scratch.extend(std::iter::repeat_n(half_service, unseen));
    }
    let slots = pod.max_seqs as usize;
    let slot_at = if scratch.len() < slots {
        now.as_millis()
    } else {
        let k = scratch.len() - slots;
        *scratch.select_nth_unstable(k).1
    };
    let start = slot_at.max(pod.prefill_busy_until.as_millis());
    let queue_ms = start.saturating_sub(now.as_millis()) as f64;
    let prefill_ms = uncached / pod.prefill_tps.get() * 1_000.0;
    let ttft_ms = queue_ms + pod.overhead_ms.get() + prefill_ms;
    Estimate {
        ttft_ms,
        queue_ms,
        cached_tokens: cached,
        uncached_tokens: uncached,
        end: now.add_millis((ttft_ms + service_ms).round() as u64),
    }
}

/// Commits a routed request's estimate to its pod: its slot end and the prefill backlog.
pub(crate) fn commit(pod: &mut PodModel, ticket: Ticket, est: &Estimate, now: Timestamp) {
    pod.ends.push((ticket, est.end));
    let prefill_end = now.add_millis((est.ttft_ms - pod.overhead_ms.get()).max(0.0).round() as u64);
    pod.prefill_busy_until = pod.prefill_busy_until.max(prefill_end);
    pod.predicted_hit_tokens += est.cached_tokens as u64;
    if let Some(engine) = pod.engine.as_mut() {
        engine.routed_since = engine.routed_since.saturating_add(1);
    }
}

/// What the router remembers about a routed request, for learning at completion.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct TicketContext {
    pub(crate) prompt_bytes: f64,
    pub(crate) queue_ms: f64,
    pub(crate) uncached_tokens: f64,
    pub(crate) cached_tokens: f64,
}

/// Learns from one successful completion (see the module docs for which samples count).
pub(crate) fn learn(
    pod: &mut PodModel,
    global: &mut GlobalModel,
    cfg: &TtftConfig,
    ctx: &TicketContext,
    timings: &crate::tickets::Timings,
) {
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
        let c = cfg();
        let (mut pod, g) = (PodModel::new(&c), GlobalModel::new(&c));
        pod.ends = vec![(Ticket(1), t(9_000)), (Ticket(2), t(4_000))];
        let job = Job {
            prompt_tokens: 3_000.0,
            matched_bytes: 0.0,
        };
        let e = estimate(&pod, &g, &c, job, t(1_000), &mut Vec::new());
        assert_eq!(
            e.queue_ms, 3_000.0,
            "the earlier of the two ends frees the slot"
        );
        pod.ends.push((Ticket(3), t(5_000)));
        let e = estimate(&pod, &g, &c, job, t(1_000), &mut Vec::new());
        assert_eq!(
            e.queue_ms, 4_000.0,
            "third open request: second-earliest end"
        );
        pod.ends.clear();
        pod.prefill_busy_until = t(1_500);
        let e = estimate(&pod, &g, &c, job, t(1_000), &mut Vec::new());
        assert_eq!(e.queue_ms, 500.0, "prefill waits behind earlier prefills");
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
            routed_since: 0,
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
            cached_tokens: 0.0,
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
