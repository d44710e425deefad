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
//!   with it. Once its first token is reported ([`crate::Router::first_token`]) its prefill is
//!   known to be over and its `end` counts from the first token. A request past its predicted
//!   end is assumed to need 40% of a typical decode more, or as long again as it has already
//!   overrun, whichever is longer (a request running long is likely to run longer still; this
//!   also corrects decodes predicted far too short before the first completion has taught
//!   anything).
//! - The index is not the engine's cache. Completions (or first tokens) that report
//!   `cached_tokens` teach two per-pod fractions: `trust_p`, the share of index-predicted
//!   tokens the engine really reused (prior 1; below 1 when the engine evicts), and `extra_p`,
//!   the share of the rest it reused anyway (above 0 when the engine holds prefixes the index
//!   never saw: warm engines, other routers). The first sample replaces the prior and the
//!   `n`-th weighs `max(1/n, learning_rate)`. Until a pod's first sample, its `extra_p` is
//!   taken as 0.5 (as likely warm as not) for one probe at a time: the first request with at
//!   least a block the index does not place there that is routed to it; until that probe
//!   reports its first token or completes, other requests see `extra_p`'s prior 0. (Assumed
//!   0, a warm pod behind an index that never saw it would never be tried, so never learned;
//!   where a pod is really cold the probe costs one prefill predicted too short.) Pods whose
//!   completions come without cached tokens (behind Envoy) are not probed: no single request
//!   could answer, and engine counters teach `extra_p` there.
//! - `least-ttft` ranks pods by `ttft + stall`, not by `ttft` alone (the prediction it reports
//!   is `ttft`). `stall` prices what this request's prefill costs the requests already on `p`:
//!   while an engine prefills, its running decodes make no progress (a vLLM step that carries
//!   a prefill chunk lasts as long as the chunk), so each of the `decoding_p` requests still
//!   decoding when the prefill starts ends that much later, and so do the requests that will
//!   wait for their slots. `stall = stall_weight × (P − expected) / prefill_rate_p ×
//!   decoding_p / capacity_p`: nothing on an idle pod, up to `stall_weight` times the prefill
//!   on a full one. It keeps a request on the pod that holds its prefix unless another pod is
//!   faster by more than the damage a cold prefill does there; ranked by TTFT alone, a request
//!   that spills to save a few hundred ms costs the requests around it seconds of stalled
//!   decodes.
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
//!   pod from successful completions (the prompt-side samples, prefill rate or overhead, from
//!   the first token when the shell reports it, a whole decode earlier); `bytes_per_token` and
//!   `expected_output` are learned across pods. Learning is a bounded EWMA: each sample is
//!   first clamped to within a factor `max_sample_ratio` of the current estimate, so one
//!   outlier moves an estimate by at most `learning_rate × (max_sample_ratio − 1)` of itself,
//!   and failed or cancelled requests are never learned from.
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

mod engine;
mod learned;

pub use engine::EngineSnapshot;
pub(crate) use engine::{EngineRateBase, ObservedEngine, RoutedTotals};
pub(crate) use learned::{Ewma, Fraction};

use crate::ids::Ticket;
use crate::time::Timestamp;

/// The share of a typical decode a request is still assumed to need once it has outlived its
/// predicted end (it is running long, so its remaining time is uncertain, not zero).
const OVERRUN_TAIL: f64 = 0.4;

/// The `extra` assumed for a pod no sample has spoken for yet (see the module docs).
const UNSAMPLED_EXTRA: f64 = 0.5;

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
    /// Costs closer than this tie, ms; ties go to the pod expected to reuse the most engine
    /// blocks (the index's match corrected by `trust`/`extra`, rounded to whole blocks), then
    /// the lower load, then the seeded PRNG. Default 300: predictions on a loaded engine are
    /// good to a few hundred ms, and within that, keeping a prefix where it is cached pays
    /// later; where several engines hold it, the less loaded one is as good.
    pub tie_ms: f64,
    /// How many times its own length a prefill is charged when it stalls a full pod's
    /// decodes (see the module docs; 0 ranks by predicted TTFT alone). Default 2: the stall
    /// delays the pod's next free slot, and the request after that one's.
    pub stall_weight: f64,
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
            stall_weight: 2.0,
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
        if !(self.stall_weight.is_finite() && self.stall_weight >= 0.0) {
            return Some("ttft.stall_weight");
        }
        None
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
    /// When its first token was reported ([`crate::Router::first_token`]): its prefill is
    /// over, and the replay puts its prefill's end there instead of predicting it.
    pub(crate) first_token: Option<Timestamp>,
}

impl OpenRequest {
    pub(crate) fn new(ticket: Ticket, issued: Timestamp, uncached_tokens: f64) -> Self {
        OpenRequest {
            ticket,
            issued,
            uncached_tokens,
            first_token: None,
        }
    }
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
    /// The open request sent to find out whether the pod holds what the index does not know
    /// (routed while `extra` had no sample, with at least a block unindexed); until it reports,
    /// other requests do not count on [`UNSAMPLED_EXTRA`].
    pub(crate) probe: Option<Ticket>,
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
            probe: None,
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

    /// Learns `trust` (the share of the index's promised tokens the engine reused) and `extra`
    /// (the share of the other prompt tokens it reused anyway) from `hit` tokens served from
    /// cache out of `indexed` promised and `other` not promised, each only over at least one
    /// engine block. Hits count against the promised tokens first.
    pub(crate) fn learn_reuse(&mut self, hit: f64, indexed: f64, other: f64, cfg: &TtftConfig) {
        let block = f64::from(cfg.engine_block_tokens);
        if indexed >= block {
            self.trust.learn(hit.min(indexed) / indexed, cfg);
        }
        if other >= block {
            self.extra.learn((hit - indexed).max(0.0) / other, cfg);
        }
    }

    /// Records that the ticket's first token came at `at` (its prefill is over).
    pub(crate) fn first_token(&mut self, ticket: Ticket, at: Timestamp) {
        self.end_probe(ticket);
        if let Some(o) = self.open.iter_mut().find(|o| o.ticket == ticket) {
            o.first_token.get_or_insert(at);
        }
    }

    /// Whether a request may be sent to find out if the pod is warm: `extra` has no sample
    /// yet, no probe is out, and completions may carry the answer (cached tokens; shells that
    /// never report them learn `extra` from engine counters only).
    pub(crate) fn may_probe(&self) -> bool {
        !self.extra.sampled() && self.probe.is_none() && self.cached_tokens != Reports::Missing
    }

    fn end_probe(&mut self, ticket: Ticket) {
        if self.probe == Some(ticket) {
            self.probe = None;
        }
    }

    pub(crate) fn forget_ticket(&mut self, ticket: Ticket) {
        self.end_probe(ticket);
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
    /// What the prefill's stall of the pod's running decodes is charged, ms (module docs).
    pub(crate) stall_ms: f64,
    /// Time before this request's prefill can start (slot wait and prefill backlog), ms.
    pub(crate) queue_ms: f64,
    /// Tokens the engine is expected to reuse (index match corrected by what was learned).
    pub(crate) cached_tokens: f64,
    /// Tokens the index alone says are cached (whole engine blocks).
    pub(crate) indexed_tokens: f64,
    pub(crate) uncached_tokens: f64,
}

impl Estimate {
    /// What `least-ttft` minimises.
    pub(crate) fn cost_ms(&self) -> f64 {
        self.ttft_ms + self.stall_ms
    }
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
/// prefills after the requests before it (or until its reported first token), then decodes; one
/// still open past that is assumed to need [`OVERRUN_TAIL`] of a decode more, or as long again
/// as it has overrun. A fresh engine snapshot adds the requests the router did not route,
/// as half-done. The new request then takes the next slot and prefills after all of them,
/// stalling the requests still decoding then. `scratch` is reused space for the slot heap.
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
    let extra = if pod.may_probe() {
        UNSAMPLED_EXTRA
    } else {
        pod.extra.get()
    };
    let expected =
        (pod.trust.get() * indexed + extra * (job.prompt_tokens - indexed)).min(reusable);
    let uncached = (job.prompt_tokens - expected).max(0.0);
    let tpot = pod.tpot_ms.get();
    let decode_ms = (global.output_tokens.get() - 1.0).max(0.0) * tpot;
    let prefill_ms = |tokens: f64| tokens / pod.prefill_tps.get() * 1_000.0;
    let now_ms = now.as_millis() as f64;
    // A request still open after its predicted end has run long; assume it needs a further
    // OVERRUN_TAIL of a typical decode (or its overrun so far, below) rather than ending now.
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
        let prefill_end = match o.first_token {
            Some(at) => at.as_millis() as f64,
            None => start.max(prefill_free) + prefill_ms(o.uncached_tokens),
        };
        prefill_free = prefill_free.max(prefill_end);
        let predicted_end = prefill_end + decode_ms;
        let overrun = (now_ms - predicted_end).max(0.0);
        let end = predicted_end.max(now_ms + tail_ms.max(overrun));
        slots.push(Reverse((end * 1_000.0) as u64));
    }
    for _ in 0..unseen {
        let end = take_slot(&mut slots).max(now_ms) + decode_ms / 2.0;
        slots.push(Reverse((end * 1_000.0) as u64));
    }
    let start = take_slot(&mut slots).max(now_ms).max(prefill_free);
    let start_us = (start * 1_000.0) as u64;
    let decoding = slots.iter().filter(|Reverse(end)| *end > start_us).count();
    *scratch = slots.into_iter().map(|Reverse(us)| us).collect();
    let queue_ms = start - now_ms;
    let own_prefill_ms = prefill_ms(uncached);
    let ttft_ms = queue_ms + pod.overhead_ms.get() + own_prefill_ms;
    let stall_ms = cfg.stall_weight * own_prefill_ms * decoding as f64 / f64::from(pod.capacity());
    Estimate {
        ttft_ms,
        stall_ms,
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
    cfg: &TtftConfig,
) {
    let r = &mut pod.routed;
    r.prompt_bytes += prompt_bytes;
    r.indexed_tokens += est.indexed_tokens;
    r.unindexed_tokens += (job.prompt_tokens - est.indexed_tokens).max(0.0);
    pod.open
        .push(OpenRequest::new(ticket, now, est.uncached_tokens));
    let unindexed = job.prompt_tokens - est.indexed_tokens;
    if pod.may_probe() && unindexed >= f64::from(cfg.engine_block_tokens) {
        pod.probe = Some(ticket);
    }
    pod.predicted_hit_tokens += est.cached_tokens as u64;
}

/// What the router remembers about a routed request, for learning at completion.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct TicketContext {
    pub(crate) prompt_bytes: f64,
    pub(crate) queue_ms: f64,
    pub(crate) uncached_tokens: f64,
    pub(crate) indexed_tokens: f64,
    /// Whether [`learn_first_token`] has run for it (its completion then skips those samples).
    pub(crate) first_token_seen: bool,
}

/// Learns from one successful completion (see the module docs for which samples count). The
/// prompt-side samples (bytes per token, `trust`/`extra`, prefill rate or overhead) are
/// skipped when the request's first token already taught them ([`learn_first_token`]).
pub(crate) fn learn(
    pod: &mut PodModel,
    global: &mut GlobalModel,
    cfg: &TtftConfig,
    ctx: &TicketContext,
    timings: &crate::tickets::Timings,
) {
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
    if !ctx.first_token_seen {
        learn_first_token(pod, global, cfg, ctx, timings);
    }
}

/// Learns what a request's first token tells (see the module docs): whether completions carry
/// first-token times, prompt and cached tokens; bytes per token; `trust` and `extra`; and the
/// pod's prefill rate or overhead. Only `first_token_ms`, `prompt_tokens` and `cached_tokens`
/// of `timings` are read.
pub(crate) fn learn_first_token(
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
    if let (Some(prompt), Some(cached)) = (timings.prompt_tokens, timings.cached_tokens) {
        let (prompt, cached) = (f64::from(prompt), f64::from(cached));
        let indexed = ctx.indexed_tokens.min(prompt);
        pod.learn_reuse(cached, indexed, prompt - indexed, cfg);
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

    pub(super) fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    pub(super) fn cfg() -> TtftConfig {
        TtftConfig {
            engine_block_tokens: 1_568,
            max_seqs: 2,
            bytes_per_token: 5.6,
            ..Default::default()
        }
    }

    /// A pod known to hold nothing the index does not know of (`extra` sampled at 0).
    pub(super) fn known_pod(c: &TtftConfig) -> PodModel {
        let mut pod = PodModel::new(c);
        pod.extra.learn(0.0, c);
        pod
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
        let (mut pod, g) = (known_pod(&c), GlobalModel::new(&c));
        let open = |n, issued, uncached| OpenRequest::new(Ticket(n), t(issued), uncached);
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
        // A request still open past its predicted end (6,350) holds its slot for 40% of a
        // decode more (0.4 × 6,350 + one token of 50), or for as long again as it has
        // overrun, whichever is longer.
        pod.max_seqs = 1;
        pod.open = vec![open(4, 0, 0.0)];
        let e = estimate(&pod, &g, &c, job, t(7_000), &mut Vec::new());
        assert_eq!(e.queue_ms, 2_590.0);
        let e = estimate(&pod, &g, &c, job, t(20_000), &mut Vec::new());
        assert_eq!(e.queue_ms, 13_650.0);
        // Once its first token is reported, its prefill is over there and its decode is
        // predicted from then: routed at 0, first token at 3,000, decode ends at 9,350.
        pod.first_token(Ticket(4), t(3_000));
        let e = estimate(&pod, &g, &c, job, t(4_000), &mut Vec::new());
        assert_eq!(e.queue_ms, 5_350.0);
    }

    #[test]
    fn a_prefill_is_charged_for_the_decodes_it_stalls() {
        // max_seqs 2, prefill 3,000 tokens/s: a 3,000-token prefill lasts 1,000 ms.
        let c = cfg();
        let (mut pod, g) = (known_pod(&c), GlobalModel::new(&c));
        let job = Job {
            prompt_tokens: 3_000.0,
            matched_bytes: 0.0,
        };
        let idle = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(idle.stall_ms, 0.0, "nothing to stall on an idle pod");
        // One request decoding (routed at 0, no prefill left): half the slots are busy when the
        // new prefill starts, so it is charged stall_weight (2) × 1,000 ms × 1/2.
        pod.open = vec![OpenRequest::new(Ticket(1), t(0), 0.0)];
        let busy = estimate(&pod, &g, &c, job, t(100), &mut Vec::new());
        assert_eq!(busy.queue_ms, 0.0);
        assert_eq!(busy.stall_ms, 1_000.0);
        assert_eq!(busy.cost_ms(), busy.ttft_ms + 1_000.0);
        // A fully cached prompt stalls nothing, and a zero weight turns the charge off.
        let cached = Job {
            prompt_tokens: 3_136.0,
            matched_bytes: 3_136.0 * 5.6,
        };
        assert_eq!(
            estimate(&pod, &g, &c, cached, t(100), &mut Vec::new()).stall_ms,
            0.0
        );
        let off = TtftConfig {
            stall_weight: 0.0,
            ..cfg()
        };
        assert_eq!(
            estimate(&pod, &g, &off, job, t(100), &mut Vec::new()).stall_ms,
            0.0
        );
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
        let open = |n| OpenRequest::new(Ticket(n), t(0), 0.0);
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
        // Nothing is known of the pod yet: half of what the index does not know is assumed
        // cached (whole blocks aside), so that a warm pod gets tried.
        let unknown = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(unknown.cached_tokens, 2_500.0);
        let cold = estimate(&known_pod(&c), &g, &c, job, t(0), &mut Vec::new());
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
        assert_eq!(pod.trust.get(), 0.0, "the first sample replaces the prior");
        let kept = crate::tickets::Timings {
            cached_tokens: Some(4_704),
            ..evicted
        };
        learn(&mut pod, &mut g, &c, &ctx, &kept);
        assert!(
            (pod.trust.get() - 0.5).abs() < 1e-9,
            "the second weighs half"
        );
        for _ in 0..3 {
            learn(&mut pod, &mut g, &c, &ctx, &kept);
        }
        assert!(
            (pod.trust.get() - 0.8).abs() < 1e-9,
            "the fifth and later move it by the learning rate (1/5 = 0.2)"
        );
    }

    #[test]
    fn an_unknown_pod_is_probed_one_request_at_a_time() {
        let c = cfg();
        let (mut pod, g) = (PodModel::new(&c), GlobalModel::new(&c));
        let job = Job {
            prompt_tokens: 5_000.0,
            matched_bytes: 0.0,
        };
        let cached =
            |pod: &PodModel| estimate(pod, &g, &c, job, t(0), &mut Vec::new()).cached_tokens;
        assert_eq!(cached(&pod), 2_500.0, "nothing known: half assumed cached");
        // The first request routed there with a block or more unindexed is the probe; until it
        // answers, the next ones do not count on the pod being warm.
        let probe = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        commit(&mut pod, Ticket(1), &probe, &job, 28_000.0, t(0), &c);
        assert_eq!(pod.probe, Some(Ticket(1)));
        assert_eq!(cached(&pod), 0.0);
        let second = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        commit(&mut pod, Ticket(2), &second, &job, 28_000.0, t(0), &c);
        assert_eq!(pod.probe, Some(Ticket(1)), "one probe at a time");
        // Its first token ends the probe; without a reuse sample the pod is still unknown.
        pod.first_token(Ticket(1), t(1_500));
        assert_eq!(pod.probe, None);
        assert_eq!(cached(&pod), 2_500.0);
        // A sample settles it.
        let mut sampled = pod.clone();
        sampled.learn_reuse(0.0, 0.0, 5_000.0, &c);
        assert_eq!(cached(&sampled), 0.0);
        // Completions without cached tokens (behind Envoy) cannot answer: no probing.
        pod.cached_tokens = Reports::Missing;
        assert_eq!(cached(&pod), 0.0);
        assert!(!pod.may_probe());
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
            ..Default::default()
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
