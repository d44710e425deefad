//! `kvroute_decision`, its one-line explanation and session id, and `kvroute_stats`.

use kvroute_core::{Decision, Outcome, RouterStats, Ticket};

use crate::bytes;
use crate::router::{kvroute_pod_id, kvroute_router, kvroute_ticket};
use crate::status::{kvroute_reason, kvroute_status};

/// One routing decision, written by `kvroute_router_route()` / `kvroute_router_route_json()`
/// (and their `_subset` and `_session` variants, and the token calls).
///
/// The request holds an in-flight slot on `pod` until `ticket` is passed to
/// `kvroute_router_complete()`. Fields are never moved or removed; new ones are appended at the
/// end (`excluded` and `health_probe` came with pod health, `data_parallel_rank` with
/// data-parallel servers). The session id of
/// `session-affinity` is no field (its length follows the pod's address):
/// `kvroute_router_session_id()` reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct kvroute_decision {
    /// The ticket to complete exactly once.
    pub ticket: kvroute_ticket,
    /// The mean in-flight load over the ready pods, before this request.
    pub load_mean: f64,
    /// The chosen pod (see `kvroute_router_pod_name()` / `kvroute_router_pod_address()`).
    pub pod: kvroute_pod_id,
    /// Why this pod: a `kvroute_reason` value.
    pub reason: u32,
    /// Leading blocks of the prompt the chosen pod held in the prefix index.
    pub matched_blocks: u32,
    /// Complete blocks in the prompt.
    pub total_blocks: u32,
    /// `matched_blocks * 100 / total_blocks` rounded down, 0 when the prompt has no complete
    /// block.
    pub match_percent: u32,
    /// The chosen pod's in-flight load, before this request.
    pub load: u32,
    /// The smallest in-flight load over the ready pods, before this request.
    pub load_min: u32,
    /// The largest in-flight load over the ready pods, before this request.
    pub load_max: u32,
    /// How many pods of the model were ready.
    pub ready_pods: u32,
    /// Whether prefix-cache's imbalance guard (`max - min > imbalance count`) fired.
    pub imbalance: bool,
    /// Ready pods of the model that were no candidates because of their health (ejected, one
    /// probe already out, or failing active checks); pods set not ready are not counted.
    pub excluded: u32,
    /// The request is the probe of a pod whose ejection is over: its outcome decides whether
    /// the pod is back in service (success readmits it, a failure ejects it again for longer,
    /// a cancel lets the next request probe).
    pub health_probe: bool,
    /// The chosen pod's engine rank when it is one engine of a data-parallel server
    /// (`kvroute_router_set_pod_data_parallel_rank()`): send it upstream as vLLM's
    /// `X-data-parallel-rank` header. -1 for a whole server.
    pub data_parallel_rank: i64,
}

impl From<&Decision> for kvroute_decision {
    fn from(d: &Decision) -> Self {
        kvroute_decision {
            ticket: d.ticket.as_u64(),
            load_mean: d.loads.mean,
            pod: d.pod.as_u32(),
            reason: kvroute_reason::from(d.reason) as u32,
            matched_blocks: d.matched_blocks,
            total_blocks: d.total_blocks,
            match_percent: u32::from(d.match_percent),
            load: d.loads.chosen,
            load_min: d.loads.min,
            load_max: d.loads.max,
            ready_pods: d.loads.ready,
            imbalance: d.imbalance,
            excluded: d.excluded,
            health_probe: d.health_probe,
            data_parallel_rank: d.data_parallel_rank.map_or(-1, i64::from),
        }
    }
}

/// Writes the one-line explanation of the decision that issued `ticket` to `(buf, len)`,
/// NUL-terminated, for logs and the `x-kvroute-decision` response header, e.g.
/// `strategy=prefix-cache reason=prefix_match pod=vllm-b match=100% blocks=218/218 imbalance=0
/// load=12 min=3 max=12 mean=5.00 ready=3 ticket=17 ...` (one line, ASCII, no commas or
/// quotes; the text is the core's `Decision` rendering and may gain fields).
///
/// The explanation is kept while the ticket is open: call it before
/// `kvroute_router_complete()`. Returns `KVROUTE_STATUS_UNKNOWN_TICKET` for a ticket that is
/// not open (never issued, completed or expired). On success `*out_n` is the length without
/// the NUL. If `len` is too small, returns `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set
/// to the `len` needed (length + 1) and `buf` untouched; `(NULL, 0)` is a valid size query.
/// 512 bytes is enough unless pod names are long.
#[no_mangle]
pub extern "C" fn kvroute_router_explain(
    router: *const kvroute_router,
    ticket: kvroute_ticket,
    buf: *mut u8,
    len: usize,
    out_n: *mut usize,
) -> kvroute_status {
    ffi_panic_boundary! { decision_text(router, ticket, buf, len, out_n, Decision::to_string) }
}

/// Writes the session id of the decision that issued `ticket` to `(buf, len)`, NUL-terminated:
/// for AIBrix's `session-affinity`, the value to return to the client in the response's
/// `x-session-id` header. The client's next request passes it back (to
/// `kvroute_router_route_session()` or another `_session` call) and goes to the same pod while
/// that pod is a candidate. The id is the standard base64 (padded, ASCII) of the chosen pod's
/// `ip:port` as given to `kvroute_router_add_pod()`, AIBrix's encoding: 4 bytes for every 3 of
/// the address, so 96 bytes hold the id of any address written without leading zeros.
///
/// A decision carries a session id when the strategy spec it was routed with (the request's,
/// or the configured default) includes `session-affinity` or `least-ttft` (whose model counts
/// the pod a session id names as holding the previous answer), whichever route call made it and
/// whether or not the request had a session id. Otherwise its session id is empty: `*out_n` is
/// 0 and `buf` holds only the NUL (a session id is never empty).
///
/// The rest is as in `kvroute_router_explain()`: the id is kept while the ticket is open (call
/// it before `kvroute_router_complete()`; `KVROUTE_STATUS_UNKNOWN_TICKET` for a ticket that is
/// not open); `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set to the length + 1 and `buf`
/// untouched when `len` is too small; `(NULL, 0)` is a valid size query.
#[no_mangle]
pub extern "C" fn kvroute_router_session_id(
    router: *const kvroute_router,
    ticket: kvroute_ticket,
    buf: *mut u8,
    len: usize,
    out_n: *mut usize,
) -> kvroute_status {
    ffi_panic_boundary! {
        decision_text(router, ticket, buf, len, out_n, |d| {
            d.session_id.clone().unwrap_or_default()
        })
    }
}

/// Writes what `text` makes of the decision that issued `ticket` to `(buf, len)`, with the
/// out-buffer rules of `kvroute_router_explain()`; `UNKNOWN_TICKET` when the ticket is not open.
fn decision_text(
    router: *const kvroute_router,
    ticket: kvroute_ticket,
    buf: *mut u8,
    len: usize,
    out_n: *mut usize,
    text: fn(&Decision) -> String,
) -> kvroute_status {
    let r = try_ref!(router);
    let buf = try_out_slice!(buf, len);
    let out_n = try_out!(out_n);
    let locked = try_status!(r.lock());
    let text = match locked.decisions.get(&ticket) {
        Some(d) if locked.router.is_open(Ticket::from_u64(ticket)) => text(d),
        _ => return kvroute_status::UnknownTicket,
    };
    drop(locked);
    bytes::write_str(&text, buf, out_n)
}

/// Counters of the whole router (all models), read by `kvroute_router_stats()`. Fields are
/// never moved or removed; new counters are appended at the end (the completions by the
/// outcomes that came with pod health follow `decisions_by_match_bucket`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvroute_stats {
    /// Live pods.
    pub pods: u64,
    /// Live pods that are ready.
    pub ready_pods: u64,
    /// Models known (served by a pod now or earlier).
    pub models: u64,
    /// Sum of the live pods' in-flight counts.
    pub in_flight: u64,
    /// Tickets open now.
    pub tickets_open: u64,
    /// Tickets issued (successful routes).
    pub tickets_issued: u64,
    /// Completions accepted with `KVROUTE_OUTCOME_SUCCESS`.
    pub completed_success: u64,
    /// Completions accepted with `KVROUTE_OUTCOME_CANCELLED`.
    pub completed_cancelled: u64,
    /// Completions accepted with `KVROUTE_OUTCOME_FAILED`.
    pub completed_failed: u64,
    /// Tickets released by the ticket TTL because no completion came.
    pub tickets_expired: u64,
    /// Tickets whose pod had been removed when they were completed or expired.
    pub tickets_orphaned: u64,
    /// Completions and first-token reports rejected (a ticket never issued, or already
    /// completed or expired).
    pub tickets_rejected: u64,
    /// Blocks in the prefix index.
    pub index_blocks: u64,
    /// The index capacity in blocks.
    pub index_capacity: u64,
    /// New blocks inserted into the index.
    pub index_inserted: u64,
    /// Blocks evicted to make room.
    pub index_evicted: u64,
    /// Blocks dropped by the index TTL.
    pub index_expired: u64,
    /// Blocks dropped because their last pod was removed.
    pub index_purged: u64,
    /// Route calls for a model no pod serves.
    pub unknown_model: u64,
    /// Route calls rejected because no pod of the model was ready and in service (or, with an
    /// endpoint subset, none in the subset: `KVROUTE_STATUS_NO_POD_IN_SUBSET` counts here too).
    pub no_ready_pod: u64,
    /// Times prefix-cache's imbalance guard fired.
    pub imbalance_events: u64,
    /// Decisions by reason, indexed by `kvroute_reason` value (one entry per reason, 0 to
    /// `KVROUTE_REASON_SESSION_AFFINITY`).
    pub routed_by_reason: [u64; 16],
    /// prefix-cache decisions by the chosen pod's match percent, in AIBrix's buckets
    /// `0`, `1-25`, `26-50`, `51-75`, `76-100`.
    pub decisions_by_match_bucket: [u64; 5],
    /// Completions accepted with `KVROUTE_OUTCOME_CONNECT_FAILED`.
    pub completed_connect_failed: u64,
    /// Completions accepted with `KVROUTE_OUTCOME_RESET`.
    pub completed_reset: u64,
    /// Completions accepted with `KVROUTE_OUTCOME_TIMEOUT`.
    pub completed_timeout: u64,
}

impl From<&RouterStats> for kvroute_stats {
    fn from(s: &RouterStats) -> Self {
        let mut out = kvroute_stats {
            pods: s.pods.len() as u64,
            ready_pods: s.pods.iter().filter(|p| p.ready).count() as u64,
            models: s.models.len() as u64,
            in_flight: s.pods.iter().map(|p| u64::from(p.in_flight)).sum(),
            tickets_open: s.tickets.open,
            tickets_issued: s.tickets.issued,
            tickets_expired: s.tickets.expired,
            tickets_orphaned: s.tickets.orphaned,
            tickets_rejected: s.tickets.rejected,
            index_blocks: s.index.blocks,
            index_capacity: s.index.capacity,
            index_inserted: s.index.inserted,
            index_evicted: s.index.evicted,
            index_expired: s.index.expired,
            index_purged: s.index.purged,
            unknown_model: s.unknown_model,
            ..Default::default()
        };
        for (o, n) in Outcome::ALL.into_iter().zip(s.tickets.completed) {
            match o {
                Outcome::Success => out.completed_success = n,
                Outcome::Cancelled => out.completed_cancelled = n,
                Outcome::Failed => out.completed_failed = n,
                Outcome::ConnectFailed => out.completed_connect_failed = n,
                Outcome::Reset => out.completed_reset = n,
                Outcome::Timeout => out.completed_timeout = n,
            }
        }
        for m in &s.models {
            out.no_ready_pod += m.no_ready_pod;
            out.imbalance_events += m.imbalance_events;
            for r in kvroute_reason::ALL {
                out.routed_by_reason[r as usize] += m.routed(r.core());
            }
            for (acc, n) in out
                .decisions_by_match_bucket
                .iter_mut()
                .zip(m.decisions_by_bucket)
            {
                *acc += n;
            }
        }
        out
    }
}

/// Reads every counter of the router into `*stats_out`.
#[no_mangle]
pub extern "C" fn kvroute_router_stats(
    router: *const kvroute_router,
    stats_out: *mut kvroute_stats,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let out = try_out!(stats_out);
        let stats = try_status!(r.lock()).router.stats();
        crate::handle::set_out(out, kvroute_stats::from(&stats));
        kvroute_status::Ok
    }
}
