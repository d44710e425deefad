//! The status codes every fallible function returns, and the other enums of the C API.
//!
//! Numbers are explicit and stable: a number is never reused. A retired variant stays here as a
//! comment marked "Reserved".

use std::ffi::c_char;

use kvroute_core::{
    ConfigError, Outcome, Reason, RegistryError, RouteError, StrategyError, TicketError,
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
    /// The model is known but none of its pods is ready (AIBrix answers 503).
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
    /// The configuration is invalid (zero capacity or TTL, bad block size, bad σ factor).
    InvalidConfig = 14,
    /// The library panicked; the call had no effect unless it held the router lock, in which
    /// case the router is now poisoned. This is a bug in kvroute: please report it.
    Panic = 100,
    /// An earlier call panicked while holding this router's lock, so its state can no longer be
    /// trusted. Every later call on the router returns this; free it and build a new one.
    Poisoned = 101,
}

impl kvroute_status {
    /// Every status, in number order.
    pub const ALL: [kvroute_status; 17] = [
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
}

impl kvroute_reason {
    /// Every reason, in number order.
    pub const ALL: [kvroute_reason; 8] = [
        kvroute_reason::Random,
        kvroute_reason::LeastRequest,
        kvroute_reason::PrefixMatch,
        kvroute_reason::PrefixMatchSkipped,
        kvroute_reason::LeastRequestFallback,
        kvroute_reason::Weighted,
        kvroute_reason::LeastTtft,
        kvroute_reason::LeastTtftProbe,
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
        }
    }
}

/// How a request ended, passed to `kvroute_router_complete()` as a `uint32_t`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvroute_outcome {
    /// The response finished normally.
    Success = 0,
    /// The client went away or the stream was reset before the response finished.
    Cancelled = 1,
    /// The upstream answered with an error or could not be reached.
    Failed = 2,
}

impl kvroute_outcome {
    /// The outcome with this number; unknown numbers are rejected (`INVALID_PARAMETER`).
    pub fn from_u32(n: u32) -> Result<Outcome, kvroute_status> {
        match n {
            0 => Ok(Outcome::Success),
            1 => Ok(Outcome::Cancelled),
            2 => Ok(Outcome::Failed),
            _ => Err(kvroute_status::InvalidParameter),
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
        assert_eq!(
            kvroute_outcome::from_u32(3),
            Err(kvroute_status::InvalidParameter)
        );
    }
}
