//! Pods of a `kvroute_router`: add, update, remove, list, inspect.

use kvroute_core::{EjectionReason, PodId, PodInfo, PodSpec, Timestamp};

use crate::bytes;
use crate::handle;
use crate::router::{kvroute_pod_id, kvroute_router};
use crate::status::kvroute_status;

/// One pod as the router sees it, read by `kvroute_router_pod_info()`. Fields are never moved
/// or removed; new ones are appended at the end (the health fields after `ready`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvroute_pod_info {
    /// Requests routed to the pod since it was added.
    pub routed: u64,
    /// The pod's id.
    pub id: kvroute_pod_id,
    /// Requests routed to it and not yet completed or expired.
    pub in_flight: u32,
    /// How many models it serves.
    pub models: u32,
    /// Whether it may receive new requests (as set by `kvroute_router_add_pod()` and
    /// `kvroute_router_set_pod_ready()`; its health is below).
    pub ready: bool,
    /// Ejected by outlier detection and not yet back in service: waiting out its ejection
    /// (`ejected_until_ms`), or probing.
    pub ejected: bool,
    /// Its ejection time is over and it takes one probe request at a time, whose outcome
    /// decides whether it is back in service (`ejected` is still set).
    pub probing: bool,
    /// Its active checks are failing (`kvroute_router_report_health_check()`): out of service
    /// until they pass again.
    pub checks_failing: bool,
    /// While it waits out an ejection, when that ends on the caller's clock (ms); 0 otherwise
    /// (in service, or probing).
    pub ejected_until_ms: u64,
    /// Times it was ejected for consecutive upstream errors (`consecutive_5xx`), kept when the
    /// pod is removed and added again under its name.
    pub ejections_5xx: u64,
    /// Times it was ejected for consecutive gateway failures (connect failures, resets,
    /// timeouts), kept likewise.
    pub ejections_gateway: u64,
}

impl From<&PodInfo> for kvroute_pod_info {
    fn from(p: &PodInfo) -> Self {
        kvroute_pod_info {
            routed: p.routed,
            id: p.id.as_u32(),
            in_flight: p.in_flight,
            models: u32::try_from(p.models.len()).unwrap_or(u32::MAX),
            ready: p.ready,
            ejected: p.health.ejected,
            probing: p.health.probing,
            checks_failing: p.health.checks_failing,
            ejected_until_ms: p.health.ejected_until.map_or(0, Timestamp::as_millis),
            ejections_5xx: ejections(p, EjectionReason::Consecutive5xx),
            ejections_gateway: ejections(p, EjectionReason::ConsecutiveGatewayFailure),
        }
    }
}

/// The pod's ejections for `reason` (`PodHealth::ejections` is in `EjectionReason::ALL` order).
fn ejections(p: &PodInfo, reason: EjectionReason) -> u64 {
    EjectionReason::ALL
        .iter()
        .zip(p.health.ejections)
        .find_map(|(r, n)| (*r == reason).then_some(n))
        .unwrap_or(0)
}

/// Makes the pod named `name` serve `model`: creates the pod if no live pod has that name,
/// otherwise updates its address and readiness (keeping its in-flight count) and adds `model`
/// to the models it serves. On success `*pod_out` is the pod's id.
///
/// `name`, `model` and `address` are UTF-8 `(ptr, len)` strings borrowed for the call only;
/// `address` is `ip:port` with a numeric IP (`10.0.0.1:8000`, `[::1]:8000`). Returns
/// `KVROUTE_STATUS_EMPTY_NAME`, `KVROUTE_STATUS_INVALID_ADDRESS`, `KVROUTE_STATUS_INVALID_UTF8`
/// or `KVROUTE_STATUS_NULL_PARAMETER` with nothing changed.
#[no_mangle]
pub extern "C" fn kvroute_router_add_pod(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
    name: *const u8,
    name_len: usize,
    address: *const u8,
    address_len: usize,
    ready: bool,
    pod_out: *mut kvroute_pod_id,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let out = try_out!(pod_out);
        let model = try_str!(model, model_len);
        let name = try_str!(name, name_len);
        let address = try_str!(address, address_len);
        let pod = try_status!(try_status!(r.lock()).router.add_pod(model, PodSpec { name, address, ready }));
        handle::set_out(out, pod.as_u32());
        kvroute_status::Ok
    }
}

/// Creates or updates the pod named `name` (address and readiness; its in-flight count and
/// models are kept) without changing which models it serves. A new pod serves no model until
/// `kvroute_router_add_pod()` attaches one. On success `*pod_out` is the pod's id. Errors as
/// `kvroute_router_add_pod()`.
#[no_mangle]
pub extern "C" fn kvroute_router_upsert_pod(
    router: *mut kvroute_router,
    name: *const u8,
    name_len: usize,
    address: *const u8,
    address_len: usize,
    ready: bool,
    pod_out: *mut kvroute_pod_id,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let out = try_out!(pod_out);
        let name = try_str!(name, name_len);
        let address = try_str!(address, address_len);
        let pod = try_status!(try_status!(r.lock()).router.upsert_pod(PodSpec { name, address, ready }));
        handle::set_out(out, pod.as_u32());
        kvroute_status::Ok
    }
}

/// Sets whether the pod may receive new requests (its in-flight count is kept). Returns
/// `KVROUTE_STATUS_UNKNOWN_POD` for an id never issued or removed.
#[no_mangle]
pub extern "C" fn kvroute_router_set_pod_ready(
    router: *mut kvroute_router,
    pod: kvroute_pod_id,
    ready: bool,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        try_status!(try_status!(r.lock()).router.set_pod_ready(PodId::from_u32(pod), ready));
        kvroute_status::Ok
    }
}

/// Makes the pod engine `rank` of a data-parallel server (vLLM `--data-parallel-size`: several
/// engines, each with its own KV cache and queue, behind one address), or a whole server again
/// with a negative `rank`. Add each engine as a pod of its own (its own name, the server's
/// address) and set its rank; a decision for it carries the rank
/// (`kvroute_decision.data_parallel_rank`), which the caller sends upstream as vLLM's
/// `X-data-parallel-rank` request header. Returns `KVROUTE_STATUS_UNKNOWN_POD`, or
/// `KVROUTE_STATUS_INVALID_PARAMETER` for a rank above `UINT32_MAX`, with nothing changed.
#[no_mangle]
pub extern "C" fn kvroute_router_set_pod_data_parallel_rank(
    router: *mut kvroute_router,
    pod: kvroute_pod_id,
    rank: i64,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let rank = match rank {
            ..0 => None,
            r => Some(try_status!(u32::try_from(r).map_err(|_| kvroute_status::InvalidParameter))),
        };
        try_status!(try_status!(r.lock()).router.set_pod_data_parallel_rank(PodId::from_u32(pod), rank));
        kvroute_status::Ok
    }
}

/// Changes the pod's `ip:port` address (UTF-8, borrowed for the call only). Returns
/// `KVROUTE_STATUS_UNKNOWN_POD` or `KVROUTE_STATUS_INVALID_ADDRESS` with nothing changed.
#[no_mangle]
pub extern "C" fn kvroute_router_set_pod_address(
    router: *mut kvroute_router,
    pod: kvroute_pod_id,
    address: *const u8,
    address_len: usize,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let address = try_str!(address, address_len);
        try_status!(try_status!(r.lock()).router.set_pod_address(PodId::from_u32(pod), address));
        kvroute_status::Ok
    }
}

/// Stops the pod from serving `model` (UTF-8, borrowed for the call only) and forgets its
/// prefix-index entries for that model. Returns `KVROUTE_STATUS_UNKNOWN_POD` or
/// `KVROUTE_STATUS_UNKNOWN_MODEL` with nothing changed.
#[no_mangle]
pub extern "C" fn kvroute_router_detach_pod(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
    pod: kvroute_pod_id,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let model = try_str!(model, model_len);
        try_status!(try_status!(r.lock()).router.detach_pod(model, PodId::from_u32(pod)));
        kvroute_status::Ok
    }
}

/// Removes the model (UTF-8, borrowed for the call only): its pods stop serving it (they keep
/// their other models), its prefix-index entries are purged, and routing it returns
/// `KVROUTE_STATUS_UNKNOWN_MODEL` until `kvroute_router_add_pod()` attaches a pod to it again.
/// Its open tickets complete as usual and its statistics are kept. Returns
/// `KVROUTE_STATUS_UNKNOWN_MODEL` for a model not served, with nothing changed.
#[no_mangle]
pub extern "C" fn kvroute_router_remove_model(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let model = try_str!(model, model_len);
        try_status!(try_status!(r.lock()).router.remove_model(model));
        kvroute_status::Ok
    }
}

/// Removes the pod: it gets no new requests, its prefix-index entries are purged, and its open
/// tickets become orphans (completing them still succeeds). Its id is never reused. Returns
/// `KVROUTE_STATUS_UNKNOWN_POD` for an id never issued or already removed.
#[no_mangle]
pub extern "C" fn kvroute_router_remove_pod(
    router: *mut kvroute_router,
    pod: kvroute_pod_id,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let mut locked = try_status!(r.lock());
        try_status!(locked.router.remove_pod(PodId::from_u32(pod)));
        locked.kv_cache_tokens.remove(&pod);
        kvroute_status::Ok
    }
}

/// Looks up the live pod named `name` (UTF-8, borrowed for the call only); on success
/// `*pod_out` is its id. Returns `KVROUTE_STATUS_UNKNOWN_POD` if there is none.
#[no_mangle]
pub extern "C" fn kvroute_router_pod_id(
    router: *const kvroute_router,
    name: *const u8,
    name_len: usize,
    pod_out: *mut kvroute_pod_id,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let out = try_out!(pod_out);
        let name = try_str!(name, name_len);
        let Some(pod) = try_status!(r.lock()).router.pod_id(name) else {
            return kvroute_status::UnknownPod;
        };
        handle::set_out(out, pod.as_u32());
        kvroute_status::Ok
    }
}

/// Lists the ids of every live pod, in the order they were added, into `(buf, len)`; on
/// success `*out_n` is their count. If `len` is too small, returns
/// `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set to the count and `buf` untouched;
/// `(NULL, 0)` is a valid count query. (Pods may be added between a query and the next call.)
#[no_mangle]
pub extern "C" fn kvroute_router_pods(
    router: *const kvroute_router,
    buf: *mut kvroute_pod_id,
    len: usize,
    out_n: *mut usize,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let buf = try_out_slice!(buf, len);
        let out_n = try_out!(out_n);
        let ids: Vec<u32> = try_status!(r.lock()).router.pods().iter().map(|p| p.id.as_u32()).collect();
        bytes::write_items(&ids, buf, out_n)
    }
}

/// Reads the pod's state into `*info_out`. Returns `KVROUTE_STATUS_UNKNOWN_POD` for an id never
/// issued or removed.
#[no_mangle]
pub extern "C" fn kvroute_router_pod_info(
    router: *const kvroute_router,
    pod: kvroute_pod_id,
    info_out: *mut kvroute_pod_info,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let out = try_out!(info_out);
        let Some(info) = try_status!(r.lock()).router.pod(PodId::from_u32(pod)) else {
            return kvroute_status::UnknownPod;
        };
        handle::set_out(out, kvroute_pod_info::from(&info));
        kvroute_status::Ok
    }
}

/// The pod's in-flight count into `*in_flight_out`. Returns `KVROUTE_STATUS_UNKNOWN_POD` for an
/// id never issued or removed.
#[no_mangle]
pub extern "C" fn kvroute_router_in_flight(
    router: *const kvroute_router,
    pod: kvroute_pod_id,
    in_flight_out: *mut u32,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let out = try_out!(in_flight_out);
        let Some(n) = try_status!(r.lock()).router.in_flight(PodId::from_u32(pod)) else {
            return kvroute_status::UnknownPod;
        };
        handle::set_out(out, n);
        kvroute_status::Ok
    }
}

/// Which string of a pod to copy out.
fn pod_string(
    router: *const kvroute_router,
    pod: kvroute_pod_id,
    buf: *mut u8,
    len: usize,
    out_n: *mut usize,
    address: bool,
) -> kvroute_status {
    let r = try_ref!(router);
    let buf = try_out_slice!(buf, len);
    let out_n = try_out!(out_n);
    let locked = try_status!(r.lock());
    let id = PodId::from_u32(pod);
    let value = if address {
        locked.router.pod_address(id)
    } else {
        locked.router.pod_name(id)
    };
    match value {
        Some(s) => bytes::write_str(s, buf, out_n),
        None => kvroute_status::UnknownPod,
    }
}

/// Copies the pod's name into `(buf, len)`, NUL-terminated; on success `*out_n` is its length
/// without the NUL. If `len` is too small, returns `KVROUTE_STATUS_INSUFFICIENT_SIZE` with
/// `*out_n` set to the `len` needed (length + 1) and `buf` untouched; `(NULL, 0)` is a valid size
/// query. Returns `KVROUTE_STATUS_UNKNOWN_POD` for an id never issued or removed.
#[no_mangle]
pub extern "C" fn kvroute_router_pod_name(
    router: *const kvroute_router,
    pod: kvroute_pod_id,
    buf: *mut u8,
    len: usize,
    out_n: *mut usize,
) -> kvroute_status {
    ffi_panic_boundary! { pod_string(router, pod, buf, len, out_n, false) }
}

/// Copies the pod's `ip:port` address into `(buf, len)`, with the same rules as
/// `kvroute_router_pod_name()`. A proxy connects to this address.
#[no_mangle]
pub extern "C" fn kvroute_router_pod_address(
    router: *const kvroute_router,
    pod: kvroute_pod_id,
    buf: *mut u8,
    len: usize,
    out_n: *mut usize,
) -> kvroute_status {
    ffi_panic_boundary! { pod_string(router, pod, buf, len, out_n, true) }
}
