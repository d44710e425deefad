//! Raw declarations of the part of Envoy 1.40's dynamic-module C ABI (`abi.h`, ABI `v0.2.0`) that
//! kvroute uses: the types, the callbacks Envoy exports (`envoy_dynamic_module_callback_*`) and the
//! signatures of the hooks the module must export (`envoy_dynamic_module_on_*`).
//!
//! Written for kvroute from the facts of the header (names, argument order, types, enum values)
//! and checked against the Envoy 1.40.0 binary: its exported symbols, its disassembly, and probe
//! modules loaded into it. The behaviour stated in the docs below was measured that way.
//!
//! Conventions. A C enum is 4 bytes; it is declared here as a `#[repr(transparent)]` wrapper of
//! `u32` with one associated constant per value, so an unknown value coming from Envoy is not
//! undefined behaviour. `size_t` is `usize`, C `bool` is `bool`, `const char*` is
//! `*const c_char`. Buffers are passed by value as a pointer and a length; no string is
//! NUL-terminated and none is guaranteed UTF-8.
//!
//! Linking: the callbacks are resolved from the Envoy process when Envoy `dlopen`s the module;
//! no library is linked here. A test binary that calls one of them will not link.

// A declaration table: not every item is used yet, and the parent module decides its visibility.
#![allow(dead_code, unreachable_pub)]

use std::ffi::{c_char, c_void, CStr};

/// The ABI version string Envoy 1.40.0 expects from `envoy_dynamic_module_on_program_init`
/// (`ENVOY_DYNAMIC_MODULES_ABI_VERSION`), as [`ProgramInitHook`] returns it (NUL-terminated,
/// `'static`, so valid past the call as the header requires). Envoy compares it with its own and
/// only logs: on a match `Dynamic module ABI version v0.2.0 matched.` (info), on a mismatch
/// `Dynamic module ABI version X is deprecated. Please recompile ...` (warning), and loads the
/// module either way. Only a NULL return fails the load.
pub const ABI_VERSION_CSTR: &CStr = c"v0.2.0";

/// `ABI_VERSION_CSTR` without the NUL: `"v0.2.0"`.
pub const ABI_VERSION: &str = match ABI_VERSION_CSTR.to_str() {
    Ok(version) => version,
    Err(_) => panic!("the ABI version is ASCII"),
};

// ---- Opaque pointers

/// `envoy_dynamic_module_type_http_filter_config_envoy_ptr`: Envoy's filter configuration object.
/// Owned by Envoy; valid from [`HttpFilterConfigNewHook`] until [`HttpFilterConfigDestroyHook`].
pub type HttpFilterConfigEnvoyPtr = *mut c_void;

/// `envoy_dynamic_module_type_http_filter_config_module_ptr` (a `const void*` in C): the module's
/// configuration, returned by [`HttpFilterConfigNewHook`]. Owned by the module, which may free it
/// in [`HttpFilterConfigDestroyHook`].
pub type HttpFilterConfigModulePtr = *const c_void;

/// `envoy_dynamic_module_type_http_filter_envoy_ptr`: Envoy's filter for one HTTP stream. Owned by
/// Envoy; valid until [`HttpFilterDestroyHook`]. Callbacks made with it during that hook are no-ops
/// (the filter is already detached from the stream).
pub type HttpFilterEnvoyPtr = *mut c_void;

/// `envoy_dynamic_module_type_http_filter_module_ptr` (a `const void*` in C): the module's filter
/// for one stream, returned by [`HttpFilterNewHook`]. Owned by the module, which may free it in
/// [`HttpFilterDestroyHook`].
pub type HttpFilterModulePtr = *const c_void;

// ---- Buffers and headers

/// `envoy_dynamic_module_type_envoy_buffer`: bytes owned by Envoy. How long they stay valid is
/// stated by the hook or callback that hands them out. `ptr` may be null when `length` is 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyBuffer {
    /// First byte (`envoy_dynamic_module_type_buffer_envoy_ptr`, a `const char*`).
    pub ptr: *const c_char,
    /// Number of bytes.
    pub length: usize,
}

/// `envoy_dynamic_module_type_module_buffer`: bytes owned by the module, passed to a callback,
/// which reads them only during the call. `ptr` may be null when `length` is 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleBuffer {
    /// First byte (`envoy_dynamic_module_type_buffer_module_ptr`, a `const char*`).
    pub ptr: *const c_char,
    /// Number of bytes.
    pub length: usize,
}

/// `envoy_dynamic_module_type_module_http_header`: one header owned by the module, as passed in
/// an array to [`envoy_dynamic_module_callback_http_send_response`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleHttpHeader {
    /// Name bytes.
    pub key_ptr: *const c_char,
    /// Name length.
    pub key_length: usize,
    /// Value bytes.
    pub value_ptr: *const c_char,
    /// Value length.
    pub value_length: usize,
}

/// `envoy_dynamic_module_type_envoy_http_header`: one header owned by Envoy, as filled in by
/// [`envoy_dynamic_module_callback_http_get_headers`] and passed to the callout hooks.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyHttpHeader {
    /// Name bytes.
    pub key_ptr: *const c_char,
    /// Name length.
    pub key_length: usize,
    /// Value bytes.
    pub value_ptr: *const c_char,
    /// Value length.
    pub value_length: usize,
}

// ---- Enums

/// `envoy_dynamic_module_type_http_header_type`: which header map a header callback works on.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpHeaderType(pub u32);

impl HttpHeaderType {
    /// Request headers (including pseudo-headers `:path`, `:method`, `:authority`; `host` reads
    /// the same value as `:authority`).
    pub const REQUEST_HEADER: Self = Self(0);
    /// Request trailers.
    pub const REQUEST_TRAILER: Self = Self(1);
    /// Response headers (including `:status`).
    pub const RESPONSE_HEADER: Self = Self(2);
    /// Response trailers.
    pub const RESPONSE_TRAILER: Self = Self(3);
}

/// `envoy_dynamic_module_type_http_body_type`: which body the body callbacks read.
///
/// "Received" is the data of the current body hook only (empty outside body hooks); "buffered" is
/// what Envoy has kept because this filter returned [`BodyStatus::STOP_ITERATION_AND_BUFFER`]
/// earlier. The data received in a hook joins the buffer only after the hook returns, so at
/// `end_of_stream` the whole body is buffered followed by received. Measured: over HTTP/1.1 the
/// `end_of_stream` call usually carries no data (all of it is buffered); over HTTP/2 a one-frame
/// body arrives as received with `end_of_stream` and nothing buffered.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpBodyType(pub u32);

impl HttpBodyType {
    /// The request data of the current `request_body` hook.
    pub const RECEIVED_REQUEST_BODY: Self = Self(0);
    /// The request data buffered so far.
    pub const BUFFERED_REQUEST_BODY: Self = Self(1);
    /// The response data of the current `response_body` hook.
    pub const RECEIVED_RESPONSE_BODY: Self = Self(2);
    /// The response data buffered so far.
    pub const BUFFERED_RESPONSE_BODY: Self = Self(3);
}

/// `envoy_dynamic_module_type_attribute_id`: only the values kvroute uses, each the position of
/// the attribute in the header's enum and each read back from a running Envoy 1.40.0.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttributeId(pub u32);

impl AttributeId {
    /// `request.path` (string): the `:path` header.
    pub const REQUEST_PATH: Self = Self(0);
    /// `request.method` (string).
    pub const REQUEST_METHOD: Self = Self(4);
    /// `request.id` (string): the `x-request-id` Envoy generated or kept.
    pub const REQUEST_ID: Self = Self(9);
    /// `response.code` (int); unavailable (the getter returns false) before a response exists.
    pub const RESPONSE_CODE: Self = Self(15);
    /// `response.code_details` (string), e.g. `via_upstream`, or the `details` of a local reply.
    pub const RESPONSE_CODE_DETAILS: Self = Self(16);
    /// `source.address` (string), `ip:port` of the downstream peer.
    pub const SOURCE_ADDRESS: Self = Self(24);
    /// `upstream.address` (string), `ip:port` of the upstream host chosen; unavailable before the
    /// router has chosen one.
    pub const UPSTREAM_ADDRESS: Self = Self(41);
    /// `upstream.port` (int).
    pub const UPSTREAM_PORT: Self = Self(42);
}

/// `envoy_dynamic_module_type_log_level`, for the log callbacks (Envoy's own levels, in order).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogLevel(pub u32);

impl LogLevel {
    /// trace
    pub const TRACE: Self = Self(0);
    /// debug
    pub const DEBUG: Self = Self(1);
    /// info
    pub const INFO: Self = Self(2);
    /// warning
    pub const WARN: Self = Self(3);
    /// error
    pub const ERROR: Self = Self(4);
    /// critical
    pub const CRITICAL: Self = Self(5);
    /// off
    pub const OFF: Self = Self(6);
}

/// What a headers hook returns: `envoy_dynamic_module_type_on_http_filter_request_headers_status`
/// and `..._response_headers_status`, which have the same values (Envoy's `FilterHeadersStatus`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadersStatus(pub u32);

impl HeadersStatus {
    /// Pass the headers on to the next filter.
    pub const CONTINUE: Self = Self(0);
    /// Hold the headers; body hooks of this filter still run. Needed to make a routing decision on
    /// the request body: headers that continue reach the router, which picks the upstream host at
    /// once, so a later `set_upstream_override_host` is ignored.
    pub const STOP_ITERATION: Self = Self(1);
    /// Continue, but do not end the stream even if the headers ended it.
    pub const CONTINUE_AND_DONT_END_STREAM: Self = Self(2);
    /// Hold headers, body and trailers and buffer the body without calling this filter's body
    /// hooks (measured: the request body hook never ran) until `continue_decoding`/`_encoding`.
    pub const STOP_ALL_ITERATION_AND_BUFFER: Self = Self(3);
    /// Like `STOP_ALL_ITERATION_AND_BUFFER`, with watermark flow control instead of a limit.
    pub const STOP_ALL_ITERATION_AND_WATERMARK: Self = Self(4);
}

/// What a body hook returns: `envoy_dynamic_module_type_on_http_filter_request_body_status` and
/// `..._response_body_status`, which have the same values (Envoy's `FilterDataStatus`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyStatus(pub u32);

impl BodyStatus {
    /// Pass the data (and held headers) on.
    pub const CONTINUE: Self = Self(0);
    /// Keep the data in the buffer ([`HttpBodyType::BUFFERED_REQUEST_BODY`]) and wait for more.
    /// A request buffer over the listener's buffer limit ends the stream with 413
    /// `request_payload_too_large`.
    pub const STOP_ITERATION_AND_BUFFER: Self = Self(1);
    /// Keep the data, with watermark flow control instead of a limit.
    pub const STOP_ITERATION_AND_WATERMARK: Self = Self(2);
    /// Hold iteration without buffering the data.
    pub const STOP_ITERATION_NO_BUFFER: Self = Self(3);
}

/// What a trailers hook returns: `envoy_dynamic_module_type_on_http_filter_request_trailers_status`
/// and `..._response_trailers_status` (Envoy's `FilterTrailersStatus`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrailersStatus(pub u32);

impl TrailersStatus {
    /// Pass the trailers on.
    pub const CONTINUE: Self = Self(0);
    /// Hold them.
    pub const STOP_ITERATION: Self = Self(1);
}

/// `envoy_dynamic_module_type_on_http_filter_local_reply_status`, returned by [`LocalReplyHook`].
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalReplyStatus(pub u32);

impl LocalReplyStatus {
    /// Send the local reply.
    pub const CONTINUE: Self = Self(0);
    /// Reset the stream instead of sending it.
    pub const CONTINUE_AND_RESET_STREAM: Self = Self(1);
}

/// `envoy_dynamic_module_type_http_callout_result`, passed to [`HttpCalloutDoneHook`]: 0 Success,
/// 1 Reset, 2 ExceedResponseBufferLimit.
pub type HttpCalloutResult = u32;

/// `envoy_dynamic_module_type_http_stream_reset_reason`, passed to [`HttpStreamResetHook`]:
/// 0 ConnectionFailure, 1 ConnectionTermination, 2 LocalReset, 3 LocalRefusedStreamReset,
/// 4 Overflow, 5 RemoteReset, 6 RemoteRefusedStreamReset, 7 ProtocolError.
pub type HttpStreamResetReason = u32;

// ---- Hooks the module exports (`#[no_mangle] pub unsafe extern "C" fn envoy_dynamic_module_on_*`).
// Check an implementation with `const _: sys::XxxHook = our_fn;`.
// Envoy 1.40 refuses the filter configuration ("Failed to resolve symbol ...") if any hook below
// is missing, except `local_reply`, which is optional.

/// `envoy_dynamic_module_on_program_init`: called once on the main thread when the module is
/// loaded, before any configuration. Return [`ABI_VERSION_CSTR`]; the string must stay valid
/// until the call returns. NULL fails the load (`Failed to initialize dynamic module`).
pub type ProgramInitHook = unsafe extern "C" fn() -> *const c_char;

/// `envoy_dynamic_module_on_http_filter_config_new`: main thread, once per filter configuration
/// (per listener/filter chain using it). `name` is `filter_name`, `config` the bytes of
/// `filter_config` (for a `google.protobuf.StringValue`, the string itself). Both are owned by
/// Envoy and valid only during the call (measured: `config` points into the caller's stack), so
/// copy them. Return NULL to reject the configuration (Envoy fails the config load with `Failed to
/// initialize dynamic module`).
pub type HttpFilterConfigNewHook = unsafe extern "C" fn(
    config_envoy: HttpFilterConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> HttpFilterConfigModulePtr;

/// `envoy_dynamic_module_on_http_filter_config_destroy`: main thread, when Envoy drops the
/// configuration (listener removed, config replaced, shutdown); free the module's configuration.
pub type HttpFilterConfigDestroyHook =
    unsafe extern "C" fn(config_module: HttpFilterConfigModulePtr);

/// `envoy_dynamic_module_on_http_filter_new`: worker thread, once per HTTP stream, before any other
/// hook of the stream. Return the module's filter. NULL fails the stream: Envoy answers 500 with
/// details `dynamic_module_filter_init_failed` and calls no other hook for it (no destroy).
pub type HttpFilterNewHook = unsafe extern "C" fn(
    config_module: HttpFilterConfigModulePtr,
    filter_envoy: HttpFilterEnvoyPtr,
) -> HttpFilterModulePtr;

/// `envoy_dynamic_module_on_http_filter_request_headers`: the request headers arrived;
/// `end_of_stream` is true when the request has no body (e.g. GET).
pub type HttpFilterRequestHeadersHook = unsafe extern "C" fn(
    filter_envoy: HttpFilterEnvoyPtr,
    filter_module: HttpFilterModulePtr,
    end_of_stream: bool,
) -> HeadersStatus;

/// `envoy_dynamic_module_on_http_filter_request_body`: a piece of request body arrived (read it
/// with [`HttpBodyType::RECEIVED_REQUEST_BODY`]); `end_of_stream` marks the last call.
pub type HttpFilterRequestBodyHook = unsafe extern "C" fn(
    filter_envoy: HttpFilterEnvoyPtr,
    filter_module: HttpFilterModulePtr,
    end_of_stream: bool,
) -> BodyStatus;

/// `envoy_dynamic_module_on_http_filter_request_trailers`: the request trailers arrived.
pub type HttpFilterRequestTrailersHook = unsafe extern "C" fn(
    filter_envoy: HttpFilterEnvoyPtr,
    filter_module: HttpFilterModulePtr,
) -> TrailersStatus;

/// `envoy_dynamic_module_on_http_filter_response_headers`: the response headers arrived, from
/// upstream or from a local reply of another filter or the router (e.g. 503
/// `no_healthy_upstream`); not for this module's own
/// [`envoy_dynamic_module_callback_http_send_response`].
pub type HttpFilterResponseHeadersHook = unsafe extern "C" fn(
    filter_envoy: HttpFilterEnvoyPtr,
    filter_module: HttpFilterModulePtr,
    end_of_stream: bool,
) -> HeadersStatus;

/// `envoy_dynamic_module_on_http_filter_response_body`: a piece of response body arrived (read
/// it with [`HttpBodyType::RECEIVED_RESPONSE_BODY`]).
pub type HttpFilterResponseBodyHook = unsafe extern "C" fn(
    filter_envoy: HttpFilterEnvoyPtr,
    filter_module: HttpFilterModulePtr,
    end_of_stream: bool,
) -> BodyStatus;

/// `envoy_dynamic_module_on_http_filter_response_trailers`: the response trailers arrived.
pub type HttpFilterResponseTrailersHook = unsafe extern "C" fn(
    filter_envoy: HttpFilterEnvoyPtr,
    filter_module: HttpFilterModulePtr,
) -> TrailersStatus;

/// `envoy_dynamic_module_on_http_filter_stream_complete`: the stream is over. Called before the
/// access logs (dynamic metadata set here appears in them) and before
/// [`HttpFilterDestroyHook`]; the attributes `response.code`, `response.code_details` and
/// `upstream.address` are readable. May run inline, inside another hook of the same filter: when
/// the module calls `send_response` from a response hook, this hook runs before `send_response`
/// returns.
pub type HttpFilterStreamCompleteHook =
    unsafe extern "C" fn(filter_envoy: HttpFilterEnvoyPtr, filter_module: HttpFilterModulePtr);

/// `envoy_dynamic_module_on_http_filter_destroy`: the last call for the filter, after
/// [`HttpFilterStreamCompleteHook`], from the worker's deferred-deletion list (never inside another
/// hook of it). Free the filter here. Callbacks still accept the Envoy pointer but do nothing
/// (attributes read as unavailable, metadata set here is lost).
pub type HttpFilterDestroyHook = unsafe extern "C" fn(filter_module: HttpFilterModulePtr);

/// `envoy_dynamic_module_on_http_filter_http_callout_done` (required, unused by kvroute): the
/// response of a callout started with `http_filter_http_callout`. `headers` and `body_chunks` are
/// owned by Envoy, valid during the call, and may be NULL.
pub type HttpCalloutDoneHook = unsafe extern "C" fn(
    filter_envoy: HttpFilterEnvoyPtr,
    filter_module: HttpFilterModulePtr,
    callout_id: u64,
    result: HttpCalloutResult,
    headers: *mut EnvoyHttpHeader,
    headers_size: usize,
    body_chunks: *mut EnvoyBuffer,
    body_chunks_size: usize,
);

/// `envoy_dynamic_module_on_http_filter_http_stream_headers` (required, unused by kvroute): the
/// response headers of a streamed callout; `headers` valid during the call.
pub type HttpStreamHeadersHook = unsafe extern "C" fn(
    filter_envoy: HttpFilterEnvoyPtr,
    filter_module: HttpFilterModulePtr,
    stream_id: u64,
    headers: *mut EnvoyHttpHeader,
    headers_size: usize,
    end_stream: bool,
);

/// `envoy_dynamic_module_on_http_filter_http_stream_data` (required, unused by kvroute): a
/// response body piece of a streamed callout; `data` valid during the call.
pub type HttpStreamDataHook = unsafe extern "C" fn(
    filter_envoy: HttpFilterEnvoyPtr,
    filter_module: HttpFilterModulePtr,
    stream_id: u64,
    data: *const EnvoyBuffer,
    data_count: usize,
    end_stream: bool,
);

/// `envoy_dynamic_module_on_http_filter_http_stream_trailers` (required, unused by kvroute): the
/// response trailers of a streamed callout (`stream_id`, `trailers`, `trailers_size`), valid
/// during the call.
pub type HttpStreamTrailersHook =
    unsafe extern "C" fn(HttpFilterEnvoyPtr, HttpFilterModulePtr, u64, *mut EnvoyHttpHeader, usize);

/// `envoy_dynamic_module_on_http_filter_http_stream_complete` (required, unused by kvroute): a
/// streamed callout (`stream_id`) ended normally; the id is invalid afterwards.
pub type HttpStreamCompleteHook =
    unsafe extern "C" fn(HttpFilterEnvoyPtr, HttpFilterModulePtr, u64);

/// `envoy_dynamic_module_on_http_filter_http_stream_reset` (required, unused by kvroute): a
/// streamed callout (`stream_id`) failed or was reset (`reason`); the id is invalid afterwards.
pub type HttpStreamResetHook =
    unsafe extern "C" fn(HttpFilterEnvoyPtr, HttpFilterModulePtr, u64, HttpStreamResetReason);

/// `envoy_dynamic_module_on_http_filter_scheduled` (required, unused by kvroute): on the stream's
/// worker thread, for an event (`event_id`) committed with `http_filter_scheduler_commit`.
pub type HttpFilterScheduledHook =
    unsafe extern "C" fn(HttpFilterEnvoyPtr, HttpFilterModulePtr, u64);

/// `envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark` (required,
/// unused by kvroute): the downstream write buffer went over its high watermark.
pub type DownstreamAboveWriteBufferHighWatermarkHook =
    unsafe extern "C" fn(HttpFilterEnvoyPtr, HttpFilterModulePtr);

/// `envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark` (required,
/// unused by kvroute): it went back under its low watermark (once per high-watermark call).
pub type DownstreamBelowWriteBufferLowWatermarkHook =
    unsafe extern "C" fn(HttpFilterEnvoyPtr, HttpFilterModulePtr);

/// `envoy_dynamic_module_on_http_filter_local_reply` (optional): a local reply is being sent on
/// the stream, by this module's `send_response` (called inside it, before it returns) or by Envoy
/// (e.g. the router's 503). `details` is valid during the call.
pub type LocalReplyHook = unsafe extern "C" fn(
    filter_envoy: HttpFilterEnvoyPtr,
    filter_module: HttpFilterModulePtr,
    response_code: u32,
    details: EnvoyBuffer,
    reset_imminent: bool,
) -> LocalReplyStatus;

// ---- Callbacks Envoy exports. Call the http ones on the stream's worker thread, during a hook of
// the filter whose Envoy pointer is passed.

unsafe extern "C" {
    /// Value number `index` of header `key` (looked up case-insensitively) in map `header_type`: writes it to
    /// `*result` and, when `optional_size` is not NULL, the number of values of `key` to
    /// `*optional_size`. Returns false (and a null `*result`, count 0 for a missing key) when the
    /// key is absent or `index` is out of range. `*result` is owned by Envoy and valid until the
    /// current hook returns or that header map is modified.
    pub fn envoy_dynamic_module_callback_http_get_header(
        filter_envoy: HttpFilterEnvoyPtr,
        header_type: HttpHeaderType,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;

    /// Number of entries (a key with two values counts twice) in map `header_type`; 0 if the map
    /// does not exist yet (e.g. response headers during request hooks).
    pub fn envoy_dynamic_module_callback_http_get_headers_size(
        filter_envoy: HttpFilterEnvoyPtr,
        header_type: HttpHeaderType,
    ) -> usize;

    /// Fills `result_headers` (room for `get_headers_size` entries) with every entry of map
    /// `header_type` in map order, pseudo-headers first. Same lifetime as `get_header`.
    pub fn envoy_dynamic_module_callback_http_get_headers(
        filter_envoy: HttpFilterEnvoyPtr,
        header_type: HttpHeaderType,
        result_headers: *mut EnvoyHttpHeader,
    ) -> bool;

    /// Replaces every value of header `key` with `value`. An empty `value` (length 0, null or not)
    /// REMOVES the header (it does not set an empty value); setting a missing key to empty does
    /// nothing. Returns false if the map does not exist yet (e.g. response headers during a
    /// request hook).
    pub fn envoy_dynamic_module_callback_http_set_header(
        filter_envoy: HttpFilterEnvoyPtr,
        header_type: HttpHeaderType,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    /// Appends `value` as one more value of header `key`, keeping the existing ones.
    pub fn envoy_dynamic_module_callback_http_add_header(
        filter_envoy: HttpFilterEnvoyPtr,
        header_type: HttpHeaderType,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    /// Total bytes of body `body_type`; 0 if absent or empty.
    pub fn envoy_dynamic_module_callback_http_get_body_size(
        filter_envoy: HttpFilterEnvoyPtr,
        body_type: HttpBodyType,
    ) -> usize;

    /// Number of slices of body `body_type` (returned directly, not through a pointer); 0 if
    /// absent or empty.
    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter_envoy: HttpFilterEnvoyPtr,
        body_type: HttpBodyType,
    ) -> usize;

    /// Fills `result` (room for `get_body_chunks_size` buffers) with the slices of body
    /// `body_type`, owned by Envoy and valid until the current hook returns or the body is
    /// modified. Returns false when that body does not exist (e.g. nothing buffered yet).
    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter_envoy: HttpFilterEnvoyPtr,
        body_type: HttpBodyType,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// True when the data of the current request body hook is a buffer that an earlier filter
    /// held and released, not new data. It says nothing about this filter's own buffering.
    pub fn envoy_dynamic_module_callback_http_received_buffered_request_body(
        filter_envoy: HttpFilterEnvoyPtr,
    ) -> bool;

    /// The same for the response body.
    pub fn envoy_dynamic_module_callback_http_received_buffered_response_body(
        filter_envoy: HttpFilterEnvoyPtr,
    ) -> bool;

    /// Sets string `value` at `key` in dynamic-metadata namespace `ns` (overwrites). Visible to the
    /// access log (`%DYNAMIC_METADATA(ns:key)%`) when set before the stream completes.
    pub fn envoy_dynamic_module_callback_http_set_dynamic_metadata_string(
        filter_envoy: HttpFilterEnvoyPtr,
        ns: ModuleBuffer,
        key: ModuleBuffer,
        value: ModuleBuffer,
    );

    /// Asks the load balancer of the routed cluster to pick host `host` (`ip:port`; a bare IP is
    /// also accepted). Returns false if `host` is not an IP address (a hostname is refused).
    /// `strict`: if the host is not in the cluster, fail with 503 `no_healthy_upstream` instead of
    /// balancing normally. Must happen before the router sees the request headers (in
    /// `request_headers`, or in a body hook after the headers were held with
    /// [`HeadersStatus::STOP_ITERATION`]); later calls are ignored. With an ORIGINAL_DST cluster
    /// it only selects hosts the cluster already created, so an unknown address gets 503
    /// `no_healthy_upstream` even when not strict; use the `x-envoy-original-dst-host` header there.
    pub fn envoy_dynamic_module_callback_http_set_upstream_override_host(
        filter_envoy: HttpFilterEnvoyPtr,
        host: ModuleBuffer,
        strict: bool,
    ) -> bool;

    /// Reads string attribute `attribute_id` into `*result` (owned by Envoy, valid until the
    /// current hook returns). False when it is unavailable (yet) or not a string.
    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter_envoy: HttpFilterEnvoyPtr,
        attribute_id: AttributeId,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// Reads integer attribute `attribute_id` into `*result`. False when it is unavailable (yet)
    /// or not an integer (then `*result` is untouched).
    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_int(
        filter_envoy: HttpFilterEnvoyPtr,
        attribute_id: AttributeId,
        result: *mut u64,
    ) -> bool;

    /// Sends a local reply: status `status_code`, `headers_vector` (Envoy adds `content-length`,
    /// `date`, `server`), `body`, and `details` as `response.code_details` (empty: Envoy uses
    /// `dynamic_module`). All buffers are read during the call only. Inside it, Envoy calls
    /// [`LocalReplyHook`]; this module's response hooks do not run for the reply. Return a Stop
    /// status from the calling hook. Called from a request hook, the upstream is not contacted
    /// unless the headers already went to the router.
    pub fn envoy_dynamic_module_callback_http_send_response(
        filter_envoy: HttpFilterEnvoyPtr,
        status_code: u32,
        headers_vector: *mut ModuleHttpHeader,
        headers_vector_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );

    /// Index (0-based, below `--concurrency`) of the worker thread running the stream.
    pub fn envoy_dynamic_module_callback_http_filter_get_worker_index(
        filter_envoy: HttpFilterEnvoyPtr,
    ) -> u32;

    /// Deprecated in 1.40 for `log_v2`: logs `message` at `level` under Envoy's `dynamic_modules`
    /// logger, with no source location (`[:]`). `message` is read during the call only.
    pub fn envoy_dynamic_module_callback_log(level: LogLevel, message: ModuleBuffer);

    /// Logs `message` at `level` under the `dynamic_modules` logger, showing
    /// `[source_file:source_line]` as the location. Buffers are read during the call only.
    pub fn envoy_dynamic_module_callback_log_v2(
        level: LogLevel,
        message: ModuleBuffer,
        source_file: ModuleBuffer,
        source_line: u32,
    );

    /// Whether `level` is enabled for the `dynamic_modules` logger (to skip formatting).
    pub fn envoy_dynamic_module_callback_log_enabled(level: LogLevel) -> bool;
}

// ---- The load-balancing policy (`envoy.load_balancing_policies.dynamic_modules`)
//
// Checked against Envoy 1.40.0 with a probe module: the config hooks run on the main thread;
// `on_lb_new` once on the main thread and once per worker, each instance starting with no host
// and getting the cluster's hosts through `on_lb_on_host_membership_update`, which also fires
// (added = removed = 0) when a host's health changes (active checks, outlier ejection);
// `on_lb_choose_host` runs on the stream's worker thread, after the HTTP filters' request hooks
// (a header a filter set is visible), once per attempt. An upstream override host that is
// healthy bypasses the policy. Indices: `choose_host` answers an index into the *healthy*
// hosts of a priority; `get_host_*` take indices into all hosts.

/// `envoy_dynamic_module_type_lb_config_envoy_ptr`: Envoy's policy configuration.
pub type LbConfigEnvoyPtr = *mut c_void;
/// `envoy_dynamic_module_type_lb_config_module_ptr`: the module's, from [`LbConfigNewHook`].
pub type LbConfigModulePtr = *const c_void;
/// `envoy_dynamic_module_type_lb_envoy_ptr`: one thread's load balancer on Envoy's side.
pub type LbEnvoyPtr = *mut c_void;
/// `envoy_dynamic_module_type_lb_module_ptr`: the module's, from [`LbNewHook`].
pub type LbModulePtr = *const c_void;
/// `envoy_dynamic_module_type_lb_context_envoy_ptr`: the request being balanced; may be NULL.
pub type LbContextEnvoyPtr = *mut c_void;

/// `envoy_dynamic_module_type_host_health`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostHealth(pub u32);

impl HostHealth {
    /// Failing active checks or ejected.
    pub const UNHEALTHY: Self = Self(0);
    /// Degraded (not among the healthy hosts).
    pub const DEGRADED: Self = Self(1);
    /// Healthy.
    pub const HEALTHY: Self = Self(2);
}

/// `envoy_dynamic_module_on_lb_config_new(config_envoy, name, config)`: `name` is the policy's
/// `lb_policy_name`, `config` its `lb_policy_config` (a `StringValue`'s bytes). NULL refuses it.
pub type LbConfigNewHook =
    unsafe extern "C" fn(LbConfigEnvoyPtr, EnvoyBuffer, EnvoyBuffer) -> LbConfigModulePtr;
/// `envoy_dynamic_module_on_lb_config_destroy(config_module)`.
pub type LbConfigDestroyHook = unsafe extern "C" fn(LbConfigModulePtr);
/// `envoy_dynamic_module_on_lb_new(config_module, lb_envoy)`: one per thread; NULL fails.
pub type LbNewHook = unsafe extern "C" fn(LbConfigModulePtr, LbEnvoyPtr) -> LbModulePtr;
/// `envoy_dynamic_module_on_lb_choose_host(lb_envoy, lb_module, context, *priority, *index)`:
/// true with a priority and an index into that priority's healthy hosts, or false (no host:
/// Envoy answers 503 `no_healthy_upstream`).
pub type LbChooseHostHook =
    unsafe extern "C" fn(LbEnvoyPtr, LbModulePtr, LbContextEnvoyPtr, *mut u32, *mut u32) -> bool;
/// `envoy_dynamic_module_on_lb_on_host_membership_update(lb_envoy, lb_module, added, removed)`.
pub type LbMembershipUpdateHook = unsafe extern "C" fn(LbEnvoyPtr, LbModulePtr, usize, usize);
/// `envoy_dynamic_module_on_lb_destroy(lb_module)`.
pub type LbDestroyHook = unsafe extern "C" fn(LbModulePtr);

unsafe extern "C" {
    /// Priorities in the cluster's priority set.
    pub fn envoy_dynamic_module_callback_lb_get_priority_set_size(lb: LbEnvoyPtr) -> usize;

    /// Hosts at `priority` (all of them).
    pub fn envoy_dynamic_module_callback_lb_get_hosts_count(lb: LbEnvoyPtr, priority: u32)
        -> usize;

    /// Healthy hosts at `priority`.
    pub fn envoy_dynamic_module_callback_lb_get_healthy_hosts_count(
        lb: LbEnvoyPtr,
        priority: u32,
    ) -> usize;

    /// The `ip:port` of healthy host `index` at `priority` into `*result` (Envoy's, valid
    /// during the hook); false when out of range.
    pub fn envoy_dynamic_module_callback_lb_get_healthy_host_address(
        lb: LbEnvoyPtr,
        priority: u32,
        index: usize,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// The `ip:port` of host `index` (among all hosts) at `priority`.
    pub fn envoy_dynamic_module_callback_lb_get_host_address(
        lb: LbEnvoyPtr,
        priority: u32,
        index: usize,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// The health of host `index` (among all hosts) at `priority`.
    pub fn envoy_dynamic_module_callback_lb_get_host_health(
        lb: LbEnvoyPtr,
        priority: u32,
        index: usize,
    ) -> HostHealth;

    /// Value `index` of request header `key` into `*result` (valid during the hook); the count
    /// of values into `*optional_count` when not NULL. False when absent.
    pub fn envoy_dynamic_module_callback_lb_context_get_downstream_header(
        context: LbContextEnvoyPtr,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_count: *mut usize,
    ) -> bool;
}
