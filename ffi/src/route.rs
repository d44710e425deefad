//! The route calls of `kvroute_router`: a request's prompt as bytes, as its JSON body, as token
//! ids or as token-block keys, each with the request's options (strategy, output-token limit,
//! endpoint subset, session id). The plain calls delegate to the fullest one of their kind (the
//! `_session` calls, and `_route_keys_session`), which alone holds the panic boundary and the
//! pointer checks; `RouterHandle::route` (`router.rs`) does the routing.

use std::ffi::c_char;

use kvroute_core::{BlockExtras, PromptTokens, TokenKeyConfig};

use crate::decision::kvroute_decision;
use crate::handle;
use crate::prompt;
use crate::router::kvroute_router;
use crate::status::kvroute_status;

/// A request's prompt as a route call received it; `RouterHandle::route` turns it into block
/// keys outside the lock.
pub(crate) enum Prompt<'a> {
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

/// What a route call says of the request besides its model and prompt.
pub(crate) struct RouteOptions<'a> {
    /// The request's strategy spec; `None` for the configured default.
    pub(crate) strategy: Option<&'a str>,
    /// The request's output-token limit, for `least-ttft`.
    pub(crate) max_output_tokens: Option<u32>,
    /// The endpoint subset's `ip:port` addresses; `None` for no subset.
    pub(crate) endpoint_subset: Option<&'a [&'a str]>,
    /// The request's session id, for `session-affinity`; `None` for none.
    pub(crate) session_id: Option<&'a str>,
}

/// A tokenized prompt's length as the core counts it, or `INVALID_PARAMETER` above
/// `UINT32_MAX` tokens.
pub(crate) fn prompt_len(ids: &[u32]) -> Result<u32, kvroute_status> {
    u32::try_from(ids.len()).map_err(|_| kvroute_status::InvalidParameter)
}

/// The session id the core gets from the bytes a route call received: `None` for none (empty)
/// and for bytes that are not UTF-8 (they cannot be base64, so they name no pod; the Envoy
/// shells take such a header as absent too); any other text as it is, for the core to decode.
pub(crate) fn session_id(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok().filter(|s| !s.is_empty())
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
/// output-token limit here; `kvroute_router_route_json()` reads one from the body. It carries
/// no session id either: with `session-affinity`, route with `kvroute_router_route_session()`.
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
    // The session call has its own panic boundary.
    kvroute_router_route_session(
        router,
        model,
        model_len,
        prompt,
        prompt_len,
        strategy,
        strategy_len,
        std::ptr::null(),
        0,
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
    // The session call has its own panic boundary.
    kvroute_router_route_session(
        router,
        model,
        model_len,
        prompt,
        prompt_len,
        strategy,
        strategy_len,
        endpoint_subset,
        endpoint_subset_len,
        std::ptr::null(),
        0,
        now_ms,
        decision_out,
    )
}

/// `kvroute_router_route_subset()` with the request's session id, for AIBrix's
/// `session-affinity` strategy. `(session_id, session_id_len)` is the value of the request's
/// `x-session-id` header: the session id a previous response carried, read from its decision
/// with `kvroute_router_session_id()`.
///
/// When the strategy spec (the request's, or the configured default) includes
/// `session-affinity`, a session id naming a candidate (a pod of the model that is ready, in
/// service and, with a subset, in the subset) sends the request to it
/// (`KVROUTE_REASON_SESSION_AFFINITY`; in a weighted spec that pod scores 1 for
/// session-affinity and the others 0). A request without a session id, or with one naming no
/// candidate (its pod was removed, is not ready, is ejected or failing its checks, is outside
/// the subset, or the id is not the base64 of an address), goes to a uniformly random
/// candidate (`KVROUTE_REASON_RANDOM`) under `session-affinity` alone. Either way the decision
/// carries the chosen pod's session id (`kvroute_router_session_id()`), which the caller
/// returns to the client in the response's `x-session-id` header so that its next request
/// comes back to the same pod. Under `least-ttft` the session id does not pick the pod: the
/// TTFT model counts the pod it names as holding the previous turn's answer (which the prefix
/// index never saw), and the decision carries the chosen pod's session id as well. Other
/// strategies ignore it.
///
/// A session id is stateless, AIBrix's encoding: the standard base64 (padded) of the pod's
/// `ip:port` address as given to `kvroute_router_add_pod()`, so whichever pod of the model has
/// that address takes the session. It is decoded as Go's `base64.StdEncoding` does (`\r` and
/// `\n` ignored), as given: no whitespace is trimmed.
///
/// The session id is borrowed for the call only. `(NULL, 0)` and an empty id are no session
/// id; `(NULL, n > 0)` is `KVROUTE_STATUS_NULL_PARAMETER`. Any other bytes are accepted and are
/// never an error (a client's bad header must not fail its request): bytes that are not UTF-8
/// or not base64 name no pod. Everything else is as in `kvroute_router_route_subset()`.
#[no_mangle]
pub extern "C" fn kvroute_router_route_session(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
    prompt: *const u8,
    prompt_len: usize,
    strategy: *const u8,
    strategy_len: usize,
    endpoint_subset: *const *const c_char,
    endpoint_subset_len: usize,
    session_id: *const u8,
    session_id_len: usize,
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
        let options = RouteOptions {
            strategy,
            max_output_tokens: None,
            endpoint_subset: subset.as_deref(),
            session_id: self::session_id(try_slice!(session_id, session_id_len)),
        };
        let decision = try_status!(r.route(model, Prompt::Bytes(prompt), &options, now_ms));
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
    // The session call has its own panic boundary.
    kvroute_router_route_json_session(
        router,
        model,
        model_len,
        body,
        body_len,
        strategy,
        strategy_len,
        std::ptr::null(),
        0,
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
    // The session call has its own panic boundary.
    kvroute_router_route_json_session(
        router,
        model,
        model_len,
        body,
        body_len,
        strategy,
        strategy_len,
        endpoint_subset,
        endpoint_subset_len,
        std::ptr::null(),
        0,
        now_ms,
        decision_out,
    )
}

/// `kvroute_router_route_json_subset()` with the request's session id (its `x-session-id`
/// header, which is not part of the body), with the session id's rules as in
/// `kvroute_router_route_session()`.
#[no_mangle]
pub extern "C" fn kvroute_router_route_json_session(
    router: *mut kvroute_router,
    model: *const u8,
    model_len: usize,
    body: *const u8,
    body_len: usize,
    strategy: *const u8,
    strategy_len: usize,
    endpoint_subset: *const *const c_char,
    endpoint_subset_len: usize,
    session_id: *const u8,
    session_id_len: usize,
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
        let session_id = self::session_id(try_slice!(session_id, session_id_len));
        try_status!(r.check());
        let parsed = try_status!(prompt::extract(body));
        let model = match (model, parsed.model.as_deref()) {
            (Some(m), _) | (None, Some(m)) => m,
            (None, None) => return kvroute_status::InvalidBody,
        };
        let options = RouteOptions {
            strategy,
            max_output_tokens: parsed.max_output_tokens,
            endpoint_subset: subset.as_deref(),
            session_id,
        };
        let prompt = Prompt::Bytes(parsed.prompt.as_bytes());
        let decision = try_status!(r.route(model, prompt, &options, now_ms));
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
    // The session call has its own panic boundary.
    kvroute_router_route_tokens_session(
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
    // The session call has its own panic boundary.
    kvroute_router_route_tokens_session(
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
        endpoint_subset,
        endpoint_subset_len,
        std::ptr::null(),
        0,
        now_ms,
        decision_out,
    )
}

/// `kvroute_router_route_tokens_subset()` with the request's session id, with the session id's
/// rules as in `kvroute_router_route_session()`.
#[no_mangle]
pub extern "C" fn kvroute_router_route_tokens_session(
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
    session_id: *const u8,
    session_id_len: usize,
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
        let options = RouteOptions {
            strategy,
            max_output_tokens: (max_output_tokens != 0).then_some(max_output_tokens),
            endpoint_subset: subset.as_deref(),
            session_id: self::session_id(try_slice!(session_id, session_id_len)),
        };
        let keys = try_status!(r.token_keys(block_tokens));
        let prompt = Prompt::Tokens { ids, keys, extras };
        let decision = try_status!(r.route(model, prompt, &options, now_ms));
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
    // The session call has its own panic boundary.
    kvroute_router_route_keys_session(
        router,
        model,
        model_len,
        keys,
        keys_len,
        prompt_tokens,
        block_tokens,
        strategy,
        strategy_len,
        max_output_tokens,
        endpoint_subset,
        endpoint_subset_len,
        std::ptr::null(),
        0,
        now_ms,
        decision_out,
    )
}

/// `kvroute_router_route_keys()` with the request's session id, with the session id's rules as
/// in `kvroute_router_route_session()`.
#[no_mangle]
pub extern "C" fn kvroute_router_route_keys_session(
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
    session_id: *const u8,
    session_id_len: usize,
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
        let options = RouteOptions {
            strategy,
            max_output_tokens: (max_output_tokens != 0).then_some(max_output_tokens),
            endpoint_subset: subset.as_deref(),
            session_id: self::session_id(try_slice!(session_id, session_id_len)),
        };
        try_status!(r.token_keys(block_tokens));
        if keys.len() as u64 * u64::from(block_tokens) > u64::from(prompt_tokens) {
            return kvroute_status::InvalidParameter;
        }
        let size = PromptTokens { prompt_tokens, block_tokens };
        let decision = try_status!(r.route(model, Prompt::Keys { keys, size }, &options, now_ms));
        handle::set_out(out, decision);
        kvroute_status::Ok
    }
}
