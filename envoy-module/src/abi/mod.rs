//! Envoy's dynamic-module C ABI as kvroute uses it: the hooks Envoy calls
//! (`envoy_dynamic_module_on_*`, exported by the shared library) and a [`StreamHost`] over the
//! callbacks Envoy exports. The crate's only unsafe code.
//!
//! Ownership, as the ABI states it (the private module `sys` documents each hook):
//! - a filter configuration is a `Box<Arc<Instance>>` made in `http_filter_config_new` and
//!   freed in `http_filter_config_destroy` (main thread);
//! - a stream's filter is a `Box<Filter>` made in `http_filter_new` and freed in
//!   `http_filter_destroy`, Envoy's last call for it (the stream's worker thread);
//! - buffers Envoy hands out are copied before the hook returns.
//!
//! A panic never crosses into Envoy: every hook runs inside `catch_unwind`. A panic while the
//! request is being decided answers 500 with an OpenAI-style body (details
//! `kvroute_internal`), a panic in `http_filter_new` makes Envoy answer 500 itself, one in a
//! response hook lets the response through. The filter's state may then be half-updated,
//! but its ticket is still released exactly once: by `stream_complete` or by the drop in
//! `destroy`.

pub mod lb;
mod sys;

use std::borrow::Cow;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::Arc;

use crate::filter::{BodyStatus, Filter, HeadersStatus};
use crate::host::StreamHost;
use crate::instance::Instance;
pub use sys::ABI_VERSION;
use sys::{
    AttributeId, EnvoyBuffer, EnvoyHttpHeader, HttpBodyType, HttpFilterConfigEnvoyPtr,
    HttpFilterConfigModulePtr, HttpFilterEnvoyPtr, HttpFilterModulePtr, HttpHeaderType, LogLevel,
    ModuleBuffer, ModuleHttpHeader,
};

// ---- Safe views of Envoy's buffers

/// Bytes borrowed from Envoy.
///
/// # Safety
/// `buffer` must point to `length` readable bytes (or be null with any length, read as
/// empty) for the returned lifetime, which the caller bounds to the current hook.
unsafe fn envoy_bytes<'a>(buffer: EnvoyBuffer) -> &'a [u8] {
    if buffer.ptr.is_null() || buffer.length == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(buffer.ptr.cast::<u8>(), buffer.length) }
    }
}

/// Bytes lent to Envoy for the duration of one callback.
fn module_buffer(bytes: &[u8]) -> ModuleBuffer {
    ModuleBuffer {
        ptr: bytes.as_ptr().cast::<c_char>(),
        length: bytes.len(),
    }
}

/// Logs `message` through Envoy's own log (`dynamic_modules` logger): for what must be seen
/// even before kvroute's log is set up, such as a configuration Envoy is about to refuse.
///
/// Unit tests are not linked with Envoy: there, the message goes to stderr.
#[cfg(test)]
fn envoy_log(_level: LogLevel, message: &str) {
    eprintln!("{message}");
}

#[cfg(not(test))]
fn envoy_log(level: LogLevel, message: &str) {
    let file = file!();
    // SAFETY: both buffers are read during the call only; the callback has no other
    // precondition.
    unsafe {
        sys::envoy_dynamic_module_callback_log_v2(
            level,
            module_buffer(message.as_bytes()),
            module_buffer(file.as_bytes()),
            line!(),
        );
    }
}

// ---- The stream, as the filter sees it

/// One stream during one of Envoy's calls into the filter.
struct EnvoyStream {
    envoy: HttpFilterEnvoyPtr,
}

impl EnvoyStream {
    fn header(&self, map: HttpHeaderType, name: &str) -> Option<Vec<u8>> {
        let mut value = EnvoyBuffer {
            ptr: ptr::null(),
            length: 0,
        };
        // SAFETY: `self.envoy` is the stream's pointer, valid during the hook; `value` is a
        // valid out-pointer; the count pointer may be null.
        let found = unsafe {
            sys::envoy_dynamic_module_callback_http_get_header(
                self.envoy,
                map,
                module_buffer(name.as_bytes()),
                &mut value,
                0,
                ptr::null_mut(),
            )
        };
        // SAFETY: Envoy's value stays valid until the hook returns or the map changes; it is
        // copied at once.
        found.then(|| unsafe { envoy_bytes(value) }.to_vec())
    }

    fn set_header(&mut self, map: HttpHeaderType, name: &str, value: &[u8]) -> bool {
        // SAFETY: both buffers are read during the call only.
        unsafe {
            sys::envoy_dynamic_module_callback_http_set_header(
                self.envoy,
                map,
                module_buffer(name.as_bytes()),
                module_buffer(value),
            )
        }
    }

    fn body_len(&self, body: HttpBodyType) -> usize {
        // SAFETY: the stream's pointer during the hook.
        unsafe { sys::envoy_dynamic_module_callback_http_get_body_size(self.envoy, body) }
    }

    /// Appends the non-empty slices of `body` to `out`, borrowed from Envoy for as long as
    /// `self` (the current hook).
    fn body_chunks<'s>(&'s self, body: HttpBodyType, out: &mut Vec<&'s [u8]>) {
        // SAFETY: the stream's pointer during the hook.
        let n = unsafe {
            sys::envoy_dynamic_module_callback_http_get_body_chunks_size(self.envoy, body)
        };
        if n == 0 {
            return;
        }
        let mut slices = vec![
            EnvoyBuffer {
                ptr: ptr::null(),
                length: 0
            };
            n
        ];
        // SAFETY: `slices` has room for the `n` buffers Envoy reported.
        let ok = unsafe {
            sys::envoy_dynamic_module_callback_http_get_body_chunks(
                self.envoy,
                body,
                slices.as_mut_ptr(),
            )
        };
        if ok {
            // SAFETY: each slice is valid until the hook returns, which outlives `&'s self`
            // (an `EnvoyStream` lives for one hook), and is not changed meanwhile: the
            // borrow of `self` keeps the filter from calling Envoy to modify the body.
            out.extend(
                slices
                    .iter()
                    .map(|s| unsafe { envoy_bytes::<'s>(*s) })
                    .filter(|s| !s.is_empty()),
            );
        }
    }

    fn attribute_string(&self, id: AttributeId) -> Option<String> {
        let mut value = EnvoyBuffer {
            ptr: ptr::null(),
            length: 0,
        };
        // SAFETY: the stream's pointer during the hook; a valid out-pointer.
        let found = unsafe {
            sys::envoy_dynamic_module_callback_http_filter_get_attribute_string(
                self.envoy, id, &mut value,
            )
        };
        // SAFETY: valid until the hook returns; copied at once.
        found.then(|| String::from_utf8_lossy(unsafe { envoy_bytes(value) }).into_owned())
    }
}

impl StreamHost for EnvoyStream {
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        self.header(HttpHeaderType::REQUEST_HEADER, name)
    }

    fn set_request_header(&mut self, name: &str, value: &[u8]) -> bool {
        self.set_header(HttpHeaderType::REQUEST_HEADER, name, value)
    }

    /// What Envoy buffered (earlier chunks held back) followed by the chunk of this call: the
    /// whole body at its end (measured: over HTTP/1.1 the last call's own chunk is empty and
    /// the buffer holds everything; an HTTP/2 body in one frame has no buffer).
    fn request_body(&self) -> Cow<'_, [u8]> {
        let mut chunks = Vec::new();
        self.body_chunks(HttpBodyType::BUFFERED_REQUEST_BODY, &mut chunks);
        self.body_chunks(HttpBodyType::RECEIVED_REQUEST_BODY, &mut chunks);
        match chunks[..] {
            [] => Cow::Borrowed(&[]),
            [one] => Cow::Borrowed(one),
            _ => Cow::Owned(chunks.concat()),
        }
    }

    fn request_body_len(&self) -> usize {
        self.body_len(HttpBodyType::BUFFERED_REQUEST_BODY)
            + self.body_len(HttpBodyType::RECEIVED_REQUEST_BODY)
    }

    fn set_destination(&mut self, address: &str) -> bool {
        let namespace = kvroute_ext_proc::respond::LB_NAMESPACE.as_bytes();
        let key = kvroute_ext_proc::respond::DESTINATION_HEADER.as_bytes();
        // SAFETY: the buffers are read during the calls only.
        unsafe {
            sys::envoy_dynamic_module_callback_http_set_dynamic_metadata_string(
                self.envoy,
                module_buffer(namespace),
                module_buffer(key),
                module_buffer(address.as_bytes()),
            );
        }
        true
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        self.header(HttpHeaderType::RESPONSE_HEADER, name)
    }

    fn set_response_header(&mut self, name: &str, value: &[u8]) -> bool {
        self.set_header(HttpHeaderType::RESPONSE_HEADER, name, value)
    }

    fn response_chunk(&self) -> Vec<&[u8]> {
        let mut chunks = Vec::new();
        self.body_chunks(HttpBodyType::RECEIVED_RESPONSE_BODY, &mut chunks);
        chunks
    }

    fn response_code_details(&self) -> Option<String> {
        self.attribute_string(AttributeId::RESPONSE_CODE_DETAILS)
    }

    fn response_code(&self) -> Option<u16> {
        let mut code = 0u64;
        // SAFETY: the stream's pointer during the hook; a valid out-pointer.
        let found = unsafe {
            sys::envoy_dynamic_module_callback_http_filter_get_attribute_int(
                self.envoy,
                AttributeId::RESPONSE_CODE,
                &mut code,
            )
        };
        found.then(|| u16::try_from(code).ok()).flatten()
    }

    fn send_local_reply(
        &mut self,
        status: u16,
        headers: &[(&str, &[u8])],
        body: &[u8],
        details: &str,
    ) {
        let mut headers: Vec<ModuleHttpHeader> = headers
            .iter()
            .map(|(name, value)| ModuleHttpHeader {
                key_ptr: name.as_ptr().cast::<c_char>(),
                key_length: name.len(),
                value_ptr: value.as_ptr().cast::<c_char>(),
                value_length: value.len(),
            })
            .collect();
        // SAFETY: every buffer outlives the call, which only reads them.
        unsafe {
            sys::envoy_dynamic_module_callback_http_send_response(
                self.envoy,
                u32::from(status),
                headers.as_mut_ptr(),
                headers.len(),
                module_buffer(body),
                module_buffer(details.as_bytes()),
            );
        }
    }
}

// ---- Hooks

/// The filter behind Envoy's module pointer.
///
/// # Safety
/// `module` must be a pointer returned by [`envoy_dynamic_module_on_http_filter_new`] and
/// not yet destroyed; Envoy calls a stream's hooks on one thread, one at a time.
unsafe fn filter<'a>(module: HttpFilterModulePtr) -> &'a mut Filter {
    // SAFETY: the caller's contract: a live `Box<Filter>` with no other reference to it.
    unsafe { &mut *(module as *mut Filter) }
}

/// The OpenAI-style body of the 500 a panic answers.
const PANIC_BODY: &[u8] = br#"{"error":{"message":"kvroute internal error","type":"api_error","code":"internal_error","param":null}}"#;
/// Its `response.code_details`.
const PANIC_DETAILS: &str = "kvroute_internal";

/// Runs a request-phase hook on `stream`; a panic answers 500 and stops the stream.
fn request_hook<H: StreamHost, T>(stream: &mut H, stopped: T, hook: impl FnOnce(&mut H) -> T) -> T {
    match catch_unwind(AssertUnwindSafe(|| hook(stream))) {
        Ok(status) => status,
        Err(_) => {
            let headers: [(&str, &[u8]); 1] = [("content-type", b"application/json")];
            let replied = catch_unwind(AssertUnwindSafe(|| {
                stream.send_local_reply(500, &headers, PANIC_BODY, PANIC_DETAILS)
            }));
            if replied.is_err() {
                envoy_log(LogLevel::ERROR, "kvroute: panic while answering a panic");
            }
            stopped
        }
    }
}

/// Runs a hook whose failure changes nothing for the client (response phase, stream end).
fn quiet_hook<T>(fallback: T, hook: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(hook)).unwrap_or(fallback)
}

fn headers_status(status: HeadersStatus) -> sys::HeadersStatus {
    match status {
        HeadersStatus::Continue => sys::HeadersStatus::CONTINUE,
        HeadersStatus::Stop => sys::HeadersStatus::STOP_ITERATION,
    }
}

fn body_status(status: BodyStatus) -> sys::BodyStatus {
    match status {
        BodyStatus::Continue => sys::BodyStatus::CONTINUE,
        BodyStatus::StopAndBuffer => sys::BodyStatus::STOP_ITERATION_AND_BUFFER,
        BodyStatus::Stop => sys::BodyStatus::STOP_ITERATION_NO_BUFFER,
    }
}

/// Declares the module's ABI version (Envoy logs a warning on a mismatch and loads it anyway).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    sys::ABI_VERSION_CSTR.as_ptr()
}
const _: sys::ProgramInitHook = envoy_dynamic_module_on_program_init;

/// A filter configuration: `filter_name` names the kvroute instance (configurations with the
/// same name share one router), `filter_config` is a TOML path or the TOML itself. NULL (Envoy
/// refuses the configuration) when it does not load, with the reason in Envoy's log.
///
/// # Safety
/// Envoy's contract: `name` and `config` are readable during the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _config_envoy: HttpFilterConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> HttpFilterConfigModulePtr {
    // SAFETY: valid during the call; copied at once.
    let name = String::from_utf8_lossy(unsafe { envoy_bytes(name) }).into_owned();
    // SAFETY: as above.
    let text = String::from_utf8_lossy(unsafe { envoy_bytes(config) }).into_owned();
    let started = catch_unwind(|| Instance::get_or_start(&name, &text));
    match started {
        Ok(Ok(instance)) => Box::into_raw(Box::new(instance)) as HttpFilterConfigModulePtr,
        Ok(Err(e)) => {
            envoy_log(LogLevel::ERROR, &format!("kvroute filter {name:?}: {e}"));
            ptr::null()
        }
        Err(_) => {
            envoy_log(
                LogLevel::ERROR,
                &format!("kvroute filter {name:?}: panic at start"),
            );
            ptr::null()
        }
    }
}
const _: sys::HttpFilterConfigNewHook = envoy_dynamic_module_on_http_filter_config_new;

/// Drops a filter configuration (the instance stops with its last one).
///
/// # Safety
/// `config` comes from [`envoy_dynamic_module_on_http_filter_config_new`], destroyed once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(
    config: HttpFilterConfigModulePtr,
) {
    // SAFETY: the caller's contract: the box made by config_new, freed here once.
    let instance = unsafe { Box::from_raw(config as *mut Arc<Instance>) };
    quiet_hook((), move || drop(instance));
}
const _: sys::HttpFilterConfigDestroyHook = envoy_dynamic_module_on_http_filter_config_destroy;

/// A stream's filter.
///
/// # Safety
/// `config` is a live configuration from [`envoy_dynamic_module_on_http_filter_config_new`].
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: HttpFilterConfigModulePtr,
    _envoy: HttpFilterEnvoyPtr,
) -> HttpFilterModulePtr {
    // SAFETY: the caller's contract; Envoy keeps the configuration alive while it has streams.
    let instance = unsafe { &*(config as *const Arc<Instance>) };
    quiet_hook(ptr::null(), || {
        Box::into_raw(Box::new(Filter::new(instance.shared.clone()))) as HttpFilterModulePtr
    })
}
const _: sys::HttpFilterNewHook = envoy_dynamic_module_on_http_filter_new;

/// # Safety
/// Envoy's contract: live pointers, the stream's thread.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: HttpFilterEnvoyPtr,
    module: HttpFilterModulePtr,
    end_of_stream: bool,
) -> sys::HeadersStatus {
    // SAFETY: the caller's contract.
    let f = unsafe { filter(module) };
    request_hook(
        &mut EnvoyStream { envoy },
        sys::HeadersStatus::STOP_ITERATION,
        |s| headers_status(f.on_request_headers(s, end_of_stream)),
    )
}
const _: sys::HttpFilterRequestHeadersHook = envoy_dynamic_module_on_http_filter_request_headers;

/// # Safety
/// Envoy's contract: live pointers, the stream's thread.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    envoy: HttpFilterEnvoyPtr,
    module: HttpFilterModulePtr,
    end_of_stream: bool,
) -> sys::BodyStatus {
    // SAFETY: the caller's contract.
    let f = unsafe { filter(module) };
    request_hook(
        &mut EnvoyStream { envoy },
        sys::BodyStatus::STOP_ITERATION_NO_BUFFER,
        |s| body_status(f.on_request_body(s, end_of_stream)),
    )
}
const _: sys::HttpFilterRequestBodyHook = envoy_dynamic_module_on_http_filter_request_body;

/// # Safety
/// Envoy's contract: live pointers, the stream's thread.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    envoy: HttpFilterEnvoyPtr,
    module: HttpFilterModulePtr,
) -> sys::TrailersStatus {
    // SAFETY: the caller's contract.
    let f = unsafe { filter(module) };
    request_hook(
        &mut EnvoyStream { envoy },
        sys::TrailersStatus::STOP_ITERATION,
        |s| match f.on_request_trailers(s) {
            HeadersStatus::Continue => sys::TrailersStatus::CONTINUE,
            HeadersStatus::Stop => sys::TrailersStatus::STOP_ITERATION,
        },
    )
}
const _: sys::HttpFilterRequestTrailersHook = envoy_dynamic_module_on_http_filter_request_trailers;

/// # Safety
/// Envoy's contract: live pointers, the stream's thread.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: HttpFilterEnvoyPtr,
    module: HttpFilterModulePtr,
    _end_of_stream: bool,
) -> sys::HeadersStatus {
    // SAFETY: the caller's contract.
    let f = unsafe { filter(module) };
    quiet_hook(sys::HeadersStatus::CONTINUE, || {
        headers_status(f.on_response_headers(&mut EnvoyStream { envoy }))
    })
}
const _: sys::HttpFilterResponseHeadersHook = envoy_dynamic_module_on_http_filter_response_headers;

/// # Safety
/// Envoy's contract: live pointers, the stream's thread.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy: HttpFilterEnvoyPtr,
    module: HttpFilterModulePtr,
    _end_of_stream: bool,
) -> sys::BodyStatus {
    // SAFETY: the caller's contract.
    let f = unsafe { filter(module) };
    quiet_hook(sys::BodyStatus::CONTINUE, || {
        body_status(f.on_response_body(&mut EnvoyStream { envoy }))
    })
}
const _: sys::HttpFilterResponseBodyHook = envoy_dynamic_module_on_http_filter_response_body;

/// Response trailers change nothing.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _envoy: HttpFilterEnvoyPtr,
    _module: HttpFilterModulePtr,
) -> sys::TrailersStatus {
    sys::TrailersStatus::CONTINUE
}
const _: sys::HttpFilterResponseTrailersHook =
    envoy_dynamic_module_on_http_filter_response_trailers;

/// The stream ended (completed, aborted, reset, answered locally): the ticket is released.
///
/// # Safety
/// Envoy's contract: live pointers, the stream's thread.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _envoy: HttpFilterEnvoyPtr,
    module: HttpFilterModulePtr,
) {
    // SAFETY: the caller's contract.
    let f = unsafe { filter(module) };
    quiet_hook((), || f.on_stream_complete());
}
const _: sys::HttpFilterStreamCompleteHook = envoy_dynamic_module_on_http_filter_stream_complete;

/// Frees the filter (releasing its ticket if the stream never completed).
///
/// # Safety
/// `module` comes from [`envoy_dynamic_module_on_http_filter_new`]; Envoy's last call for it.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: HttpFilterModulePtr) {
    // SAFETY: the box made by filter_new, freed here once.
    let f = unsafe { Box::from_raw(module as *mut Filter) };
    quiet_hook((), move || drop(f));
}
const _: sys::HttpFilterDestroyHook = envoy_dynamic_module_on_http_filter_destroy;

// Hooks Envoy 1.40 requires but kvroute never triggers: it starts no callouts, schedules no
// events and does not watch the downstream buffer.

/// Unused (no callouts).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _envoy: HttpFilterEnvoyPtr,
    _module: HttpFilterModulePtr,
    _callout_id: u64,
    _result: sys::HttpCalloutResult,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}
const _: sys::HttpCalloutDoneHook = envoy_dynamic_module_on_http_filter_http_callout_done;

/// Unused (no streamed callouts).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _envoy: HttpFilterEnvoyPtr,
    _module: HttpFilterModulePtr,
    _stream_id: u64,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}
const _: sys::HttpStreamHeadersHook = envoy_dynamic_module_on_http_filter_http_stream_headers;

/// Unused (no streamed callouts).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _envoy: HttpFilterEnvoyPtr,
    _module: HttpFilterModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}
const _: sys::HttpStreamDataHook = envoy_dynamic_module_on_http_filter_http_stream_data;

/// Unused (no streamed callouts).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _envoy: HttpFilterEnvoyPtr,
    _module: HttpFilterModulePtr,
    _stream_id: u64,
    _trailers: *mut EnvoyHttpHeader,
    _trailers_size: usize,
) {
}
const _: sys::HttpStreamTrailersHook = envoy_dynamic_module_on_http_filter_http_stream_trailers;

/// Unused (no streamed callouts).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _envoy: HttpFilterEnvoyPtr,
    _module: HttpFilterModulePtr,
    _stream_id: u64,
) {
}
const _: sys::HttpStreamCompleteHook = envoy_dynamic_module_on_http_filter_http_stream_complete;

/// Unused (no streamed callouts).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _envoy: HttpFilterEnvoyPtr,
    _module: HttpFilterModulePtr,
    _stream_id: u64,
    _reason: sys::HttpStreamResetReason,
) {
}
const _: sys::HttpStreamResetHook = envoy_dynamic_module_on_http_filter_http_stream_reset;

/// Unused (nothing scheduled).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _envoy: HttpFilterEnvoyPtr,
    _module: HttpFilterModulePtr,
    _event_id: u64,
) {
}
const _: sys::HttpFilterScheduledHook = envoy_dynamic_module_on_http_filter_scheduled;

/// Unused (the response is not held).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _envoy: HttpFilterEnvoyPtr,
    _module: HttpFilterModulePtr,
) {
}
const _: sys::DownstreamAboveWriteBufferHighWatermarkHook =
    envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark;

/// Unused (the response is not held).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _envoy: HttpFilterEnvoyPtr,
    _module: HttpFilterModulePtr,
) {
}
const _: sys::DownstreamBelowWriteBufferLowWatermarkHook =
    envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declares_the_abi_version_envoy_1_40_expects() {
        // Envoy 1.40.0's ENVOY_DYNAMIC_MODULES_ABI_VERSION; a mismatch would only warn, so the
        // pin is this test (and the e2e tests, which read Envoy's "matched" log line).
        assert_eq!(ABI_VERSION, "v0.2.0");
        let declared = envoy_dynamic_module_on_program_init();
        // SAFETY: a 'static NUL-terminated string.
        let declared = unsafe { std::ffi::CStr::from_ptr(declared) };
        assert_eq!(declared.to_str(), Ok("v0.2.0"));
    }

    #[test]
    fn statuses_map_to_the_abi_values() {
        assert_eq!(headers_status(HeadersStatus::Continue).0, 0);
        assert_eq!(headers_status(HeadersStatus::Stop).0, 1);
        assert_eq!(body_status(BodyStatus::Continue).0, 0);
        assert_eq!(body_status(BodyStatus::StopAndBuffer).0, 1);
        assert_eq!(body_status(BodyStatus::Stop).0, 3);
    }

    /// A stream that records the local reply it is asked to send.
    #[derive(Default)]
    struct Recorder {
        reply: Option<(u16, Vec<u8>, String)>,
    }

    impl StreamHost for Recorder {
        fn request_header(&self, _: &str) -> Option<Vec<u8>> {
            None
        }
        fn set_request_header(&mut self, _: &str, _: &[u8]) -> bool {
            true
        }
        fn request_body(&self) -> Cow<'_, [u8]> {
            Cow::Borrowed(&[])
        }
        fn request_body_len(&self) -> usize {
            0
        }
        fn set_destination(&mut self, _: &str) -> bool {
            true
        }
        fn response_header(&self, _: &str) -> Option<Vec<u8>> {
            None
        }
        fn set_response_header(&mut self, _: &str, _: &[u8]) -> bool {
            true
        }
        fn response_chunk(&self) -> Vec<&[u8]> {
            Vec::new()
        }
        fn response_code_details(&self) -> Option<String> {
            None
        }
        fn response_code(&self) -> Option<u16> {
            None
        }
        fn send_local_reply(
            &mut self,
            status: u16,
            _: &[(&str, &[u8])],
            body: &[u8],
            details: &str,
        ) {
            self.reply = Some((status, body.to_vec(), details.to_owned()));
        }
    }

    #[test]
    fn a_panic_in_a_request_hook_becomes_a_500_and_a_stop() {
        let mut stream = Recorder::default();
        let status = request_hook(&mut stream, sys::HeadersStatus::STOP_ITERATION, |_| {
            panic!("a bug")
        });
        assert_eq!(status, sys::HeadersStatus::STOP_ITERATION);
        let (code, body, details) = stream.reply.expect("a local reply");
        assert_eq!((code, details.as_str()), (500, "kvroute_internal"));
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["code"], "internal_error");
        // Without a panic the hook's own status, and no reply.
        let mut stream = Recorder::default();
        let status = request_hook(
            &mut stream,
            sys::BodyStatus::STOP_ITERATION_NO_BUFFER,
            |_| sys::BodyStatus::CONTINUE,
        );
        assert_eq!(status, sys::BodyStatus::CONTINUE);
        assert!(stream.reply.is_none());
        assert_eq!(quiet_hook(7, || panic!("in a response hook")), 7);
    }

    #[test]
    fn envoy_buffers_read_as_bytes() {
        let text = b"hello";
        let buffer = EnvoyBuffer {
            ptr: text.as_ptr().cast(),
            length: 5,
        };
        // SAFETY: `text` outlives the slice.
        assert_eq!(unsafe { envoy_bytes(buffer) }, b"hello");
        let null = EnvoyBuffer {
            ptr: ptr::null(),
            length: 7,
        };
        // SAFETY: null reads as empty.
        assert_eq!(unsafe { envoy_bytes(null) }, b"");
    }
}
