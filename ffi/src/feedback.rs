//! What the router learns from: completion timings, engine metrics and pod capacity (the
//! inputs of the `least-ttft` strategy's time-to-first-token model), and pod health
//! (completion outcomes and active health checks).

use std::ptr;

use kvroute_core::{Completion, EngineSnapshot, PodId, Ticket, Timestamp, Timings};

use crate::handle;
use crate::router::{kvroute_pod_id, kvroute_router, kvroute_ticket};
use crate::status::{kvroute_health_event, kvroute_outcome, kvroute_status};

/// `kvroute_timings.known`: `first_token_ms` is set.
pub const KVROUTE_TIMING_FIRST_TOKEN_MS: u32 = 1 << 0;
/// `kvroute_timings.known`: `total_ms` is set.
pub const KVROUTE_TIMING_TOTAL_MS: u32 = 1 << 1;
/// `kvroute_timings.known`: `output_tokens` is set.
pub const KVROUTE_TIMING_OUTPUT_TOKENS: u32 = 1 << 2;
/// `kvroute_timings.known`: `cached_tokens` is set.
pub const KVROUTE_TIMING_CACHED_TOKENS: u32 = 1 << 3;
/// `kvroute_timings.known`: `prompt_tokens` is set.
pub const KVROUTE_TIMING_PROMPT_TOKENS: u32 = 1 << 4;
const TIMING_ALL: u32 = (1 << 5) - 1;

/// What the caller observed about a request, passed to `kvroute_router_complete_with_timings()`
/// when it finished, or to `kvroute_router_first_token()` when its first token came. Only the
/// fields whose `KVROUTE_TIMING_*` bit is set in `known` are read. The layout is frozen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvroute_timings {
    /// Time from routing to the first response byte (or first token), ms.
    pub first_token_ms: u64,
    /// Time from routing to the end of the response, ms.
    pub total_ms: u64,
    /// Tokens generated.
    pub output_tokens: u32,
    /// Prompt tokens the engine served from its prefix cache (`usage.prompt_tokens_details`).
    pub cached_tokens: u32,
    /// Prompt tokens as the engine counted them (`usage.prompt_tokens`).
    pub prompt_tokens: u32,
    /// Which fields are set: an OR of `KVROUTE_TIMING_*` bits.
    pub known: u32,
}

impl kvroute_timings {
    fn to_core(self) -> Result<Timings, kvroute_status> {
        if self.known & !TIMING_ALL != 0 {
            return Err(kvroute_status::InvalidParameter);
        }
        let has = |bit: u32| self.known & bit != 0;
        Ok(Timings {
            first_token_ms: has(KVROUTE_TIMING_FIRST_TOKEN_MS).then_some(self.first_token_ms),
            total_ms: has(KVROUTE_TIMING_TOTAL_MS).then_some(self.total_ms),
            output_tokens: has(KVROUTE_TIMING_OUTPUT_TOKENS).then_some(self.output_tokens),
            cached_tokens: has(KVROUTE_TIMING_CACHED_TOKENS).then_some(self.cached_tokens),
            prompt_tokens: has(KVROUTE_TIMING_PROMPT_TOKENS).then_some(self.prompt_tokens),
        })
    }

    /// [`Self::to_core`] for `kvroute_router_first_token()`, which also requires
    /// `first_token_ms` (the caller's own measurement; see that function).
    fn to_core_first_token(self) -> Result<Timings, kvroute_status> {
        let timings = self.to_core()?;
        if timings.first_token_ms.is_none() {
            return Err(kvroute_status::InvalidParameter);
        }
        Ok(timings)
    }
}

/// `kvroute_router_complete()` plus what was observed about the request: the timings of a
/// successful request teach the `least-ttft` model the pod's prefill and decode rates. `timings`
/// may be NULL (no timings, the same as `kvroute_router_complete()`); it is borrowed for the
/// call only. A `first_token_ms` or `total_ms` longer than the time since routing (on the
/// router's clock, `now_ms`) is taken as that time. Returns `KVROUTE_STATUS_INVALID_PARAMETER`
/// for unknown bits in `timings->known`, otherwise the statuses of `kvroute_router_complete()`.
#[no_mangle]
pub extern "C" fn kvroute_router_complete_with_timings(
    router: *mut kvroute_router,
    ticket: kvroute_ticket,
    outcome: u32,
    timings: *const kvroute_timings,
    now_ms: u64,
) -> kvroute_status {
    // The event call has its own panic boundary.
    kvroute_router_complete_with_event(router, ticket, outcome, timings, now_ms, ptr::null_mut())
}

/// `kvroute_router_complete_with_timings()` that also says what the outcome changed in the
/// pod's health: on success, when `event_out` is not NULL, `*event_out` is a
/// `kvroute_health_event` (`KVROUTE_HEALTH_EVENT_NONE` when nothing changed;
/// `_EJECTED` when this failure ejected the pod; `_EJECTION_SKIPPED` when it met an ejection
/// rule but the model could not spare it; `_READMITTED` when it was the pod's successful
/// probe). `timings` and `event_out` may each be NULL; nothing is written on error. A ticket
/// whose pod was removed meanwhile gives `KVROUTE_HEALTH_EVENT_NONE`. Statuses as
/// `kvroute_router_complete_with_timings()`.
#[no_mangle]
pub extern "C" fn kvroute_router_complete_with_event(
    router: *mut kvroute_router,
    ticket: kvroute_ticket,
    outcome: u32,
    timings: *const kvroute_timings,
    now_ms: u64,
    event_out: *mut u32,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let event_out = opt_out!(event_out);
        let outcome = try_status!(kvroute_outcome::from_u32(outcome));
        let timings = match opt_plain_ref!(timings) {
            Some(t) => try_status!(t.to_core()),
            None => Timings::default(),
        };
        let completion = Completion { outcome, timings };
        let event = try_status!(r.complete(Ticket::from_u64(ticket), completion, now_ms));
        if let Some(out) = event_out {
            handle::set_out(out, kvroute_health_event::from(event) as u32);
        }
        kvroute_status::Ok
    }
}

/// Reports an active health check of the pod (the caller's `GET /health` or metrics scrape of
/// its engine) that `passed` or failed at `now_ms`. `unhealthy_threshold` failed checks in a
/// row (default 3) take the pod out of service (`KVROUTE_HEALTH_EVENT_CHECKS_FAILING`: routes
/// skip it and count it in `kvroute_decision.excluded`); `healthy_threshold` passed checks in a
/// row (default 1) bring it back (`_CHECKS_PASSING`). A passed check also ends an ejection for
/// gateway failures when a check failed since the ejection began (the pod went down and came
/// back: `_READMITTED`); it never ends an ejection for upstream errors (5xx), which is what
/// outcome-based ejection is for.
///
/// On success, when `event_out` is not NULL, `*event_out` is the `kvroute_health_event` the
/// check caused (`KVROUTE_HEALTH_EVENT_NONE` when nothing changed). `event_out` may be NULL.
/// Returns `KVROUTE_STATUS_UNKNOWN_POD` for an id never issued or removed,
/// `KVROUTE_STATUS_NULL_PARAMETER` for a NULL router, `KVROUTE_STATUS_POISONED`; nothing is
/// written or changed on error.
#[no_mangle]
pub extern "C" fn kvroute_router_report_health_check(
    router: *mut kvroute_router,
    pod: kvroute_pod_id,
    passed: bool,
    now_ms: u64,
    event_out: *mut u32,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let event_out = opt_out!(event_out);
        let mut locked = try_status!(r.lock());
        let event = try_status!(locked.router.report_health_check(
            PodId::from_u32(pod),
            passed,
            Timestamp::from_millis(now_ms),
        ));
        drop(locked);
        if let Some(out) = event_out {
            handle::set_out(out, kvroute_health_event::from(event) as u32);
        }
        kvroute_status::Ok
    }
}

/// Reports the first token of an open request (routed, not yet completed), as soon as the
/// caller sees it: a streaming proxy sees it long before the completion, and the `least-ttft`
/// model then learns the pod's prompt-side rates (prefill rate or overhead, bytes per token,
/// how much of the prompt the engine's cache served) a whole decode earlier. Optional: a caller
/// that never calls it loses only that head start. Nothing is released: the ticket stays open
/// and must still be completed once (its explanation stays available too).
///
/// Of `timings` (borrowed for the call only) only `first_token_ms`, `prompt_tokens` and
/// `cached_tokens` are read. `KVROUTE_TIMING_FIRST_TOKEN_MS` is required (the time from
/// routing to the first token, which the caller measured: a report that arrives late must not
/// read as a slow prefill; longer than the time since routing, it is taken as that time);
/// `prompt_tokens` and `cached_tokens` are read when their bits are set.
/// The other `KVROUTE_TIMING_*` bits (`TOTAL_MS`, `OUTPUT_TOKENS`) are accepted and not read,
/// so one struct can be filled in as the response streams, passed here at the first token and
/// to `kvroute_router_complete_with_timings()` at the end. Each part of the prompt side is
/// learned once per ticket: the first-token time here; prompt and cached tokens here when
/// their bits are set (a vLLM stream carries usage at its first token only with continuous
/// usage stats), else from the completion's. A second report for the same ticket
/// returns `KVROUTE_STATUS_OK` and is ignored. Reporting a ticket whose pod was removed
/// meanwhile succeeds.
///
/// Returns `KVROUTE_STATUS_NULL_PARAMETER` if `router` or `timings` is NULL,
/// `KVROUTE_STATUS_INVALID_PARAMETER` for unknown bits in `timings->known` or a missing
/// `KVROUTE_TIMING_FIRST_TOKEN_MS`, `KVROUTE_STATUS_UNKNOWN_TICKET` for a ticket this router
/// never issued, `KVROUTE_STATUS_TICKET_NOT_OPEN` for one already completed or expired,
/// `KVROUTE_STATUS_POISONED`. Nothing changes on any error.
#[no_mangle]
pub extern "C" fn kvroute_router_first_token(
    router: *mut kvroute_router,
    ticket: kvroute_ticket,
    timings: *const kvroute_timings,
    now_ms: u64,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let t = try_plain_ref!(timings);
        let timings = try_status!(t.to_core_first_token());
        let mut locked = try_status!(r.lock());
        let (ticket, now) = (Ticket::from_u64(ticket), Timestamp::from_millis(now_ms));
        try_status!(locked.router.first_token(ticket, timings, now));
        kvroute_status::Ok
    }
}

/// `kvroute_engine_snapshot.known`: `kv_usage` is set.
pub const KVROUTE_ENGINE_KV_USAGE: u32 = 1 << 0;
/// `kvroute_engine_snapshot.known`: `prefix_queries` is set.
pub const KVROUTE_ENGINE_PREFIX_QUERIES: u32 = 1 << 1;
/// `kvroute_engine_snapshot.known`: `prefix_hits` is set.
pub const KVROUTE_ENGINE_PREFIX_HITS: u32 = 1 << 2;
const ENGINE_ALL: u32 = (1 << 3) - 1;

/// An engine's own view of its load, as scraped from its metrics (vLLM names below), passed to
/// `kvroute_router_observe_engine()` or `kvroute_router_observe_engine_timed()`. `running` and
/// `waiting` are always read; the other fields only when their `KVROUTE_ENGINE_*` bit is set in
/// `known`. The layout is frozen (the engine's timing counters come in a separate
/// `kvroute_engine_timing`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct kvroute_engine_snapshot {
    /// KV-cache usage in [0, 1] (`vllm:kv_cache_usage_perc`; several engines: the fullest).
    /// When the free share of the pod's KV cache (its size from
    /// `kvroute_router_set_engine_kv_cache_tokens()`) cannot hold a request's uncached prompt,
    /// least-ttft takes the pod to run no more sequences than `running`.
    pub kv_usage: f64,
    /// Prefix-cache queries in tokens, cumulative (`vllm:prefix_cache_queries_total`).
    pub prefix_queries: u64,
    /// Prefix-cache hits in tokens, cumulative (`vllm:prefix_cache_hits_total`).
    pub prefix_hits: u64,
    /// Sequences running (`vllm:num_requests_running`).
    pub running: u32,
    /// Requests waiting (`vllm:num_requests_waiting`).
    pub waiting: u32,
    /// Which optional fields are set: an OR of `KVROUTE_ENGINE_*` bits.
    pub known: u32,
}

impl kvroute_engine_snapshot {
    fn to_core(self) -> Result<EngineSnapshot, kvroute_status> {
        let has = |bit: u32| self.known & bit != 0;
        if self.known & !ENGINE_ALL != 0
            || (has(KVROUTE_ENGINE_KV_USAGE) && !(0.0..=1.0).contains(&self.kv_usage))
        {
            return Err(kvroute_status::InvalidParameter);
        }
        Ok(EngineSnapshot {
            running: self.running,
            waiting: self.waiting,
            kv_usage: has(KVROUTE_ENGINE_KV_USAGE).then_some(self.kv_usage),
            prefix_queries: has(KVROUTE_ENGINE_PREFIX_QUERIES).then_some(self.prefix_queries),
            prefix_hits: has(KVROUTE_ENGINE_PREFIX_HITS).then_some(self.prefix_hits),
            // From `kvroute_engine_timing`, when given (see `with_timing`).
            ..EngineSnapshot::default()
        })
    }
}

/// `kvroute_engine_timing.known`: `prefill_seconds` and `prefills` are set (a pair: the sum and
/// the count of one histogram).
pub const KVROUTE_ENGINE_TIMING_PREFILL: u32 = 1 << 0;
/// `kvroute_engine_timing.known`: `inter_token_seconds` and `inter_tokens` are set (a pair: the
/// sum and the count of one histogram).
pub const KVROUTE_ENGINE_TIMING_INTER_TOKEN: u32 = 1 << 1;
const ENGINE_TIMING_ALL: u32 = (1 << 2) - 1;

/// An engine's cumulative timing counters, as scraped from its metrics (vLLM names below),
/// passed beside a `kvroute_engine_snapshot` to `kvroute_router_observe_engine_timed()`. Each
/// pair is read only when its `KVROUTE_ENGINE_TIMING_*` bit is set in `known`. The layout is
/// frozen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct kvroute_engine_timing {
    /// Seconds from scheduling to first token, summed over requests, cumulative
    /// (`vllm:request_prefill_time_seconds_sum`); finite and >= 0.
    pub prefill_seconds: f64,
    /// Seconds between consecutive output tokens, summed, cumulative
    /// (`vllm:inter_token_latency_seconds_sum`, or `vllm:time_per_output_token_seconds_sum` on
    /// older vLLM); finite and >= 0.
    pub inter_token_seconds: f64,
    /// Requests counted in `prefill_seconds`, cumulative
    /// (`vllm:request_prefill_time_seconds_count`).
    pub prefills: u64,
    /// Gaps counted in `inter_token_seconds`, cumulative (the same histogram's `_count`).
    pub inter_tokens: u64,
    /// Which pairs are set: an OR of `KVROUTE_ENGINE_TIMING_*` bits.
    pub known: u32,
}

impl kvroute_engine_timing {
    /// `snapshot` with this struct's counters added.
    fn with_timing(self, snapshot: EngineSnapshot) -> Result<EngineSnapshot, kvroute_status> {
        let has = |bit: u32| self.known & bit != 0;
        let seconds_ok = |s: f64| s.is_finite() && s >= 0.0;
        if self.known & !ENGINE_TIMING_ALL != 0
            || (has(KVROUTE_ENGINE_TIMING_PREFILL) && !seconds_ok(self.prefill_seconds))
            || (has(KVROUTE_ENGINE_TIMING_INTER_TOKEN) && !seconds_ok(self.inter_token_seconds))
        {
            return Err(kvroute_status::InvalidParameter);
        }
        let prefill = has(KVROUTE_ENGINE_TIMING_PREFILL);
        let inter_token = has(KVROUTE_ENGINE_TIMING_INTER_TOKEN);
        Ok(EngineSnapshot {
            prefill_seconds: prefill.then_some(self.prefill_seconds),
            prefills: prefill.then_some(self.prefills),
            inter_token_seconds: inter_token.then_some(self.inter_token_seconds),
            inter_tokens: inter_token.then_some(self.inter_tokens),
            ..snapshot
        })
    }
}

/// Records the pod's engine state as scraped at `now_ms`. The `least-ttft` model uses it until
/// it grows old, adding engine load the router did not route. `snapshot` is borrowed for the
/// call only. Returns `KVROUTE_STATUS_UNKNOWN_POD`, `KVROUTE_STATUS_NULL_PARAMETER`, or
/// `KVROUTE_STATUS_INVALID_PARAMETER` for unknown bits in `known` or a `kv_usage` outside [0, 1].
/// The same as `kvroute_router_observe_engine_timed()` with a NULL `timing`.
#[no_mangle]
pub extern "C" fn kvroute_router_observe_engine(
    router: *mut kvroute_router,
    pod: kvroute_pod_id,
    snapshot: *const kvroute_engine_snapshot,
    now_ms: u64,
) -> kvroute_status {
    // The timed call has its own panic boundary.
    kvroute_router_observe_engine_timed(router, pod, snapshot, ptr::null(), now_ms)
}

/// `kvroute_router_observe_engine()` plus the engine's cumulative timing counters. Where the
/// pod's completions come without first-token times (`kvroute_router_complete()`, or timings
/// without `KVROUTE_TIMING_FIRST_TOKEN_MS`, as behind Envoy), the `least-ttft` model learns the
/// pod's prefill rate and overhead from the prefill pair together with the snapshot's
/// `prefix_queries` and `prefix_hits` (prompt tokens computed per second of prefill, one
/// sample per at least 4 prefills); where they come without a first-token time or without
/// output tokens, its time per output token from the inter-token pair (one sample per pair of
/// snapshots with a gap between them). A counter that went down (engine restart)
/// starts a new window. `snapshot` and `timing` are borrowed for the call only; `timing` may be
/// NULL (no timing counters, the same as `kvroute_router_observe_engine()`). Returns
/// `KVROUTE_STATUS_INVALID_PARAMETER` for unknown bits in `timing->known` or a set
/// `prefill_seconds` or `inter_token_seconds` that is negative or not finite, otherwise the
/// statuses of `kvroute_router_observe_engine()`.
#[no_mangle]
pub extern "C" fn kvroute_router_observe_engine_timed(
    router: *mut kvroute_router,
    pod: kvroute_pod_id,
    snapshot: *const kvroute_engine_snapshot,
    timing: *const kvroute_engine_timing,
    now_ms: u64,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let s = try_plain_ref!(snapshot);
        let mut snapshot = try_status!(s.to_core());
        if let Some(t) = opt_plain_ref!(timing) {
            snapshot = try_status!(t.with_timing(snapshot));
        }
        let mut locked = try_status!(r.lock());
        snapshot.kv_cache_tokens = locked.kv_cache_tokens.get(&pod).copied();
        try_status!(locked.router.observe_engine(PodId::from_u32(pod), snapshot, Timestamp::from_millis(now_ms)));
        kvroute_status::Ok
    }
}

/// Sets the size of the pod's engine KV cache in tokens (vLLM: `num_gpu_blocks` ×
/// `block_size`, labels of `vllm:cache_config_info`; its log's "GPU KV cache size"), added to
/// every engine snapshot recorded for the pod afterwards; 0 makes it unknown again (the
/// default). With it and a snapshot's `kv_usage`, least-ttft takes a request whose uncached
/// prompt does not fit in the free share to wait for a running sequence to end; without it,
/// the KV cache is never taken as full. Returns `KVROUTE_STATUS_UNKNOWN_POD` for an id never
/// issued or removed.
#[no_mangle]
pub extern "C" fn kvroute_router_set_engine_kv_cache_tokens(
    router: *mut kvroute_router,
    pod: kvroute_pod_id,
    tokens: u64,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let mut locked = try_status!(r.lock());
        if locked.router.pod_name(PodId::from_u32(pod)).is_none() {
            return kvroute_status::UnknownPod;
        }
        if tokens == 0 {
            locked.kv_cache_tokens.remove(&pod);
        } else {
            locked.kv_cache_tokens.insert(pod, tokens);
        }
        kvroute_status::Ok
    }
}

/// Sets the pod's engine capacity in concurrent sequences (vLLM `--max-num-seqs`) for the
/// `least-ttft` model; 0 is treated as 1. Returns `KVROUTE_STATUS_UNKNOWN_POD` for an id never
/// issued or removed.
#[no_mangle]
pub extern "C" fn kvroute_router_set_pod_capacity(
    router: *mut kvroute_router,
    pod: kvroute_pod_id,
    max_seqs: u32,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        try_status!(try_status!(r.lock()).router.set_pod_capacity(PodId::from_u32(pod), max_seqs));
        kvroute_status::Ok
    }
}
