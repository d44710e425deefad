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
//! end      = now + ttft + (min(expected_output, max_output_tokens) − 1) × tpot_p
//! ```
//!
//! - `matched_blocks` is the prefix index's contiguous match for `p`; only whole engine blocks
//!   count, because an engine can only reuse whole KV blocks.
//! - `max_output_tokens` is the request's own limit (`max_completion_tokens` or `max_tokens`,
//!   [`crate::RouteRequest::max_output_tokens`]) when it sets one: a decode cannot run longer,
//!   so a learned or configured `expected_output` above it is cut to it for that request (and
//!   its overrun tail below is a share of that shorter decode). A limit above the expected
//!   output changes nothing: limits are often generous.
//! - Every routed request (whatever strategy routed it) records its predicted prefill end and
//!   `end` on its pod until it completes, so slot and prefill waits see all traffic and vanish
//!   with it. Once its first token is reported ([`crate::Router::first_token`]) its prefill is
//!   known to be over and its `end` counts from the first token. A request past its predicted
//!   end is assumed to need 40% of its predicted decode more, or as long again as it has already
//!   overrun, whichever is longer (a request running long is likely to run longer still; this
//!   also corrects decodes predicted far too short before the first completion has taught
//!   anything).
//! - A conversation's previous answer is cached on the pod that generated it (vLLM caches
//!   generated tokens' blocks), but the index saw only the previous prompt. When a request's
//!   session id ([`crate::RouteRequest::session_id`]) names a candidate, that pod's match is
//!   extended by the learned mean output length (`expected_output`) before whole engine blocks
//!   are counted: `matched_blocks × block_size / bytes_per_token + expected_output`, at most
//!   `P`. The answers of `least-ttft` carry the chosen pod's session id so that clients can
//!   send it back. An engine view (KV events) sees answers itself and gets no such credit.
//! - The index is not the engine's cache. Completions (or first tokens) that report
//!   `cached_tokens` teach two per-pod fractions: `trust_p`, the share of index-predicted
//!   tokens the engine really reused (prior 1; below 1 when the engine evicts), and `extra_p`,
//!   the share of the rest it reused anyway (above 0 when the engine holds prefixes the index
//!   never saw: warm engines, other routers). The first sample replaces the prior and the
//!   `n`-th weighs `max(1/n, learning_rate)`. Until a pod's first sample, its `extra_p` is
//!   taken as 0.5 (as likely warm as not), raised to the mean `unrouted_q` of the competing
//!   pods that have one (`extra` learned only from prompts of which nothing was indexed on
//!   `q`: its engine was warmed outside the router, so an untried pod's likely was too; see
//!   [`probe_extra`]), for one probe at a time: the first request with at
//!   least a block the index does not place there that is routed to it; until that probe
//!   is answered (its cached tokens at its first token or with its completion, or the first
//!   engine-counter window, below, that holds its prefill, whichever comes first) or ends,
//!   other requests see `extra_p`'s prior 0. (Behind Envoy a timed response's usage comes only
//!   with its last chunk, a whole decode after its prefill; meanwhile the pod is priced cold.
//!   In the simulator's warm-engines-behind-a-skewed-index workload with envoy feedback,
//!   answering from the next scrape instead kept 5.4 ± 2.1 points more requests within the
//!   SLO over 24 seeds, and changed no other workload beyond its noise.) (Assumed 0, a warm
//!   pod behind an index that never saw it would never be tried, so never learned; where a
//!   pod is really cold the probe costs one prefill predicted too short.) Pods whose
//!   completions come without cached tokens (behind Envoy) are not probed: no single request
//!   could answer, and engine counters teach `extra_p` there.
//! - `extra_p` prices only the part of the prompt that another candidate was sent (up to the
//!   longest index match on any candidate, or the previous answer on a session's pod). The
//!   part no candidate was sent is priced on every pod at the mean `unrouted_q` of the
//!   candidates that have one (pods that may be probed keep the probe's price): how the fleet
//!   was warmed outside the router is shared by its engines, and a pod's own answers say
//!   little about a prefix no pod was sent. With each pod's own, the first pod to answer warm
//!   was priced warm for every new prefix, took them all until its queue outweighed a cold
//!   prefill, and the index then kept each prefix where it was first sent (see
//!   [`unrouted_extra`]).
//! - Exploration (`explore_wait_ms`, default 500 ms): when the pod `least-ttft` would pick
//!   makes the request wait at least that long (for a slot or the prefill queue) and a pod
//!   that may be probed would start it at once, the request goes there as its probe, whatever
//!   the model prices it at. The price is in learned units that may still be priors: behind
//!   Envoy, warm and hotspot phases bring no cold prefill to teach the prefill rate, and with
//!   a prior 2× too slow the probe was priced out for half a phase while the pod held every
//!   prefix. It costs at most one prefill per pod until the pod has answered.
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
//!   At most `MAX_UNSEEN` (4,096) are counted. A fresh snapshot whose free KV cache
//!   (`(1 − kv_usage) × kv_cache_tokens`) is smaller than the request's uncached prompt, in
//!   whole engine blocks, also caps `capacity_p` at the sequences it shows running (vLLM
//!   admits a request only when its blocks fit): requests routed since wait, one after
//!   another, for those to end; one that ended since frees its slot. An engine that does not
//!   report its KV cache's size is never taken as full.
//! - `prefill_rate_p`, `overhead_p` and `tpot_p` start at configured priors and are learned per
//!   pod from successful completions (the prompt-side samples, prefill rate or overhead, from
//!   the first token when the shell reports it, a whole decode earlier); `bytes_per_token` and
//!   `expected_output` are learned across pods. Learning is a bounded EWMA: each sample is
//!   first clamped to within a factor `max_sample_ratio` of the current estimate, so one
//!   outlier moves an estimate by at most `learning_rate × (max_sample_ratio − 1)` of itself,
//!   and failed or cancelled requests are never learned from. One exception: a prefill-rate
//!   sample from a reported first token, the `n`-th of the pod's prefill-rate samples, weighs
//!   `max(1/n, learning_rate)`, so the first replaces the prior (within the clamp). That prior
//!   is the one most likely to be far off (it is the GPU's speed: a 5× faster engine makes the
//!   default 5× too slow, as in the Envoy test), few cold prefills may come to correct it, and
//!   a first-token sample measures it directly. Bytes per token from an engine window (below)
//!   starts the same way: it is one exact ratio over whole prompts, and until it is learned
//!   every token count is off by as much as the prior. The same start on TPOT, overhead,
//!   per-request bytes per token, or on the prefill rate from engine windows made the
//!   simulated study worse (those early samples are noisier or biased: decodes stalled by
//!   prefills, prompts of different lengths, misaligned counters).
//! - Measured (first-token) prefill-rate samples also teach a fleet-wide rate, and a pod with
//!   fewer than `OWN_PREFILL_SAMPLES` (3) measured samples of its own predicts with the fleet's
//!   rate when the fleet has measured more: the pod a hot family would spill to rarely sees a
//!   cold prefill, yet the same engine on the next pod has shown how fast one is.
//! - Prefill rate samples come only from requests predicted to start at once (no slot wait, no
//!   prefill backlog) with at least one engine block to prefill; overhead samples from those
//!   with less than one block to prefill.
//! - Engine snapshots that carry vLLM's cumulative timing counters (where the router sees no
//!   first token, as behind Envoy) are a second source for the same per-pod rates: one
//!   prefill-rate sample per at least 4 prefills (prompt tokens computed, i.e. prefix-cache
//!   queries − hits, per second of `request_prefill_time`) and one TPOT sample per window with
//!   an output-token gap (`time_per_output_token`). The prefill windows are fitted
//!   together to `prefill seconds = prefills × overhead + tokens / rate` (least squares, each
//!   older window weighing `1 − learning_rate` times what it weighed, as in every EWMA here), which
//!   also teaches the overhead; until they separate the two, a window's plain ratio is the rate
//!   sample. Prefills that overlap on the engine each count their whole duration, so under
//!   overlap the rate comes out low (the model then leans towards cached pods).
//! - Between snapshots that show no waiting request, what was routed to a pod is compared with
//!   what its engine scheduled: prompt bytes per scheduled token (`prefix_cache_queries`) for
//!   the router-wide bytes per token, and the engine's `prefix_cache_hits` against the indexed
//!   and other tokens routed for `trust` and `extra` (the per-request rule below, applied to
//!   the window's sums). The routed token counts were converted from bytes at the bytes per
//!   token of their time, so they are first rescaled to the engine's count of the window's
//!   tokens: with the prior still off, the index's promise would otherwise read as tokens the
//!   engine lost (`trust` 0.75 for a warm pod, in the simulator behind Envoy). The windows
//!   need at least `MIN_ENGINE_PREFILLS` (4) engine blocks of prompt tokens, one while a probe
//!   waits for its answer (the window then answers it). They
//!   skip any snapshot that shows more requests on the engine than this router has open there
//!   (another sender's prompts, which the router never saw, would count as its own).
//! - Engine counters teach a quantity only where completions do not: a pod's prefill rate and
//!   overhead once its completions have come without first-token times (behind Envoy, where
//!   few responses are timed), its TPOT once they have come without a first-token time or
//!   output tokens, its `trust` and `extra` once they have come without cached tokens (and a
//!   probe's answer, whichever source gives it first), and the bytes
//!   per token once completions have come without prompt tokens. Until the first completion,
//!   and for good once one carries the signal, the per-request samples are the source
//!   (window sums are biased where requests overlap; per-request samples are chosen where
//!   they do not).

mod calibration;
mod config;
mod engine;
mod estimate;
mod learn;
mod learned;

pub use calibration::{TtftCalibration, TtftErrors};
pub use config::{TtftConfig, TtftSettingError};
pub use engine::EngineSnapshot;
pub(crate) use engine::{EngineRateBase, ObservedEngine, RoutedTotals};
pub(crate) use estimate::{commit, estimate, predicted_end, Estimate, Job};
pub(crate) use estimate::{probe_extra, unrouted_extra};
pub(crate) use learn::{learn, learn_first_token, TicketContext};
pub(crate) use learned::{Ewma, Fraction};

use crate::ids::Ticket;
use crate::time::Timestamp;

/// Measured prefill-rate samples after which a pod predicts with its own rate rather than the
/// fleet's (see the module docs).
pub(crate) const OWN_PREFILL_SAMPLES: u32 = 3;

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
    /// Its output-token limit, if it set one (its decode is predicted at most that long).
    pub(crate) max_output_tokens: Option<u32>,
}

impl OpenRequest {
    pub(crate) fn new(
        ticket: Ticket,
        issued: Timestamp,
        uncached_tokens: f64,
        max_output_tokens: Option<u32>,
    ) -> Self {
        OpenRequest {
            ticket,
            issued,
            uncached_tokens,
            first_token: None,
            max_output_tokens,
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
    /// `extra` learned from prompts of which nothing was indexed on the pod only: the share
    /// the engine reused although the router had sent it none of the prompt (warm engines
    /// behind a restarted router, other routers), the fleet's evidence for pods not yet
    /// probed ([`probe_extra`]).
    pub(crate) unrouted: Fraction,
    /// The open request sent to find out whether the pod holds what the index does not know
    /// (routed while `extra` had no sample, with at least a block unindexed); until it reports,
    /// other requests do not count on the assumption that the pod holds half of it.
    pub(crate) probe: Option<Ticket>,
    // invariant: one entry per open ticket routed to this pod, in issue order.
    pub(crate) open: Vec<OpenRequest>,
    pub(crate) engine: Option<ObservedEngine>,
    pub(crate) engine_rates: EngineRateBase,
    pub(crate) predicted_hit_tokens: u64,
    /// What was routed to the pod, cumulative (the engine counters unused here).
    pub(crate) routed: RoutedTotals,
    /// Whether its completions report first-token times (engine counters teach its prefill
    /// rate and overhead only when they do not).
    pub(crate) first_tokens: Reports,
    /// Whether its completions report a first-token time and output tokens, what a TPOT sample
    /// needs (engine counters teach its TPOT only when they do not: behind Envoy a timed
    /// response carries output tokens only when the client asked for usage).
    pub(crate) decode_timings: Reports,
    /// Whether its completions report prompt and cached tokens (engine counters teach its
    /// `trust` and `extra` only when they do not).
    pub(crate) cached_tokens: Reports,
    /// Predicted against reported TTFTs (carried over when the pod is removed and added again).
    pub(crate) calibration: TtftCalibration,
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
            unrouted: Fraction::new(0.0),
            probe: None,
            open: Vec::new(),
            engine: None,
            engine_rates: EngineRateBase::default(),
            predicted_hit_tokens: 0,
            routed: RoutedTotals::default(),
            first_tokens: Reports::Unknown,
            decode_timings: Reports::Unknown,
            cached_tokens: Reports::Unknown,
            calibration: TtftCalibration::default(),
        }
    }

    /// Takes the new priors of the rates nothing has been learned for yet.
    pub(crate) fn set_priors(&mut self, cfg: &TtftConfig) {
        self.prefill_tps.set_prior(cfg.prefill_tokens_per_s);
        self.tpot_ms.set_prior(cfg.tpot_ms);
        self.overhead_ms.set_prior(cfg.overhead_ms);
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
            let reused = (hit - indexed).max(0.0) / other;
            self.extra.learn(reused, cfg);
            if indexed < block {
                self.unrouted.learn(reused, cfg);
            }
        }
    }

    /// Records that the ticket's first token came at `at` (its prefill is over). A probe's
    /// first token ends the probe only when `answered` (it carried cached tokens): without
    /// them the answer comes with the completion, and until then no second probe goes out.
    pub(crate) fn first_token(&mut self, ticket: Ticket, at: Timestamp, answered: bool) {
        if answered {
            self.end_probe(ticket);
        }
        if let Some(o) = self.open.iter_mut().find(|o| o.ticket == ticket) {
            o.first_token.get_or_insert(at);
        }
    }

    /// The prefill rate to predict with: the pod's own once it has [`OWN_PREFILL_SAMPLES`]
    /// measured samples (or the fleet has no more than it), the fleet's before.
    pub(crate) fn prefill_rate(&self, global: &GlobalModel) -> f64 {
        let own = self.prefill_tps.measured();
        if own < OWN_PREFILL_SAMPLES && global.prefill_tps.measured() > own {
            global.prefill_tps.get()
        } else {
            self.prefill_tps.get()
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
    /// Every pod's measured prefill-rate samples (see [`PodModel::prefill_rate`]).
    pub(crate) prefill_tps: Ewma,
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
            prefill_tps: Ewma::new(cfg.prefill_tokens_per_s),
            output_tokens: Ewma::new(cfg.output_tokens),
            prompt_tokens: Reports::Unknown,
        }
    }

    /// Takes the new priors of the quantities nothing has been learned for yet.
    pub(crate) fn set_priors(&mut self, cfg: &TtftConfig) {
        self.bytes_per_token.set_prior(cfg.bytes_per_token);
        self.prefill_tps.set_prior(cfg.prefill_tokens_per_s);
        self.output_tokens.set_prior(cfg.output_tokens);
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;

    pub(crate) fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    pub(crate) fn cfg() -> TtftConfig {
        TtftConfig {
            engine_block_tokens: 1_568,
            max_seqs: 2,
            bytes_per_token: 5.6,
            ..Default::default()
        }
    }

    /// A pod known to hold nothing the index does not know of (`extra` sampled at 0).
    pub(crate) fn known_pod(c: &TtftConfig) -> PodModel {
        let mut pod = PodModel::new(c);
        pod.extra.learn(0.0, c);
        pod
    }

    /// A request of `prompt_tokens` whose first `matched_tokens` the router-side index holds on
    /// the pod: no session, no output limit, the probe's default guess, nothing sent elsewhere.
    pub(crate) fn job_of(prompt_tokens: f64, matched_tokens: f64) -> estimate::Job {
        estimate::Job {
            prompt_tokens,
            matched_tokens,
            exact: false,
            session_tokens: 0.0,
            max_output_tokens: None,
            probe_extra: estimate::UNSAMPLED_EXTRA,
            unrouted_extra: None,
            sent_tokens: 0.0,
        }
    }
}
