//! One pod's predicted TTFT for one request: the replay of its open requests through its
//! sequence slots and FCFS prefill (the model in the [`super`] docs), and the commit of a routed
//! request to its pod.

use super::{EngineSnapshot, GlobalModel, OpenRequest, PodModel, TtftConfig};
use crate::ids::Ticket;
use crate::time::Timestamp;

/// The share of a typical decode a request is still assumed to need once it has outlived its
/// predicted end (it is running long, so its remaining time is uncertain, not zero).
const OVERRUN_TAIL: f64 = 0.4;

/// The `extra` assumed for a pod no sample has spoken for yet, while no pod has shown an
/// engine warm with what the router never sent it (see [`probe_extra`] and the [`super`] docs).
pub(crate) const UNSAMPLED_EXTRA: f64 = 0.5;

/// The `extra` a pod that may be probed is priced at, given the fleet's mean `unrouted` over
/// the pods competing for the request ([`unrouted_extra`]): [`UNSAMPLED_EXTRA`], raised to
/// that mean. When the pods that answered reused prompts the router had never sent them, their
/// engines were warmed outside it (a restarted router, other routers), and an untried pod
/// likely was too; cold answers do not lower the guess below the probe's (an untried pod is
/// still worth trying).
pub(crate) fn probe_extra(fleet_unrouted: Option<f64>) -> f64 {
    fleet_unrouted.map_or(UNSAMPLED_EXTRA, |mean| mean.max(UNSAMPLED_EXTRA))
}

/// The `extra` every pod is priced at for the part of a prompt no candidate was sent: the mean
/// `unrouted` of the candidates that have one (`None` before any has). Whether an engine holds
/// prompts the router never sent it says how the fleet was warmed outside the router (a
/// restart, other routers), which all its engines share; one pod's answers say little about a
/// prefix no pod was sent. With each pod's own `extra`, the first pod to answer warm would be
/// priced warm for every new prefix, and the index would then fix each prefix where it was
/// first sent, whatever the load (sim/README.md, warm-split). The part another candidate was
/// sent keeps each pod's own `extra`.
pub(crate) fn unrouted_extra<'a>(pods: impl Iterator<Item = &'a PodModel>) -> Option<f64> {
    let (n, sum) = pods
        .filter(|p| p.unrouted.sampled())
        .fold((0u32, 0.0), |(n, sum), p| (n + 1, sum + p.unrouted.get()));
    (n > 0).then(|| sum / f64::from(n))
}

/// The most unseen requests (engine queue minus this router's own) one snapshot can add to an
/// estimate. The replay is linear in them; beyond a few thousand queued requests the pod is
/// hopeless anyway, and a corrupt snapshot (`waiting = 4e9`) must not cost seconds per route.
const MAX_UNSEEN: u32 = 4_096;

/// One pod's predicted TTFT for one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Estimate {
    pub(crate) ttft_ms: f64,
    /// What the prefill's stall of the pod's running decodes is charged, ms ([`super`] docs).
    pub(crate) stall_ms: f64,
    /// Time before this request's prefill can start (slot wait and prefill backlog), ms.
    pub(crate) queue_ms: f64,
    /// Tokens the engine is expected to reuse (index match corrected by what was learned).
    pub(crate) cached_tokens: f64,
    /// Tokens the index alone says are cached (whole engine blocks).
    pub(crate) indexed_tokens: f64,
    pub(crate) uncached_tokens: f64,
    /// Whether routing the request here makes it the pod's probe (the pod may be probed and a
    /// block or more of the prompt is not indexed there).
    pub(crate) probe: bool,
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
    /// The tokens of the prompt the index holds on the pod (its matched blocks in tokens).
    pub(crate) matched_tokens: f64,
    /// Whether the match is the engine's own record of its cache (an engine view), taken as
    /// the cached tokens; otherwise the router-side index's, corrected by `trust` and `extra`.
    pub(crate) exact: bool,
    /// Tokens after the index's match that the pod has computed for this request's
    /// conversation although the index cannot see them: the previous turn's answer, when the
    /// request's session id names this pod (0 otherwise, and ignored with an engine view,
    /// which sees answers). Counted as indexed.
    pub(crate) session_tokens: f64,
    /// The request's output-token limit, if it sets one.
    pub(crate) max_output_tokens: Option<u32>,
    /// The `extra` the pod is priced at if it may be probed ([`probe_extra`]).
    pub(crate) probe_extra: f64,
    /// The `extra` the part of the prompt no candidate was sent is priced at on every pod that
    /// may not be probed ([`unrouted_extra`]); `None`: the pod's own.
    pub(crate) unrouted_extra: Option<f64>,
    /// The most of the prompt any candidate was sent, tokens (its `matched_tokens` plus its
    /// `session_tokens`): beyond it, no pod was.
    pub(crate) sent_tokens: f64,
}

/// A decode's predicted length: the expected output tokens, at most the request's limit,
/// after the first, at `tpot` ms each.
fn decode_ms(global: &GlobalModel, tpot: f64, max_output_tokens: Option<u32>) -> f64 {
    let expected = global.output_tokens.get();
    let tokens = max_output_tokens.map_or(expected, |limit| expected.min(f64::from(limit)));
    (tokens - 1.0).max(0.0) * tpot
}

/// When an open request of the pod is predicted to end, issued at `issued` with `ctx`: its
/// predicted wait, its prefill at the pod's rate (or its reported first token), and a decode of
/// the expected length at the pod's TPOT. Used to release a request whose end the shell can no
/// longer observe ([`crate::Router::detach`]).
pub(crate) fn predicted_end(
    pod: &PodModel,
    global: &GlobalModel,
    ticket: crate::ids::Ticket,
    issued: Timestamp,
    ctx: &super::TicketContext,
) -> Timestamp {
    let open = pod.open.iter().find(|o| o.ticket == ticket);
    let first_token = match open.and_then(|o| o.first_token) {
        Some(at) => at.as_millis() as f64,
        None => {
            let prefill = ctx.uncached_tokens / pod.prefill_rate(global) * 1_000.0;
            issued.as_millis() as f64 + ctx.queue_ms + pod.overhead_ms.get() + prefill
        }
    };
    let limit = open.and_then(|o| o.max_output_tokens);
    let end = first_token + decode_ms(global, pod.tpot_ms.get(), limit);
    Timestamp::from_millis(if end.is_finite() && end > 0.0 {
        end.min(u64::MAX as f64 / 2.0) as u64
    } else {
        issued.as_millis()
    })
}

/// Whether the snapshot shows less free KV cache than `uncached` prompt tokens need, in whole
/// engine blocks of `block` tokens (at least one): vLLM schedules a prompt only when the
/// blocks it computes fit beside the running sequences' (its cached blocks are in the cache
/// already). False when the cache's size or usage is unknown.
fn kv_full(snapshot: &EngineSnapshot, uncached: f64, block: f64) -> bool {
    let (Some(usage), Some(size)) = (snapshot.kv_usage, snapshot.kv_cache_tokens) else {
        return false;
    };
    let free = (1.0 - usage) * size as f64;
    free < (uncached / block).ceil().max(1.0) * block
}

/// Predicts the TTFT of `job` on the pod by replaying the pod's open requests through its
/// sequence slots and FCFS prefill with the current learned rates (so a wrong earlier guess
/// does not stick): each open request takes the earliest free slot at or after its issue time,
/// prefills after the requests before it (or until its reported first token), then decodes; one
/// still open past that is assumed to need [`OVERRUN_TAIL`] of a decode more, or as long again
/// as it has overrun. A fresh engine snapshot adds the requests the router did not route,
/// as half-done; if it shows too little free KV cache for the request's uncached prompt
/// ([`kv_full`]), the pod has only as many slots as the snapshot shows running. The new
/// request then takes the next slot and prefills after all of them, stalling the requests
/// still decoding then. `scratch` is reused space for the slot heap.
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
    let session_tokens = if job.exact { 0.0 } else { job.session_tokens };
    let matched_tokens = (job.matched_tokens + session_tokens).min(job.prompt_tokens);
    let indexed = (matched_tokens / block).floor() * block;
    let reusable = (job.prompt_tokens / block).floor() * block;
    // What the index does not place here: up to what another candidate was sent at this pod's
    // own `extra`, the rest (sent to no pod) at the fleet's.
    let (extra, unsent_extra) = if pod.may_probe() {
        (job.probe_extra, job.probe_extra)
    } else {
        let own = pod.extra.get();
        (own, job.unrouted_extra.unwrap_or(own))
    };
    let sent = ((job.sent_tokens.min(job.prompt_tokens) / block).floor() * block).max(indexed);
    let expected = if job.exact {
        indexed
    } else {
        let unindexed = extra * (sent - indexed) + unsent_extra * (job.prompt_tokens - sent);
        (pod.trust.get() * indexed + unindexed).min(reusable)
    };
    let probe = !job.exact && pod.may_probe() && job.prompt_tokens - indexed >= block;
    let uncached = (job.prompt_tokens - expected).max(0.0);
    let tpot = pod.tpot_ms.get();
    // Requests the router did not route (from a snapshot): a typical decode.
    let typical_decode_ms = decode_ms(global, tpot, None);
    let rate = pod.prefill_rate(global);
    let prefill_ms = |tokens: f64| tokens / rate * 1_000.0;
    let now_ms = now.as_millis() as f64;

    let fresh = pod
        .engine
        .filter(|e| now.millis_since(e.at) <= cfg.snapshot_max_age_ms);
    let unseen = fresh.map_or(0, |engine| {
        engine
            .snapshot
            .running
            .saturating_add(engine.snapshot.waiting)
            .saturating_sub(engine.own_open)
            .min(MAX_UNSEEN)
    });
    // An engine whose KV cache cannot take the prompt runs no more sequences than it was
    // running: its slots are the ones those hold (freed as requests end), not its configured
    // capacity.
    let capacity = match fresh {
        Some(e) if kv_full(&e.snapshot, uncached, block) => {
            pod.capacity().min(e.snapshot.running.max(1))
        }
        _ => pod.capacity(),
    };

    let takes = pod.open.len() + unseen as usize + 1;
    let slots_free = (capacity as usize).min(takes);
    let to_us = |ms: f64| (ms * 1_000.0) as u64;
    let unseen_end_ms = now_ms + typical_decode_ms / 2.0;
    // One open request through the replay, given when a slot is free for it: when its prefill
    // ends (after the prefills before it, FCFS) and when it gives its slot back.
    let end_of = |o: &OpenRequest, slot_free_ms: f64, prefill_free: &mut f64| -> f64 {
        let start = slot_free_ms.max(o.issued.as_millis() as f64);
        let prefill_end = match o.first_token {
            Some(at) => at.as_millis() as f64,
            None => start.max(*prefill_free) + prefill_ms(o.uncached_tokens),
        };
        *prefill_free = prefill_free.max(prefill_end);
        let own_decode_ms = decode_ms(global, tpot, o.max_output_tokens);
        let predicted_end = prefill_end + own_decode_ms;
        // Still open after its predicted end, it has run long: assume it needs a further
        // OVERRUN_TAIL of its decode (or its overrun so far) rather than ending now.
        let tail_ms = OVERRUN_TAIL * own_decode_ms + tpot;
        let overrun = (now_ms - predicted_end).max(0.0);
        predicted_end.max(now_ms + tail_ms.max(overrun))
    };
    let mut prefill_free = 0.0f64;
    let (start, decoding) = if slots_free == takes {
        // A slot is free for every request and for this one: no slot wait to replay.
        scratch.clear();
        for o in &pod.open {
            scratch.push(to_us(end_of(o, 0.0, &mut prefill_free)));
        }
        let start = now_ms.max(prefill_free);
        let start_us = to_us(start);
        let unseen_decoding = if to_us(unseen_end_ms) > start_us {
            unseen as usize
        } else {
            0
        };
        let decoding = scratch.iter().filter(|&&end| end > start_us).count() + unseen_decoding;
        (start, decoding)
    } else {
        // Slot-free times, as a min-heap of whole microseconds. The replay takes a slot
        // `takes` times and every slot taken is given back later than now, so free slots
        // beyond that many are never reached: the heap holds at most that many (the same
        // result as `capacity` free slots, at a cost independent of the capacity).
        scratch.clear();
        scratch.resize(slots_free, 0);
        let mut slots: BinaryHeap<Reverse<u64>> =
            std::mem::take(scratch).into_iter().map(Reverse).collect();
        let take_slot = |slots: &mut BinaryHeap<Reverse<u64>>| {
            slots.pop().map_or(0.0, |Reverse(us)| us as f64 / 1_000.0)
        };
        for o in &pod.open {
            let end = end_of(o, take_slot(&mut slots), &mut prefill_free);
            slots.push(Reverse(to_us(end)));
        }
        for _ in 0..unseen {
            let end = take_slot(&mut slots).max(now_ms) + typical_decode_ms / 2.0;
            slots.push(Reverse(to_us(end)));
        }
        let start = take_slot(&mut slots).max(now_ms).max(prefill_free);
        let start_us = to_us(start);
        let decoding = slots.iter().filter(|Reverse(end)| *end > start_us).count();
        *scratch = slots.into_iter().map(|Reverse(us)| us).collect();
        (start, decoding)
    };
    let queue_ms = start - now_ms;
    let own_prefill_ms = prefill_ms(uncached);
    let ttft_ms = queue_ms + pod.overhead_ms.get() + own_prefill_ms;
    let stall_ms = cfg.stall_weight * own_prefill_ms * decoding as f64 / f64::from(capacity);
    Estimate {
        ttft_ms,
        stall_ms,
        queue_ms,
        cached_tokens: expected,
        indexed_tokens: indexed,
        uncached_tokens: uncached,
        probe,
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
    pod.open.push(OpenRequest::new(
        ticket,
        now,
        est.uncached_tokens,
        job.max_output_tokens,
    ));
    if est.probe {
        pod.probe = Some(ticket);
    }
    pod.predicted_hit_tokens += est.cached_tokens as u64;
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{cfg, job_of, known_pod, t};
    use super::super::*;
    use super::*;

    #[test]
    fn cached_tokens_count_whole_engine_blocks_only() {
        let c = cfg();
        let (pod, g) = (PodModel::new(&c), GlobalModel::new(&c));
        // 5,000-token prompt; the index matched 4,977 tokens' worth: 3 whole blocks = 4,704.
        let job = job_of(5_000.0, 4_977.0);
        let e = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(e.cached_tokens, 4_704.0);
        assert_eq!(e.uncached_tokens, 296.0);
        assert_eq!(e.queue_ms, 0.0);
        assert!((e.ttft_ms - (50.0 + 296.0 / 3.0)).abs() < 1e-9);
    }

    #[test]
    fn session_tokens_count_as_indexed_unless_the_match_is_exact() {
        let c = cfg();
        let (pod, g) = (PodModel::new(&c), GlobalModel::new(&c));
        // The index matched 3,000 of 5,000 tokens; the session adds a 300-token answer: 3,300
        // tokens, 2 whole blocks (3,136) instead of 1 (1,568).
        let job = Job {
            session_tokens: 300.0,
            ..job_of(5_000.0, 3_000.0)
        };
        let e = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(e.indexed_tokens, 3_136.0);
        let without = Job {
            session_tokens: 0.0,
            ..job
        };
        let e0 = estimate(&pod, &g, &c, without, t(0), &mut Vec::new());
        assert_eq!(e0.indexed_tokens, 1_568.0);
        assert!(e.cached_tokens > e0.cached_tokens && e.ttft_ms < e0.ttft_ms);
        // Never more than the prompt.
        let long = Job {
            session_tokens: 9_000.0,
            ..job
        };
        let e = estimate(&pod, &g, &c, long, t(0), &mut Vec::new());
        assert_eq!(e.indexed_tokens, 4_704.0);
        // An engine view sees answers itself: the credit is not added to it.
        let exact = Job { exact: true, ..job };
        let e = estimate(&pod, &g, &c, exact, t(0), &mut Vec::new());
        assert_eq!(e.indexed_tokens, 1_568.0);
        assert_eq!(e.cached_tokens, 1_568.0);
    }

    #[test]
    fn a_full_pod_waits_for_its_earliest_slot_and_prefill_is_fcfs() {
        // max_seqs 2, prefill 3,000 tokens/s, 127 decode tokens at 50 ms = 6,350 ms.
        let c = cfg();
        let (mut pod, g) = (known_pod(&c), GlobalModel::new(&c));
        let open = |n, issued, uncached| OpenRequest::new(Ticket(n), t(issued), uncached, None);
        // Two requests routed at 0: the first prefills 3,000 tokens (1 s), the second none.
        pod.open = vec![open(1, 0, 3_000.0), open(2, 0, 0.0)];
        let job = job_of(3_000.0, 0.0);
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
        pod.first_token(Ticket(4), t(3_000), false);
        let e = estimate(&pod, &g, &c, job, t(4_000), &mut Vec::new());
        assert_eq!(e.queue_ms, 5_350.0);
    }

    #[test]
    fn an_output_limit_shortens_a_predicted_decode_but_never_lengthens_it() {
        // One slot; the expected output is 128 tokens (127 after the first at 50 ms).
        let c = cfg();
        let (mut pod, g) = (known_pod(&c), GlobalModel::new(&c));
        pod.max_seqs = 1;
        let job = job_of(3_000.0, 0.0);
        let queue_behind = |pod: &mut PodModel, limit| {
            pod.open = vec![OpenRequest::new(Ticket(1), t(0), 0.0, limit)];
            estimate(pod, &g, &c, job, t(0), &mut Vec::new()).queue_ms
        };
        assert_eq!(queue_behind(&mut pod, None), 6_350.0);
        assert_eq!(
            queue_behind(&mut pod, Some(21)),
            1_000.0,
            "20 tokens after the first"
        );
        assert_eq!(
            queue_behind(&mut pod, Some(4_096)),
            6_350.0,
            "a limit is not a length"
        );
        // Past its shortened end it is assumed to need 40% of its own decode more (and a token).
        pod.open = vec![OpenRequest::new(Ticket(1), t(0), 0.0, Some(21))];
        let e = estimate(&pod, &g, &c, job, t(1_100), &mut Vec::new());
        assert_eq!(e.queue_ms, 450.0);
    }

    #[test]
    fn a_prefill_is_charged_for_the_decodes_it_stalls() {
        // max_seqs 2, prefill 3,000 tokens/s: a 3,000-token prefill lasts 1,000 ms.
        let c = cfg();
        let (mut pod, g) = (known_pod(&c), GlobalModel::new(&c));
        let job = job_of(3_000.0, 0.0);
        let idle = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(idle.stall_ms, 0.0, "nothing to stall on an idle pod");
        // One request decoding (routed at 0, no prefill left): half the slots are busy when the
        // new prefill starts, so it is charged stall_weight (2) × 1,000 ms × 1/2.
        pod.open = vec![OpenRequest::new(Ticket(1), t(0), 0.0, None)];
        let busy = estimate(&pod, &g, &c, job, t(100), &mut Vec::new());
        assert_eq!(busy.queue_ms, 0.0);
        assert_eq!(busy.stall_ms, 1_000.0);
        assert_eq!(busy.cost_ms(), busy.ttft_ms + 1_000.0);
        // A fully cached prompt stalls nothing, and a zero weight turns the charge off.
        let cached = job_of(3_136.0, 3_136.0);
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
        let job = job_of(100.0, 0.0);
        assert!(estimate(&pod, &g, &c, job, t(1_000), &mut Vec::new()).queue_ms > 0.0);
        assert_eq!(
            estimate(&pod, &g, &c, job, t(2_001), &mut Vec::new()).queue_ms,
            0.0
        );
    }

    #[test]
    fn a_full_kv_cache_leaves_no_free_slot_until_a_request_ends() {
        let c = cfg(); // max_seqs 2: one request open leaves a slot free
        let (mut pod, g) = (known_pod(&c), GlobalModel::new(&c));
        pod.open = vec![OpenRequest::new(Ticket(1), t(0), 0.0, None)];
        let job = job_of(100.0, 0.0);
        // A KV cache of 100,000 tokens: the prompt's one engine block (1,568 tokens) fits
        // while 1,568 are free.
        const KV: Option<u64> = Some(100_000);
        let queue_at = |pod: &mut PodModel, kv_usage, kv_cache_tokens| {
            let snapshot = EngineSnapshot {
                running: 1,
                kv_usage,
                kv_cache_tokens,
                ..Default::default()
            };
            pod.observe(snapshot, t(0), &c);
            estimate(pod, &g, &c, job, t(0), &mut Vec::new()).queue_ms
        };
        assert_eq!(queue_at(&mut pod, Some(0.5), KV), 0.0);
        assert_eq!(queue_at(&mut pod, None, KV), 0.0);
        assert_eq!(queue_at(&mut pod, Some(0.98), KV), 0.0, "2,000 tokens free");
        assert_eq!(
            queue_at(&mut pod, Some(1.0), None),
            0.0,
            "the cache's size unknown"
        );
        assert_eq!(
            queue_at(&mut pod, Some(0.99), KV),
            6_350.0,
            "1,000 tokens free: the open request's predicted end"
        );
        // A stale snapshot says nothing.
        assert_eq!(
            estimate(&pod, &g, &c, job, t(2_001), &mut Vec::new()).queue_ms,
            0.0
        );
        // Requests routed after the snapshot queue one after another for the one slot ...
        pod.open.push(OpenRequest::new(Ticket(2), t(0), 0.0, None));
        let e = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(e.queue_ms, 2.0 * 6_350.0, "behind 1, then behind 2");
        // ... and each that ends gives its slot to the next in line.
        pod.forget_ticket(Ticket(1));
        let e = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(e.queue_ms, 6_350.0, "behind 2 only");
        pod.forget_ticket(Ticket(2));
        assert_eq!(
            estimate(&pod, &g, &c, job, t(0), &mut Vec::new()).queue_ms,
            0.0
        );
        // The same for a request the engine shows and this router did not send (unseen,
        // assumed half done): its slot is the one to wait for.
        pod.open.clear();
        pod.observe(
            EngineSnapshot {
                running: 1,
                kv_usage: Some(1.0),
                kv_cache_tokens: KV,
                ..Default::default()
            },
            t(0),
            &c,
        );
        let e = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(e.queue_ms, 6_350.0 / 2.0);
        // Nothing running at all: full or not, the request starts at once.
        let idle = EngineSnapshot {
            kv_usage: Some(1.0),
            kv_cache_tokens: KV,
            ..Default::default()
        };
        pod.observe(idle, t(0), &c);
        assert_eq!(
            estimate(&pod, &g, &c, job, t(0), &mut Vec::new()).queue_ms,
            0.0
        );
    }

    #[test]
    fn snapshot_load_the_router_routed_is_not_counted_twice() {
        let c = cfg(); // max_seqs 2
        let (mut pod, g) = (PodModel::new(&c), GlobalModel::new(&c));
        let open = |n| OpenRequest::new(Ticket(n), t(0), 0.0, None);
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
        let job = job_of(100.0, 0.0);
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
    fn an_unknown_pod_is_probed_one_request_at_a_time() {
        let c = cfg();
        let (mut pod, g) = (PodModel::new(&c), GlobalModel::new(&c));
        let job = job_of(5_000.0, 0.0);
        let cached =
            |pod: &PodModel| estimate(pod, &g, &c, job, t(0), &mut Vec::new()).cached_tokens;
        assert_eq!(cached(&pod), 2_500.0, "nothing known: half assumed cached");
        // The first request routed there with a block or more unindexed is the probe; until it
        // answers, the next ones do not count on the pod being warm.
        let probe = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        commit(&mut pod, Ticket(1), &probe, &job, 28_000.0, t(0));
        assert_eq!(pod.probe, Some(Ticket(1)));
        assert_eq!(cached(&pod), 0.0);
        let second = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        commit(&mut pod, Ticket(2), &second, &job, 28_000.0, t(0));
        assert_eq!(pod.probe, Some(Ticket(1)), "one probe at a time");
        // A first token without cached tokens does not answer: the probe stays out.
        pod.first_token(Ticket(1), t(1_500), false);
        assert_eq!(pod.probe, Some(Ticket(1)));
        assert_eq!(cached(&pod), 0.0);
        // One with them ends it; without a reuse sample the pod is still unknown.
        pod.first_token(Ticket(1), t(1_500), true);
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
    fn engines_warm_with_what_the_router_never_sent_raise_the_probes_guess() {
        let c = cfg(); // engine blocks of 1,568 tokens
        let fresh = || PodModel::new(&c);
        assert_eq!(
            probe_extra(unrouted_extra([fresh(), fresh()].iter())),
            UNSAMPLED_EXTRA
        );
        // A answered a prompt none of which was indexed there from its cache: engines are
        // warmed outside the router, and an untried pod is priced as warm as A's answers.
        let mut warm = fresh();
        warm.learn_reuse(5_000.0, 0.0, 5_000.0, &c);
        assert_eq!(
            probe_extra(unrouted_extra([warm.clone(), fresh()].iter())),
            1.0
        );
        // A cold answer of the same kind averages in, but never below the probe's guess.
        let mut cold = fresh();
        cold.learn_reuse(0.0, 0.0, 5_000.0, &c);
        assert_eq!(
            probe_extra(unrouted_extra([warm.clone(), cold.clone()].iter())),
            0.5
        );
        assert_eq!(probe_extra(unrouted_extra([cold].iter())), UNSAMPLED_EXTRA);
        // Reuse beyond what the index placed on the pod (a conversation's answer) says
        // nothing about the other pods.
        let mut beyond = fresh();
        beyond.learn_reuse(4_000.0, 3_136.0, 2_000.0, &c);
        assert!(beyond.extra.sampled());
        assert_eq!(
            probe_extra(unrouted_extra([beyond].iter())),
            UNSAMPLED_EXTRA
        );
        // The untried pod's estimate uses the raised guess.
        let g = GlobalModel::new(&c);
        let job = Job {
            probe_extra: probe_extra(unrouted_extra([warm].iter())),
            ..job_of(6_272.0, 0.0) // 4 engine blocks
        };
        let e = estimate(&fresh(), &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(e.cached_tokens, 6_272.0);
    }

    #[test]
    fn what_no_pod_was_sent_is_priced_at_the_fleets_unrouted_share() {
        let c = cfg(); // engine blocks of 1,568 tokens
        let g = GlobalModel::new(&c);
        let mut warm = PodModel::new(&c);
        warm.learn_reuse(5_000.0, 0.0, 5_000.0, &c); // extra 1, unrouted 1
        let mut cold = PodModel::new(&c);
        cold.learn_reuse(0.0, 0.0, 5_000.0, &c); // extra 0, unrouted 0
        assert_eq!(unrouted_extra([PodModel::new(&c)].iter()), None);
        let fleet = unrouted_extra([warm.clone(), cold.clone()].iter());
        assert_eq!(fleet, Some(0.5));
        let job = |sent_tokens: f64, unrouted_extra: Option<f64>| Job {
            unrouted_extra,
            sent_tokens,
            ..job_of(6_272.0, 0.0) // 4 engine blocks
        };
        let cached = |pod: &PodModel, job: Job| {
            estimate(pod, &g, &c, job, t(0), &mut Vec::new()).cached_tokens
        };
        // Sent to no pod: both priced at the fleet's half, whatever their own answers.
        assert_eq!(cached(&warm, job(0.0, fleet)), 3_136.0);
        assert_eq!(cached(&cold, job(0.0, fleet)), 3_136.0);
        // Two blocks were sent to another pod: those at the pod's own `extra`, the rest at
        // the fleet's (a part of a block sent counts as none).
        assert_eq!(cached(&warm, job(3_200.0, fleet)), 3_136.0 + 1_568.0);
        assert_eq!(cached(&cold, job(3_200.0, fleet)), 1_568.0);
        // No fleet share yet: each pod's own.
        assert_eq!(cached(&warm, job(0.0, None)), 6_272.0);
        assert_eq!(cached(&cold, job(0.0, None)), 0.0);
    }
}
