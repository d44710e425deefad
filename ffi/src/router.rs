//! `kvroute_router`: the thread-safe router handle, completion and timers (the route calls are
//! in `route.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use kvroute_core::{
    BlockHash, Completion, Decision, HashConfig, HealthEvent, PromptTokens, RouteRequest, Router,
    StrategySpec, Ticket, Timestamp, TokenKeyConfig,
};
use parking_lot::{Mutex, MutexGuard};

use crate::config::kvroute_config;
use crate::decision::kvroute_decision;
use crate::handle::{self, Castable, OwnershipBox};
use crate::route::{prompt_len, Prompt, RouteOptions};
use crate::status::kvroute_status;

/// A pod id, issued by `kvroute_router_add_pod()` / `kvroute_router_upsert_pod()`. Ids are never
/// reused: a pod removed and added again under the same name gets a new id.
pub type kvroute_pod_id = u32;

/// An in-flight ticket, issued by a route call. Complete it exactly once with
/// `kvroute_router_complete()`.
pub type kvroute_ticket = u64;

/// The router: pods, the prefix index, in-flight counts and open tickets.
///
/// Under the hood this is a `Box` holding a `kvroute_core::Router` behind a mutex, so one
/// router may be used from many threads at once (prompt hashing and JSON parsing happen outside
/// the lock). Create it with `kvroute_router_new()` and free it once with
/// `kvroute_router_free()`, after every other call on it has returned.
///
/// If the library ever panics while holding the router's lock, the router is poisoned: every
/// later call on it returns `KVROUTE_STATUS_POISONED`. Free it and build a new one.
pub struct kvroute_router {
    _private: [u8; 0],
}

impl Castable for kvroute_router {
    type Ownership = OwnershipBox;
    type RustType = RouterHandle;
}

/// What a `kvroute_router` pointer points at.
pub struct RouterHandle {
    // Fixed at creation (the router is never reconfigured through the C API), so prompts are
    // hashed without taking the lock.
    hash: HashConfig,
    poisoned: AtomicBool,
    state: Mutex<State>,
}

/// Everything behind the lock.
pub(crate) struct State {
    pub(crate) router: Router,
    /// The decisions of open tickets, for `kvroute_router_explain()`. Entries leave on
    /// completion, or at the first tick after the router expired their ticket.
    pub(crate) decisions: BTreeMap<u64, Decision>,
    /// The engines' KV cache sizes in tokens, by pod id, added to their snapshots
    /// (`kvroute_router_set_engine_kv_cache_tokens()`).
    pub(crate) kv_cache_tokens: BTreeMap<u32, u64>,
}

/// The router, locked. Dropping it during a panic poisons the handle.
pub(crate) struct Locked<'a> {
    guard: MutexGuard<'a, State>,
    poisoned: &'a AtomicBool,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.poisoned.store(true, Ordering::Release);
        }
    }
}

impl core::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl core::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.guard
    }
}

impl RouterHandle {
    /// A handle around `router`.
    pub fn new(router: Router) -> RouterHandle {
        RouterHandle {
            hash: router.hash_config(),
            poisoned: AtomicBool::new(false),
            state: Mutex::new(State {
                router,
                decisions: BTreeMap::new(),
                kv_cache_tokens: BTreeMap::new(),
            }),
        }
    }

    /// Locks the router, or `POISONED`.
    pub(crate) fn lock(&self) -> Result<Locked<'_>, kvroute_status> {
        self.check()?;
        let guard = self.state.lock();
        // A panic may have poisoned the router while this thread waited for the lock.
        self.check()?;
        Ok(Locked {
            guard,
            poisoned: &self.poisoned,
        })
    }

    /// `POISONED` if a panic poisoned the router.
    pub(crate) fn check(&self) -> Result<(), kvroute_status> {
        if self.poisoned.load(Ordering::Acquire) {
            Err(kvroute_status::Poisoned)
        } else {
            Ok(())
        }
    }

    /// Completes a ticket and forgets its explanation; returns what the outcome changed in the
    /// pod's health.
    pub(crate) fn complete(
        &self,
        ticket: Ticket,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Option<HealthEvent>, kvroute_status> {
        let mut locked = self.lock()?;
        locked.decisions.remove(&ticket.as_u64());
        let now = Timestamp::from_millis(now_ms);
        Ok(locked.router.complete(ticket, completion, now)?.health)
    }

    /// Keys `prompt`, parses the strategy and routes with the request's `options`, locking
    /// only for the routing itself.
    pub(crate) fn route(
        &self,
        model: &str,
        prompt: Prompt<'_>,
        options: &RouteOptions<'_>,
        now_ms: u64,
    ) -> Result<kvroute_decision, kvroute_status> {
        self.check()?;
        let spec = options.strategy.map(StrategySpec::parse).transpose()?;
        let (hashes, tokens) = match prompt {
            Prompt::Bytes(bytes) => (self.hash.hashes(bytes), None),
            Prompt::Tokens { ids, keys, extras } => {
                let size = PromptTokens {
                    prompt_tokens: prompt_len(ids)?,
                    block_tokens: keys.block_tokens(),
                };
                (keys.keys(ids, extras), Some(size))
            }
            Prompt::Keys { keys, size } => {
                (keys.iter().copied().map(BlockHash).collect(), Some(size))
            }
        };
        let mut req = RouteRequest::new(model, &hashes)
            .with_max_output_tokens(options.max_output_tokens)
            .with_session_id(options.session_id);
        if let Some(size) = tokens {
            req = req.with_tokens(size);
        }
        if let Some(spec) = &spec {
            req = req.with_strategy(spec);
        }
        if let Some(subset) = options.endpoint_subset {
            req = req.with_endpoint_subset(subset);
        }
        let mut locked = self.lock()?;
        let decision = locked.router.route(req, Timestamp::from_millis(now_ms))?;
        let out = kvroute_decision::from(&decision);
        locked.decisions.insert(out.ticket, decision);
        Ok(out)
    }

    /// What token keying needs for blocks of `block_tokens` tokens: the router's hash seed (the
    /// core's `Router::token_key_config`, without the lock), or `INVALID_PARAMETER`.
    pub(crate) fn token_keys(&self, block_tokens: u32) -> Result<TokenKeyConfig, kvroute_status> {
        TokenKeyConfig::new(block_tokens, self.hash.seed())
            .map_err(|_| kvroute_status::InvalidParameter)
    }
}

/// Builds a router with a copy of `config` (the caller may free the config right away). On
/// success `*router_out` is a new router the caller owns and frees with `kvroute_router_free()`.
///
/// Returns `KVROUTE_STATUS_NULL_PARAMETER` if either pointer is NULL.
#[no_mangle]
pub extern "C" fn kvroute_router_new(
    config: *const kvroute_config,
    router_out: *mut *mut kvroute_router,
) -> kvroute_status {
    ffi_panic_boundary! {
        let config = try_ref!(config);
        let out = try_out!(router_out);
        let router = try_status!(Router::new(config.clone()));
        handle::set_out(out, handle::to_boxed_mut_ptr::<kvroute_router>(RouterHandle::new(router)));
        kvroute_status::Ok
    }
}

/// Frees a router and everything it holds; open tickets are dropped. NULL is a no-op. No other
/// call on this router may be running or made afterwards.
#[no_mangle]
pub extern "C" fn kvroute_router_free(router: *mut kvroute_router) {
    ffi_panic_boundary! { free_box!(router) }
}

/// Releases a ticket's in-flight slot: call it exactly once per successful route, when the
/// response ends, with how it ended (a `kvroute_outcome` as a `uint32_t`:
/// `KVROUTE_OUTCOME_SUCCESS`, `_CANCELLED`, `_FAILED`, `_CONNECT_FAILED`, `_RESET` or
/// `_TIMEOUT`) and the caller's clock. The outcome feeds the pod's health (see
/// `kvroute_outcome`): a cancel never counts against the pod, failures in a row eject it as the
/// health settings say. `kvroute_router_complete_with_event()` also says what changed.
///
/// Returns `KVROUTE_STATUS_UNKNOWN_TICKET` for a ticket this router never issued,
/// `KVROUTE_STATUS_TICKET_NOT_OPEN` for one already completed or expired (nothing changes in
/// either case), `KVROUTE_STATUS_INVALID_PARAMETER` for an unknown outcome number. Completing a
/// ticket whose pod was removed meanwhile succeeds (and changes no pod's health).
#[no_mangle]
pub extern "C" fn kvroute_router_complete(
    router: *mut kvroute_router,
    ticket: kvroute_ticket,
    outcome: u32,
    now_ms: u64,
) -> kvroute_status {
    // The event call has its own panic boundary.
    crate::feedback::kvroute_router_complete_with_event(
        router,
        ticket,
        outcome,
        std::ptr::null(),
        now_ms,
        std::ptr::null_mut(),
    )
}

/// Does the time-driven work due at `now_ms`: drops prefix-index entries past their TTL,
/// expires tickets older than the ticket TTL (releasing their in-flight slots; an expired probe
/// lets the next request probe), and moves pods whose ejection is over to probing. Call it when
/// `kvroute_router_next_deadline()` says, or periodically; calling it early is harmless. (A pod
/// whose ejection is over takes its probe request even before the tick.)
#[no_mangle]
pub extern "C" fn kvroute_router_tick(router: *mut kvroute_router, now_ms: u64) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let mut locked = try_status!(r.lock());
        locked.router.handle_timeout(Timestamp::from_millis(now_ms));
        let State {
            router, decisions, ..
        } = &mut *locked;
        decisions.retain(|&ticket, _| router.is_open(Ticket::from_u64(ticket)));
        kvroute_status::Ok
    }
}

/// When `kvroute_router_tick()` next has work (an index or ticket expiry, or the end of a pod's
/// ejection). On success `*has_deadline_out` says whether there is any, and `*deadline_ms_out`
/// is that time on the caller's clock (0 when there is none). Re-read it after every route,
/// complete, tick or pod removal: routing can move it earlier (and a completion can eject a
/// pod).
#[no_mangle]
pub extern "C" fn kvroute_router_next_deadline(
    router: *const kvroute_router,
    has_deadline_out: *mut bool,
    deadline_ms_out: *mut u64,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let has = try_out!(has_deadline_out);
        let at = try_out!(deadline_ms_out);
        let deadline = try_status!(r.lock()).router.poll_timeout();
        handle::set_out(has, deadline.is_some());
        handle::set_out(at, deadline.map_or(0, Timestamp::as_millis));
        kvroute_status::Ok
    }
}

#[cfg(test)]
pub(crate) mod test_hooks {
    use super::*;

    /// Panics while holding the router's lock, inside the panic boundary, as an export would.
    pub(crate) extern "C" fn panic_while_locked(router: *mut kvroute_router) -> kvroute_status {
        ffi_panic_boundary! {
            let r = try_ref!(router);
            let _locked = try_status!(r.lock());
            panic!("test hook: panic while the router is locked");
        }
    }

    /// Panics outside the lock.
    pub(crate) extern "C" fn panic_unlocked(router: *mut kvroute_router) -> kvroute_status {
        ffi_panic_boundary! {
            let _r = try_ref!(router);
            panic!("test hook: panic outside the lock");
        }
    }
}
