//! `kvroute_router`: the thread-safe router handle, routing, completion and timers.

use std::collections::BTreeMap;
use std::ffi::c_char;
use std::sync::atomic::{AtomicBool, Ordering};

use kvroute_core::{
    BlockExtras, BlockHash, Completion, Decision, HashConfig, HealthEvent, PromptTokens,
    RouteRequest, Router, StrategySpec, Ticket, Timestamp, TokenKeyConfig,
};
use parking_lot::{Mutex, MutexGuard};

use crate::config::kvroute_config;
use crate::decision::kvroute_decision;
use crate::handle::{self, Castable, OwnershipBox};
use crate::prompt;
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

    /// Keys `prompt`, parses `strategy` and routes (with the request's output-token limit,
    /// if known, and its endpoint subset, if any), locking only for the routing itself.
    fn route(
        &self,
        model: &str,
        prompt: Prompt<'_>,
        strategy: Option<&str>,
        max_output_tokens: Option<u32>,
        endpoint_subset: Option<&[&str]>,
        now_ms: u64,
    ) -> Result<kvroute_decision, kvroute_status> {
        self.check()?;
        let spec = strategy.map(StrategySpec::parse).transpose()?;
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
        let mut req = RouteRequest::new(model, &hashes).with_max_output_tokens(max_output_tokens);
        if let Some(size) = tokens {
            req = req.with_tokens(size);
        }
        if let Some(spec) = &spec {
            req = req.with_strategy(spec);
        }
        if let Some(subset) = endpoint_subset {
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
    fn token_keys(&self, block_tokens: u32) -> Result<TokenKeyConfig, kvroute_status> {
        TokenKeyConfig::new(block_tokens, self.hash.seed())
            .map_err(|_| kvroute_status::InvalidParameter)
    }
}

/// A request's prompt as a route call received it; [`RouterHandle::route`] turns it into block
/// keys outside the lock.
enum Prompt<'a> {
    /// Bytes, cut into the router's byte blocks (hash scheme v1).
    Bytes(&'a [u8]),
    /// Token ids, keyed in token blocks with the router's seed.
    Tokens {
        ids: &'a [u32],
        keys: TokenKeyConfig,
        extras: BlockExtras<'a>,
    },
    /// Token-block keys the caller computed, of a prompt of this size.
    Keys { keys: &'a [u64], size: PromptTokens },
}

/// A tokenized prompt's length as the core counts it, or `INVALID_PARAMETER` above
/// `UINT32_MAX` tokens.
fn prompt_len(ids: &[u32]) -> Result<u32, kvroute_status> {
    u32::try_from(ids.len()).map_err(|_| kvroute_status::InvalidParameter)
}

/// The addresses of an optional endpoint subset given as `(const char *const *subset, size_t
/// len)`: `None` for `(NULL, 0)`, else a `Vec<&str>` (every entry non-NULL, NUL-terminated
/// UTF-8), or a status returned from the enclosing function.
macro_rules! try_subset {
    ( $data:expr, $len:expr ) => {{
        match try_opt_array!($data, $len) {
            None => None,
            Some(entries) => {
                let mut addresses: Vec<&str> = Vec::with_capacity(entries.len());
                for &entry in entries {
                    addresses.push(try_status!($crate::bytes::utf8(try_cstr!(entry))));
                }
                Some(addresses)
            }
        }
    }};
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

/// Routes one request whose prompt is given as raw bytes (the text the engine will see, as
/// UTF-8; any bytes are accepted and hashed as they are).
///
/// - `(model, model_len)`: the model name, UTF-8, required.
/// - `(prompt, prompt_len)`: the prompt bytes; `(NULL, 0)` is an empty prompt (no blocks: no
///   prefix can match).
/// - `(strategy, strategy_len)`: the request's strategy spec (AIBrix's `routing-strategy`
///   header), or `(NULL, 0)` for the configured default.
/// - `now_ms`: the caller's monotonic clock in ms. Time never goes back for the router: an
///   earlier value is treated as the latest one seen.
///
/// Every input is borrowed for the call only. On success `*decision_out` holds the chosen pod
/// and a ticket: the pod's in-flight count is now one higher until the ticket is passed to
/// `kvroute_router_complete()`. On any error nothing changed and `*decision_out` is untouched:
/// `KVROUTE_STATUS_UNKNOWN_MODEL` (no pod serves the model), `KVROUTE_STATUS_NO_READY_POD`,
/// `KVROUTE_STATUS_INVALID_STRATEGY`, `KVROUTE_STATUS_INVALID_UTF8` (model or strategy),
/// `KVROUTE_STATUS_NULL_PARAMETER`, `KVROUTE_STATUS_POISONED`. The request carries no
/// output-token limit here; `kvroute_router_route_json()` reads one from the body.
#[no_mangle]
pub extern "C" fn kvroute_router_route(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
    prompt: *const u8,
    prompt_len: usize,
    strategy: *const u8,
    strategy_len: usize,
    now_ms: u64,
    decision_out: *mut kvroute_decision,
) -> kvroute_status {
    // The subset call has its own panic boundary.
    kvroute_router_route_subset(
        router,
        model,
        model_len,
        prompt,
        prompt_len,
        strategy,
        strategy_len,
        std::ptr::null(),
        0,
        now_ms,
        decision_out,
    )
}

/// `kvroute_router_route()` restricted to an endpoint subset: only the model's pods whose
/// `ip:port` address (as given to `kvroute_router_add_pod()`) is one of the
/// `endpoint_subset_len` NUL-terminated UTF-8 strings at `endpoint_subset` are candidates (the
/// Gateway API Inference Extension's subset hint, `x-gateway-destination-endpoint-subset`).
/// Unlike the `(ptr, len)` strings elsewhere, the addresses are C strings; the array and the
/// strings are borrowed for the call only.
///
/// `(NULL, 0)` is no subset: the call is `kvroute_router_route()`. `(NULL, n > 0)` or a NULL
/// entry is `KVROUTE_STATUS_NULL_PARAMETER`, an entry that is not UTF-8
/// `KVROUTE_STATUS_INVALID_UTF8`. When no pod of the model in the subset is ready and in
/// service (an empty subset, addresses no pod of the model has, or only unready, ejected or
/// failing pods), the status is `KVROUTE_STATUS_NO_POD_IN_SUBSET` (503) instead of
/// `KVROUTE_STATUS_NO_READY_POD`; an unknown model is still `KVROUTE_STATUS_UNKNOWN_MODEL`.
/// Everything else is as in `kvroute_router_route()`.
#[no_mangle]
pub extern "C" fn kvroute_router_route_subset(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
    prompt: *const u8,
    prompt_len: usize,
    strategy: *const u8,
    strategy_len: usize,
    endpoint_subset: *const *const c_char,
    endpoint_subset_len: usize,
    now_ms: u64,
    decision_out: *mut kvroute_decision,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let out = try_out!(decision_out);
        let model = try_str!(model, model_len);
        let prompt = try_slice!(prompt, prompt_len);
        let strategy = try_opt_str!(strategy, strategy_len);
        let subset = try_subset!(endpoint_subset, endpoint_subset_len);
        let decision = try_status!(r.route(model, Prompt::Bytes(prompt), strategy, None, subset.as_deref(), now_ms));
        handle::set_out(out, decision);
        kvroute_status::Ok
    }
}

/// Routes one request given as its OpenAI-style JSON body (`/v1/chat/completions` or
/// `/v1/completions`). The prompt is extracted as AIBrix v0.7.0 does: the `messages[].content`
/// values joined by one space (string contents unescaped, array or object contents appended as
/// the raw JSON text received), else the `prompt` string, else empty.
///
/// `(model, model_len)` names the model; `(NULL, 0)` takes it from the body's `model` field
/// (`KVROUTE_STATUS_INVALID_BODY` if that is missing). Everything else is as in
/// `kvroute_router_route()`, plus `KVROUTE_STATUS_INVALID_BODY` for a body that is not a JSON
/// object or whose `messages`, `prompt` or `model` field has the wrong type. The body's
/// `max_completion_tokens` (else `max_tokens`), when it is an integer, caps the decode the
/// `least-ttft` model predicts for this request; any other value there is ignored.
#[no_mangle]
pub extern "C" fn kvroute_router_route_json(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
    body: *const u8,
    body_len: usize,
    strategy: *const u8,
    strategy_len: usize,
    now_ms: u64,
    decision_out: *mut kvroute_decision,
) -> kvroute_status {
    // The subset call has its own panic boundary.
    kvroute_router_route_json_subset(
        router,
        model,
        model_len,
        body,
        body_len,
        strategy,
        strategy_len,
        std::ptr::null(),
        0,
        now_ms,
        decision_out,
    )
}

/// `kvroute_router_route_json()` restricted to an endpoint subset, with the subset's rules and
/// statuses as in `kvroute_router_route_subset()`.
#[no_mangle]
pub extern "C" fn kvroute_router_route_json_subset(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
    body: *const u8,
    body_len: usize,
    strategy: *const u8,
    strategy_len: usize,
    endpoint_subset: *const *const c_char,
    endpoint_subset_len: usize,
    now_ms: u64,
    decision_out: *mut kvroute_decision,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let out = try_out!(decision_out);
        let model = try_opt_str!(model, model_len);
        let body = try_slice!(body, body_len);
        let strategy = try_opt_str!(strategy, strategy_len);
        let subset = try_subset!(endpoint_subset, endpoint_subset_len);
        try_status!(r.check());
        let parsed = try_status!(prompt::extract(body));
        let model = match (model, parsed.model.as_deref()) {
            (Some(m), _) | (None, Some(m)) => m,
            (None, None) => return kvroute_status::InvalidBody,
        };
        let prompt = parsed.prompt.as_bytes();
        let limit = parsed.max_output_tokens;
        let decision = try_status!(r.route(model, Prompt::Bytes(prompt), strategy, limit, subset.as_deref(), now_ms));
        handle::set_out(out, decision);
        kvroute_status::Ok
    }
}

/// Routes one request whose prompt is given as token ids: the prompt tokenized with the
/// model's tokenizer and chat template exactly as the engine (vLLM) tokenizes it, for proxies
/// that tokenize requests themselves. The ids are cut into blocks of `block_tokens` tokens and
/// keyed with the router's hash seed, outside the router's lock (`kvroute_token_block_keys()`
/// computes the same keys), so that a block of the prefix index is a block of the engine's KV
/// cache; `least-ttft` then counts the prompt exactly, as `tokens_len` tokens, where the byte
/// calls estimate tokens from bytes.
///
/// - `(model, model_len)`: the model name, UTF-8, required.
/// - `(tokens, tokens_len)`: the prompt's token ids, at most `UINT32_MAX`; `(NULL, 0)` is an
///   empty prompt. A trailing partial block is not keyed (the engine caches full blocks only)
///   but counts in the prompt's length.
/// - `block_tokens`: the engine's KV-cache block size in tokens (vLLM's `--block-size`;
///   `KVROUTE_DEFAULT_BLOCK_TOKENS` is vLLM's default), 1 to `KVROUTE_MAX_BLOCK_TOKENS`, else
///   `KVROUTE_STATUS_INVALID_PARAMETER`. Keys of different block sizes never match: route a
///   model's requests with one size.
/// - `(lora, lora_len)`: the name of the LoRA adapter the request runs with, part of every
///   block's key; `(NULL, 0)` or empty for none. UTF-8.
/// - `(cache_salt, cache_salt_len)`: the request's `cache_salt`, part of the first block's key
///   (and so, through the chain, of every block's); `(NULL, 0)` or empty for none (vLLM
///   ignores an empty salt too). UTF-8.
/// - `(strategy, strategy_len)`: as in `kvroute_router_route()`.
/// - `max_output_tokens`: the request's output-token limit (`max_completion_tokens`, else
///   `max_tokens`), which caps the decode `least-ttft` predicts for it; 0 for none (vLLM
///   rejects a limit of 0, so 0 never names a real one).
/// - `now_ms`: as in `kvroute_router_route()`.
///
/// Every input is borrowed for the call only. On success `*decision_out` holds the chosen pod
/// and a ticket, as in `kvroute_router_route()`; `total_blocks` counts token blocks. On any
/// error nothing changed and `*decision_out` is untouched: the statuses of
/// `kvroute_router_route()` (`KVROUTE_STATUS_INVALID_UTF8` also for `lora` and `cache_salt`),
/// and `KVROUTE_STATUS_INVALID_PARAMETER` for a `block_tokens` out of range or more than
/// `UINT32_MAX` tokens.
#[no_mangle]
pub extern "C" fn kvroute_router_route_tokens(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
    tokens: *const u32,
    tokens_len: usize,
    block_tokens: u32,
    lora: *const u8,
    lora_len: usize,
    cache_salt: *const u8,
    cache_salt_len: usize,
    strategy: *const u8,
    strategy_len: usize,
    max_output_tokens: u32,
    now_ms: u64,
    decision_out: *mut kvroute_decision,
) -> kvroute_status {
    // The subset call has its own panic boundary.
    kvroute_router_route_tokens_subset(
        router,
        model,
        model_len,
        tokens,
        tokens_len,
        block_tokens,
        lora,
        lora_len,
        cache_salt,
        cache_salt_len,
        strategy,
        strategy_len,
        max_output_tokens,
        std::ptr::null(),
        0,
        now_ms,
        decision_out,
    )
}

/// `kvroute_router_route_tokens()` restricted to an endpoint subset, with the subset's rules and
/// statuses as in `kvroute_router_route_subset()`.
#[no_mangle]
pub extern "C" fn kvroute_router_route_tokens_subset(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
    tokens: *const u32,
    tokens_len: usize,
    block_tokens: u32,
    lora: *const u8,
    lora_len: usize,
    cache_salt: *const u8,
    cache_salt_len: usize,
    strategy: *const u8,
    strategy_len: usize,
    max_output_tokens: u32,
    endpoint_subset: *const *const c_char,
    endpoint_subset_len: usize,
    now_ms: u64,
    decision_out: *mut kvroute_decision,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let out = try_out!(decision_out);
        let model = try_str!(model, model_len);
        let ids = try_opt_array!(tokens, tokens_len).unwrap_or_default();
        let extras = BlockExtras {
            lora: try_opt_str!(lora, lora_len),
            cache_salt: try_opt_str!(cache_salt, cache_salt_len),
        };
        let strategy = try_opt_str!(strategy, strategy_len);
        let subset = try_subset!(endpoint_subset, endpoint_subset_len);
        let keys = try_status!(r.token_keys(block_tokens));
        let prompt = Prompt::Tokens { ids, keys, extras };
        let limit = (max_output_tokens != 0).then_some(max_output_tokens);
        let decision = try_status!(r.route(model, prompt, strategy, limit, subset.as_deref(), now_ms));
        handle::set_out(out, decision);
        kvroute_status::Ok
    }
}

/// Routes one request on token-block keys the caller already holds: computed with
/// `kvroute_token_block_keys()` (to route a request again, on a retry, without keying it
/// again, or to use the keys elsewhere too), or by the caller's own implementation of the
/// scheme. `kvroute_router_route_tokens_subset()` is this call after keying.
///
/// - `(keys, keys_len)`: the keys of the prompt's complete blocks, in order; `(NULL, 0)` for a
///   prompt without one. They match what other requests of the model were routed with only
///   when computed the same way: to share the index with `kvroute_router_route_tokens()`, key
///   with the router's hash seed (fix it with `kvroute_config_builder_set_hash_seed()`, else it
///   derives from the seed) and the same `block_tokens`.
/// - `prompt_tokens`: the prompt's length in tokens, its partial last block included;
///   `block_tokens`: the size the keys were cut at, 1 to `KVROUTE_MAX_BLOCK_TOKENS`. Both
///   feed `least-ttft`. `keys_len * block_tokens` above `prompt_tokens` (more blocks than the
///   prompt has) or a `block_tokens` out of range is `KVROUTE_STATUS_INVALID_PARAMETER`.
/// - `(endpoint_subset, endpoint_subset_len)`: the endpoint subset as in
///   `kvroute_router_route_subset()`; `(NULL, 0)` for none.
///
/// The other inputs, the output and the statuses are as in
/// `kvroute_router_route_tokens_subset()`.
#[no_mangle]
pub extern "C" fn kvroute_router_route_keys(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
    keys: *const u64,
    keys_len: usize,
    prompt_tokens: u32,
    block_tokens: u32,
    strategy: *const u8,
    strategy_len: usize,
    max_output_tokens: u32,
    endpoint_subset: *const *const c_char,
    endpoint_subset_len: usize,
    now_ms: u64,
    decision_out: *mut kvroute_decision,
) -> kvroute_status {
    ffi_panic_boundary! {
        let r = try_ref!(router);
        let out = try_out!(decision_out);
        let model = try_str!(model, model_len);
        let keys = try_opt_array!(keys, keys_len).unwrap_or_default();
        let strategy = try_opt_str!(strategy, strategy_len);
        let subset = try_subset!(endpoint_subset, endpoint_subset_len);
        try_status!(r.token_keys(block_tokens));
        if keys.len() as u64 * u64::from(block_tokens) > u64::from(prompt_tokens) {
            return kvroute_status::InvalidParameter;
        }
        let size = PromptTokens { prompt_tokens, block_tokens };
        let limit = (max_output_tokens != 0).then_some(max_output_tokens);
        let decision = try_status!(r.route(model, Prompt::Keys { keys, size }, strategy, limit, subset.as_deref(), now_ms));
        handle::set_out(out, decision);
        kvroute_status::Ok
    }
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
        let State { router, decisions } = &mut *locked;
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
