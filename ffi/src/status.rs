//! The status codes every fallible function returns, and the other enums of the C API.
//!
//! Numbers are explicit and stable: a number is never reused. A retired variant stays here as a
//! comment marked "Reserved".

use std::ffi::c_char;

use kvroute_core::{
    ConfigError, HealthEvent, Outcome, Reason, RegistryError, RouteError, StrategyError,
    TicketError,
};

/// The result of every fallible `kvroute_` function. `KVROUTE_STATUS_OK` (0) is success; every
/// other value is an error, and no output parameter was written (except `*out_n` on
/// `KVROUTE_STATUS_INSUFFICIENT_SIZE`, which holds the buffer size needed).
///
/// Functions return it as a `uint32_t`; `kvroute_status_str()` names it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvroute_status {
    /// Success.
    Ok = 0,
    /// A required pointer argument was NULL (or a NULL data pointer came with a non-zero length).
    NullParameter = 1,
    /// An argument is out of range: an unknown enum value, a zero size, a value the router
    /// rejects.
    InvalidParameter = 2,
    /// A string argument is not valid UTF-8.
    InvalidUtf8 = 3,
    /// The output buffer is too small; `*out_n` holds the size needed and nothing else was
    /// written.
    InsufficientSize = 4,
    /// No pod serves the requested model (AIBrix answers 400 `model_not_found`).
    UnknownModel = 5,
    /// The model is known but none of its pods is ready and in service (not ejected, active
    /// checks not failing) (AIBrix answers 503).
    NoReadyPod = 6,
    /// The pod id was never issued, or the pod was removed; or no live pod has that name.
    UnknownPod = 7,
    /// The ticket was never issued by this router (for `kvroute_router_explain()`: the ticket
    /// is not open).
    UnknownTicket = 8,
    /// The ticket was already completed or expired (a double completion). Nothing changed.
    TicketNotOpen = 9,
    /// The routing strategy string is not a valid spec (`name[:weight][,name[:weight]...]`
    /// over `random`, `least-request`, `prefix-cache`, `least-ttft`).
    InvalidStrategy = 10,
    /// The pod address is not `ip:port` with a numeric IP.
    InvalidAddress = 11,
    /// A pod or model name is empty.
    EmptyName = 12,
    /// The request body is not JSON, or its `messages` / `prompt` field has the wrong type.
    InvalidBody = 13,
    /// The configuration is invalid (zero capacity or TTL, bad block size, bad σ factor, a zero
    /// base ejection time or an ejection percentage over 100).
    InvalidConfig = 14,
    /// The request named an endpoint subset (`kvroute_router_route_subset()`,
    /// `kvroute_router_route_json_subset()`) and no pod of the model in it is ready and in
    /// service: "no ready pod for model in the endpoint subset" (the Gateway API Inference
    /// Extension answers 503). An empty subset, or one of addresses no pod of the model has,
    /// gives it too.
    NoPodInSubset = 15,
    /// The library panicked; the call had no effect unless it held the router lock, in which
    /// case the router is now poisoned. This is a bug in kvroute: please report it.
    Panic = 100,
    /// An earlier call panicked while holding this router's lock, so its state can no longer be
    /// trusted. Every later call on the router returns this; free it and build a new one.
    Poisoned = 101,
}

impl kvroute_status {
    /// Every status, in number order.
    pub const ALL: [kvroute_status; 18] = [
        kvroute_status::Ok,
        kvroute_status::NullParameter,
        kvroute_status::InvalidParameter,
        kvroute_status::InvalidUtf8,
        kvroute_status::InsufficientSize,
        kvroute_status::UnknownModel,
        kvroute_status::NoReadyPod,
        kvroute_status::UnknownPod,
        kvroute_status::UnknownTicket,
        kvroute_status::TicketNotOpen,
        kvroute_status::InvalidStrategy,
        kvroute_status::InvalidAddress,
        kvroute_status::EmptyName,
        kvroute_status::InvalidBody,
        kvroute_status::InvalidConfig,
        kvroute_status::NoPodInSubset,
        kvroute_status::Panic,
        kvroute_status::Poisoned,
    ];

    /// The status with this number, if any.
    pub fn from_u32(n: u32) -> Option<kvroute_status> {
        Self::ALL.into_iter().find(|s| *s as u32 == n)
    }

    /// The constant's name as it appears in `kvroute.h`, NUL-terminated.
    pub const fn name(self) -> &'static str {
        match self {
            kvroute_status::Ok => "KVROUTE_STATUS_OK\0",
            kvroute_status::NullParameter => "KVROUTE_STATUS_NULL_PARAMETER\0",
            kvroute_status::InvalidParameter => "KVROUTE_STATUS_INVALID_PARAMETER\0",
            kvroute_status::InvalidUtf8 => "KVROUTE_STATUS_INVALID_UTF8\0",
            kvroute_status::InsufficientSize => "KVROUTE_STATUS_INSUFFICIENT_SIZE\0",
            kvroute_status::UnknownModel => "KVROUTE_STATUS_UNKNOWN_MODEL\0",
            kvroute_status::NoReadyPod => "KVROUTE_STATUS_NO_READY_POD\0",
            kvroute_status::UnknownPod => "KVROUTE_STATUS_UNKNOWN_POD\0",
            kvroute_status::UnknownTicket => "KVROUTE_STATUS_UNKNOWN_TICKET\0",
            kvroute_status::TicketNotOpen => "KVROUTE_STATUS_TICKET_NOT_OPEN\0",
            kvroute_status::InvalidStrategy => "KVROUTE_STATUS_INVALID_STRATEGY\0",
            kvroute_status::InvalidAddress => "KVROUTE_STATUS_INVALID_ADDRESS\0",
            kvroute_status::EmptyName => "KVROUTE_STATUS_EMPTY_NAME\0",
            kvroute_status::InvalidBody => "KVROUTE_STATUS_INVALID_BODY\0",
            kvroute_status::InvalidConfig => "KVROUTE_STATUS_INVALID_CONFIG\0",
            kvroute_status::NoPodInSubset => "KVROUTE_STATUS_NO_POD_IN_SUBSET\0",
            kvroute_status::Panic => "KVROUTE_STATUS_PANIC\0",
            kvroute_status::Poisoned => "KVROUTE_STATUS_POISONED\0",
        }
    }

    /// The name without its NUL terminator.
    pub fn as_str(self) -> &'static str {
        self.name().trim_end_matches('\0')
    }
}

impl From<RouteError> for kvroute_status {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::UnknownModel => kvroute_status::UnknownModel,
            RouteError::NoReadyPod => kvroute_status::NoReadyPod,
            RouteError::NoPodInSubset => kvroute_status::NoPodInSubset,
            _ => kvroute_status::InvalidParameter,
        }
    }
}

impl From<RegistryError> for kvroute_status {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::EmptyPodName | RegistryError::EmptyModelName => {
                kvroute_status::EmptyName
            }
            RegistryError::InvalidAddress(_) => kvroute_status::InvalidAddress,
            RegistryError::UnknownPod(_) => kvroute_status::UnknownPod,
            RegistryError::UnknownModel(_) => kvroute_status::UnknownModel,
            _ => kvroute_status::InvalidParameter,
        }
    }
}

impl From<TicketError> for kvroute_status {
    fn from(e: TicketError) -> Self {
        match e {
            TicketError::NeverIssued(_) => kvroute_status::UnknownTicket,
            TicketError::NotOpen(_) => kvroute_status::TicketNotOpen,
            _ => kvroute_status::InvalidParameter,
        }
    }
}

impl From<StrategyError> for kvroute_status {
    fn from(_: StrategyError) -> Self {
        kvroute_status::InvalidStrategy
    }
}

impl From<ConfigError> for kvroute_status {
    fn from(_: ConfigError) -> Self {
        kvroute_status::InvalidConfig
    }
}

/// Why the router chose the pod: `kvroute_decision.reason`. `kvroute_reason_str()` names it
/// with the label AIBrix uses (`prefix_match`, `least_request_fallback`, ...).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvroute_reason {
    /// `random`: uniform choice.
    Random = 0,
    /// `least-request`: fewest in-flight requests.
    LeastRequest = 1,
    /// `prefix-cache`: the best-matching pod within `mean + k*stddev` load.
    PrefixMatch = 2,
    /// `prefix-cache`: some pod matched but none passed the load filter; least-loaded instead.
    PrefixMatchSkipped = 3,
    /// `prefix-cache`: no pod matched; least-loaded instead.
    LeastRequestFallback = 4,
    /// A weighted multi-strategy spec: highest combined score.
    Weighted = 5,
    /// `least-ttft`: the smallest predicted time to first token plus prefill stall charge.
    LeastTtft = 6,
    /// `least-ttft`: sent to a pod not yet probed, because the cheapest pod would have made it
    /// wait at least the configured exploration wait (500 ms by default).
    LeastTtftProbe = 7,
    /// `least-kv-cache`: the least KV-cache usage.
    LeastKvCache = 8,
    /// `least-gpu-cache`: the least GPU KV-cache usage.
    LeastGpuCache = 9,
    /// `least-busy-time`: the least busy-time ratio.
    LeastBusyTime = 10,
    /// `least-latency`: the least expected latency.
    LeastLatency = 11,
    /// `throughput`: the fewest weighted tokens per request served.
    Throughput = 12,
    /// `least-utilization`: the least utilization.
    LeastUtilization = 13,
    /// `power-of-two`: the less loaded of two random pods.
    PowerOfTwo = 14,
    /// `session-affinity`: the pod the request's session id names (a request without a
    /// usable one goes to a random pod: `KVROUTE_REASON_RANDOM`, as do the metric strategies
    /// when no pod has their metric).
    SessionAffinity = 15,
}

impl kvroute_reason {
    /// Every reason, in number order.
    pub const ALL: [kvroute_reason; 16] = [
        kvroute_reason::Random,
        kvroute_reason::LeastRequest,
        kvroute_reason::PrefixMatch,
        kvroute_reason::PrefixMatchSkipped,
        kvroute_reason::LeastRequestFallback,
        kvroute_reason::Weighted,
        kvroute_reason::LeastTtft,
        kvroute_reason::LeastTtftProbe,
        kvroute_reason::LeastKvCache,
        kvroute_reason::LeastGpuCache,
        kvroute_reason::LeastBusyTime,
        kvroute_reason::LeastLatency,
        kvroute_reason::Throughput,
        kvroute_reason::LeastUtilization,
        kvroute_reason::PowerOfTwo,
        kvroute_reason::SessionAffinity,
    ];

    /// The core reason this code stands for.
    pub const fn core(self) -> Reason {
        match self {
            kvroute_reason::Random => Reason::Random,
            kvroute_reason::LeastRequest => Reason::LeastRequest,
            kvroute_reason::PrefixMatch => Reason::PrefixMatch,
            kvroute_reason::PrefixMatchSkipped => Reason::PrefixMatchSkipped,
            kvroute_reason::LeastRequestFallback => Reason::LeastRequestFallback,
            kvroute_reason::Weighted => Reason::Weighted,
            kvroute_reason::LeastTtft => Reason::LeastTtft,
            kvroute_reason::LeastTtftProbe => Reason::LeastTtftProbe,
            kvroute_reason::LeastKvCache => Reason::LeastKvCache,
            kvroute_reason::LeastGpuCache => Reason::LeastGpuCache,
            kvroute_reason::LeastBusyTime => Reason::LeastBusyTime,
            kvroute_reason::LeastLatency => Reason::LeastLatency,
            kvroute_reason::Throughput => Reason::Throughput,
            kvroute_reason::LeastUtilization => Reason::LeastUtilization,
            kvroute_reason::PowerOfTwo => Reason::PowerOfTwo,
            kvroute_reason::SessionAffinity => Reason::SessionAffinity,
        }
    }

    /// The label, NUL-terminated.
    pub const fn label(self) -> &'static str {
        match self {
            kvroute_reason::Random => "random\0",
            kvroute_reason::LeastRequest => "least_request\0",
            kvroute_reason::PrefixMatch => "prefix_match\0",
            kvroute_reason::PrefixMatchSkipped => "prefix_match_skipped\0",
            kvroute_reason::LeastRequestFallback => "least_request_fallback\0",
            kvroute_reason::Weighted => "weighted\0",
            kvroute_reason::LeastTtft => "least_ttft\0",
            kvroute_reason::LeastTtftProbe => "least_ttft_probe\0",
            kvroute_reason::LeastKvCache => "least_kv_cache\0",
            kvroute_reason::LeastGpuCache => "least_gpu_cache\0",
            kvroute_reason::LeastBusyTime => "least_busy_time\0",
            kvroute_reason::LeastLatency => "least_latency\0",
            kvroute_reason::Throughput => "throughput\0",
            kvroute_reason::LeastUtilization => "least_utilization\0",
            kvroute_reason::PowerOfTwo => "power_of_two\0",
            kvroute_reason::SessionAffinity => "session_affinity\0",
        }
    }
}

impl From<Reason> for kvroute_reason {
    fn from(r: Reason) -> Self {
        match r {
            Reason::Random => kvroute_reason::Random,
            Reason::LeastRequest => kvroute_reason::LeastRequest,
            Reason::PrefixMatch => kvroute_reason::PrefixMatch,
            Reason::PrefixMatchSkipped => kvroute_reason::PrefixMatchSkipped,
            Reason::LeastRequestFallback => kvroute_reason::LeastRequestFallback,
            Reason::Weighted => kvroute_reason::Weighted,
            Reason::LeastTtft => kvroute_reason::LeastTtft,
            Reason::LeastTtftProbe => kvroute_reason::LeastTtftProbe,
            Reason::LeastKvCache => kvroute_reason::LeastKvCache,
            Reason::LeastGpuCache => kvroute_reason::LeastGpuCache,
            Reason::LeastBusyTime => kvroute_reason::LeastBusyTime,
            Reason::LeastLatency => kvroute_reason::LeastLatency,
            Reason::Throughput => kvroute_reason::Throughput,
            Reason::LeastUtilization => kvroute_reason::LeastUtilization,
            Reason::PowerOfTwo => kvroute_reason::PowerOfTwo,
            Reason::SessionAffinity => kvroute_reason::SessionAffinity,
        }
    }
}

/// How a request ended, passed to `kvroute_router_complete()` and its variants as a
/// `uint32_t`. The outcome also feeds the pod's health (outlier detection, modelled on Envoy's):
/// `KVROUTE_OUTCOME_FAILED`, `_CONNECT_FAILED`, `_RESET` and `_TIMEOUT` are upstream errors, and
/// `kvroute_config_builder_set_consecutive_5xx()` of them in a row eject the pod (default 5);
/// `_CONNECT_FAILED`, `_RESET` and `_TIMEOUT` are also gateway failures, and
/// `kvroute_config_builder_set_consecutive_gateway_failures()` of those in a row eject it
/// (default 3). A success resets both counts; a cancel never counts against the pod. An ejected
/// pod gets no requests until its ejection time is over, then one probe request at a time: the
/// probe's success readmits it, its failure ejects it again for longer.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvroute_outcome {
    /// The response finished normally (a client error such as a 4xx counts as success: the pod
    /// worked). Resets the pod's error counts; the success of a probe readmits the pod.
    Success = 0,
    /// The client went away before the response finished. Says nothing about the pod: counts
    /// neither for nor against it (a cancelled probe lets the next request probe).
    Cancelled = 1,
    /// The upstream answered with a server error (5xx), or failed in a way the caller cannot
    /// tell apart. An upstream error.
    Failed = 2,
    /// The pod could not be connected to (refused, unreachable, connect timeout). An upstream
    /// error and a gateway failure.
    ConnectFailed = 3,
    /// The pod closed or reset the connection before the response ended. An upstream error and
    /// a gateway failure.
    Reset = 4,
    /// The pod did not answer in time. An upstream error and a gateway failure.
    Timeout = 5,
}

impl kvroute_outcome {
    /// Every outcome, in number order (the core's `Outcome::ALL`).
    pub(crate) const ALL: [kvroute_outcome; 6] = [
        kvroute_outcome::Success,
        kvroute_outcome::Cancelled,
        kvroute_outcome::Failed,
        kvroute_outcome::ConnectFailed,
        kvroute_outcome::Reset,
        kvroute_outcome::Timeout,
    ];

    /// The core outcome this code stands for.
    pub const fn core(self) -> Outcome {
        match self {
            kvroute_outcome::Success => Outcome::Success,
            kvroute_outcome::Cancelled => Outcome::Cancelled,
            kvroute_outcome::Failed => Outcome::Failed,
            kvroute_outcome::ConnectFailed => Outcome::ConnectFailed,
            kvroute_outcome::Reset => Outcome::Reset,
            kvroute_outcome::Timeout => Outcome::Timeout,
        }
    }

    /// The outcome with this number; unknown numbers are rejected (`INVALID_PARAMETER`).
    pub fn from_u32(n: u32) -> Result<Outcome, kvroute_status> {
        Self::ALL
            .into_iter()
            .find(|o| *o as u32 == n)
            .map(Self::core)
            .ok_or(kvroute_status::InvalidParameter)
    }
}

/// A change of a pod's health, written by `kvroute_router_report_health_check()` and
/// `kvroute_router_complete_with_event()` to their `event_out` as a `uint32_t`, for logs and
/// metrics. `kvroute_health_event_str()` names it. New events may be added: handle unknown
/// values. `kvroute_router_pod_info()` shows the pod's state after the change.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvroute_health_event {
    /// Nothing changed.
    None = 0,
    /// The pod was ejected: it gets no requests until `kvroute_pod_info.ejected_until_ms`, then
    /// one probe request at a time.
    Ejected = 1,
    /// The pod met an ejection rule, but ejecting it would have taken more of a model's pods
    /// out of service than `kvroute_config_builder_set_max_ejection_percent()` allows (or the
    /// model's last pod in service): it stays in service.
    EjectionSkipped = 2,
    /// The pod is back in service: its probe succeeded, or (after an ejection for gateway
    /// failures) an active check passed after one had failed.
    Readmitted = 3,
    /// Its active checks failed `unhealthy_threshold` times in a row: out of service until
    /// they pass again.
    ChecksFailing = 4,
    /// Its active checks passed `healthy_threshold` times in a row: back in service unless
    /// ejected.
    ChecksPassing = 5,
}

impl kvroute_health_event {
    /// Every event, in number order.
    pub(crate) const ALL: [kvroute_health_event; 6] = [
        kvroute_health_event::None,
        kvroute_health_event::Ejected,
        kvroute_health_event::EjectionSkipped,
        kvroute_health_event::Readmitted,
        kvroute_health_event::ChecksFailing,
        kvroute_health_event::ChecksPassing,
    ];

    /// The label, NUL-terminated.
    pub const fn label(self) -> &'static str {
        match self {
            kvroute_health_event::None => "none\0",
            kvroute_health_event::Ejected => "ejected\0",
            kvroute_health_event::EjectionSkipped => "ejection_skipped\0",
            kvroute_health_event::Readmitted => "readmitted\0",
            kvroute_health_event::ChecksFailing => "checks_failing\0",
            kvroute_health_event::ChecksPassing => "checks_passing\0",
        }
    }

    /// The label without its NUL terminator.
    pub fn as_str(self) -> &'static str {
        self.label().trim_end_matches('\0')
    }
}

impl From<Option<HealthEvent>> for kvroute_health_event {
    fn from(e: Option<HealthEvent>) -> Self {
        match e {
            None => kvroute_health_event::None,
            Some(HealthEvent::Ejected { .. }) => kvroute_health_event::Ejected,
            Some(HealthEvent::EjectionSkipped { .. }) => kvroute_health_event::EjectionSkipped,
            Some(HealthEvent::Readmitted { .. }) => kvroute_health_event::Readmitted,
            Some(HealthEvent::ChecksFailing) => kvroute_health_event::ChecksFailing,
            Some(HealthEvent::ChecksPassing) => kvroute_health_event::ChecksPassing,
        }
    }
}

const UNKNOWN: &str = "KVROUTE_STATUS_UNKNOWN\0";

/// The name of a status code, e.g. `"KVROUTE_STATUS_UNKNOWN_TICKET"`.
///
/// Returns a static NUL-terminated string that the caller must not free; an unknown number
/// gives `"KVROUTE_STATUS_UNKNOWN"`. Never NULL.
#[no_mangle]
pub extern "C" fn kvroute_status_str(status: u32) -> *const c_char {
    ffi_panic_boundary! {
        kvroute_status::from_u32(status).map_or(UNKNOWN, kvroute_status::name).as_ptr().cast()
    }
}

/// The label of a reason code (`kvroute_decision.reason`), e.g. `"prefix_match"`, as AIBrix
/// names its prefix-cache selections.
///
/// Returns a static NUL-terminated string that the caller must not free; an unknown number
/// gives `"unknown"`. Never NULL.
#[no_mangle]
pub extern "C" fn kvroute_reason_str(reason: u32) -> *const c_char {
    ffi_panic_boundary! {
        kvroute_reason::ALL
            .into_iter()
            .find(|r| *r as u32 == reason)
            .map_or("unknown\0", kvroute_reason::label)
            .as_ptr()
            .cast()
    }
}

/// The label of a health event (`kvroute_health_event`), e.g. `"ejected"`.
///
/// Returns a static NUL-terminated string that the caller must not free; an unknown number
/// gives `"unknown"`. Never NULL.
#[no_mangle]
pub extern "C" fn kvroute_health_event_str(event: u32) -> *const c_char {
    ffi_panic_boundary! {
        kvroute_health_event::ALL
            .into_iter()
            .find(|e| *e as u32 == event)
            .map_or("unknown\0", kvroute_health_event::label)
            .as_ptr()
            .cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_unique_and_names_match_the_header_constants() {
        for (i, a) in kvroute_status::ALL.iter().enumerate() {
            assert_eq!(kvroute_status::from_u32(*a as u32), Some(*a));
            for b in &kvroute_status::ALL[i + 1..] {
                assert_ne!(*a as u32, *b as u32);
            }
            assert!(a.name().ends_with('\0') && a.as_str().starts_with("KVROUTE_STATUS_"));
        }
        assert_eq!(kvroute_status::from_u32(3000), None);
    }

    #[test]
    fn reasons_round_trip_through_the_core() {
        for r in kvroute_reason::ALL {
            assert_eq!(kvroute_reason::from(r.core()), r);
            assert_eq!(r.label().trim_end_matches('\0'), r.core().as_str());
        }
    }

    #[test]
    fn outcomes_are_validated() {
        assert_eq!(
            kvroute_outcome::from_u32(kvroute_outcome::Failed as u32),
            Ok(Outcome::Failed)
        );
        for (o, core) in kvroute_outcome::ALL.into_iter().zip(Outcome::ALL) {
            assert_eq!(o.core(), core);
            assert_eq!(o as usize, core.index(), "numbers are the core's positions");
            assert_eq!(kvroute_outcome::from_u32(o as u32), Ok(core));
        }
        assert_eq!(
            kvroute_outcome::from_u32(6),
            Err(kvroute_status::InvalidParameter)
        );
        assert_eq!(
            kvroute_outcome::from_u32(u32::MAX),
            Err(kvroute_status::InvalidParameter)
        );
    }

    #[test]
    fn health_events_are_numbered_and_labelled() {
        for (i, e) in kvroute_health_event::ALL.into_iter().enumerate() {
            assert_eq!(e as usize, i);
            assert!(e.label().ends_with('\0') && !e.as_str().is_empty());
        }
        assert_eq!(
            kvroute_health_event::from(Some(HealthEvent::ChecksFailing)),
            kvroute_health_event::ChecksFailing
        );
        assert_eq!(kvroute_health_event::from(None), kvroute_health_event::None);
    }
}
