//! One HTTP stream's routing inside Envoy, driven by Envoy's calls through [`crate::abi`].
//!
//! Flow (the same reading, decisions, rejections and headers as kvroute-ext-proc's, through
//! [`kvroute_ext_proc::routing`]):
//! 1. Request headers: read `:path`, `x-request-id`, `routing-strategy`, `content-length`,
//!    `model`; a bad strategy is a 400, an announced body over `max_body_bytes` a 413. A request
//!    without a body is routed now; otherwise Envoy is told to stop and wait for it.
//!    A rejection made while a body is still coming is answered at the body's end: answered
//!    earlier, Envoy would close an HTTP/1.1 connection whose client is still sending, and the
//!    client would see a reset instead of the error (measured with Envoy 1.40). Until then the
//!    body is read and dropped, not buffered.
//! 2. Request body: held back and buffered by Envoy chunk by chunk (a body growing past
//!    `max_body_bytes` is a 413, answered at its end and no longer buffered); at its end the
//!    whole body is read, the model and
//!    prompt extracted, the prompt hashed outside the router lock, and the request routed:
//!    Envoy is told the destination ([`StreamHost::set_destination`]) and the request gets
//!    `x-gateway-destination-endpoint`, `target-pod` and `routing-strategy` as with
//!    ext_proc. Request trailers (HTTP/2 clients) end the body too. Under an `[admission]`
//!    policy, a request the router would queue is shed instead (429 with `Retry-After`,
//!    reason `would_queue`: [`routing::route_now`]): the module cannot hold a request yet.
//! 3. Response headers: `target-pod`, `target-pod-ip`, `routing-strategy`,
//!    `x-kvroute-decision`, `request-id` as with ext_proc; the status and Envoy's
//!    `response.code_details` decide the outcome the core learns from. A 2xx event stream is
//!    timed whenever `[stream_timing] max_streams` > 0: its chunks pass through the filter
//!    anyway, so reading them costs no extra hop (unlike ext_proc, there is no budget).
//! 4. Response body: each chunk read for the first token and the usage event.
//! 5. Stream complete (normal end, client abort, upstream reset, local reply): the ticket is
//!    released with the outcome and timings, exactly once ([`Filter`]'s drop releases it
//!    too, if Envoy destroys the filter without completing the stream).

use std::sync::Arc;
use std::time::Instant;

use kvroute_core::StrategySpec;
use kvroute_ext_proc::respond::Reject;
use kvroute_ext_proc::routing::{
    self, RequestInfo, ResponseHead, RouteInputs, Routed, TimingPolicy,
};
use kvroute_ext_proc::shared::Shared;

use crate::host::StreamHost;

/// The request headers kvroute reads.
const REQUEST_HEADERS: [&str; 6] = [
    ":path",
    "x-request-id",
    "routing-strategy",
    "content-length",
    "model",
    "x-session-id",
];

/// What Envoy should do after request or response headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadersStatus {
    /// Go on to the next filter.
    Continue,
    /// Hold the headers (the body decides where the request goes, or a local reply was sent).
    Stop,
}

/// What Envoy should do after a body chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyStatus {
    /// Go on to the next filter.
    Continue,
    /// Hold and buffer the chunk (the body is not whole yet).
    StopAndBuffer,
    /// Hold without buffering (a local reply was sent, or is to be sent at the body's end and
    /// the chunk is dropped).
    Stop,
}

/// One stream's state. Dropping it releases the request's ticket, if any (and if
/// [`Filter::on_stream_complete`] did not already).
#[derive(Debug)]
pub struct Filter {
    shared: Arc<Shared>,
    info: RequestInfo,
    strategy: Option<StrategySpec>,
    routed: Option<Routed>,
    /// Routed or rejected: nothing more to decide.
    decided: bool,
    rejected: bool,
    /// A rejection to answer once the request body has ended (its rest is dropped meanwhile).
    pending: Option<Reject>,
}

impl Filter {
    /// A fresh stream routed on `shared`'s router.
    pub fn new(shared: Arc<Shared>) -> Self {
        Filter {
            shared,
            info: RequestInfo::default(),
            strategy: None,
            routed: None,
            decided: false,
            rejected: false,
            pending: None,
        }
    }

    /// The request headers.
    pub fn on_request_headers(
        &mut self,
        host: &mut impl StreamHost,
        end_of_stream: bool,
    ) -> HeadersStatus {
        for name in REQUEST_HEADERS {
            if let Some(v) = host.request_header(name) {
                self.info.read_header(name, &v);
            }
        }
        let checked = self.info.check(self.shared.settings().max_body_bytes);
        self.strategy = match checked {
            Ok(s) => s,
            Err(r) if end_of_stream => {
                self.reject(host, r);
                return HeadersStatus::Stop;
            }
            Err(r) => {
                self.pending = Some(r);
                return HeadersStatus::Stop;
            }
        };
        if !end_of_stream {
            return HeadersStatus::Stop;
        }
        let result = routing::route_without_body(&self.shared, self.inputs());
        self.settle(host, result)
    }

    /// A request body chunk (`end_of_stream`: the last one).
    pub fn on_request_body(
        &mut self,
        host: &mut impl StreamHost,
        end_of_stream: bool,
    ) -> BodyStatus {
        if self.decided {
            return if self.rejected {
                BodyStatus::Stop
            } else {
                BodyStatus::Continue
            };
        }
        let limit = self.shared.settings().max_body_bytes;
        if self.pending.is_none() && host.request_body_len() > limit {
            self.pending = Some(Reject::TooLarge { limit });
        }
        if let Some(reject) = self.pending.take() {
            if end_of_stream {
                self.reject(host, reject);
            } else {
                self.pending = Some(reject);
            }
            return BodyStatus::Stop;
        }
        if !end_of_stream {
            return BodyStatus::StopAndBuffer;
        }
        match self.route_body(host) {
            HeadersStatus::Continue => BodyStatus::Continue,
            HeadersStatus::Stop => BodyStatus::Stop,
        }
    }

    /// The request trailers: they end the body (HTTP/2 and gRPC clients).
    pub fn on_request_trailers(&mut self, host: &mut impl StreamHost) -> HeadersStatus {
        if let Some(reject) = self.pending.take() {
            self.reject(host, reject);
            return HeadersStatus::Stop;
        }
        if self.decided {
            return if self.rejected {
                HeadersStatus::Stop
            } else {
                HeadersStatus::Continue
            };
        }
        self.route_body(host)
    }

    fn route_body(&mut self, host: &mut impl StreamHost) -> HeadersStatus {
        let body = host.request_body();
        let result = routing::route_body(&self.shared, self.inputs(), &body);
        drop(body);
        self.settle(host, result)
    }

    fn inputs(&self) -> RouteInputs<'_> {
        RouteInputs {
            info: &self.info,
            strategy: self.strategy.as_ref(),
            subset: None,
        }
    }

    /// Applies a decision (the upstream host and the request headers) or sends the rejection.
    fn settle(
        &mut self,
        host: &mut impl StreamHost,
        result: Result<Routed, Reject>,
    ) -> HeadersStatus {
        let routed = match result {
            Ok(r) => r,
            Err(r) => {
                self.reject(host, r);
                return HeadersStatus::Stop;
            }
        };
        self.decided = true;
        if !host.set_destination(&routed.address) {
            tracing::warn!(address = &*routed.address, "Envoy refused the destination");
        }
        for (name, value) in routed.route_to().upstream_headers() {
            host.set_request_header(name, value.as_bytes());
        }
        self.routed = Some(routed);
        HeadersStatus::Continue
    }

    fn reject(&mut self, host: &mut impl StreamHost, reject: Reject) {
        self.decided = true;
        self.rejected = true;
        let request_id = self.info.request_id.as_deref();
        routing::log_reject(&self.shared, request_id, &reject);
        let headers = reject.headers(request_id);
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        host.send_local_reply(reject.status(), &headers, &reject.body(), &reject.details());
    }

    /// The response headers (from the pod, or a reply Envoy made itself).
    pub fn on_response_headers(&mut self, host: &mut impl StreamHost) -> HeadersStatus {
        if self.rejected {
            // kvroute's own reply: its headers are set.
            return HeadersStatus::Continue;
        }
        let status = host
            .response_header(":status")
            .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok());
        let content_type = host.response_header("content-type");
        let head = ResponseHead {
            status,
            content_type: content_type
                .as_deref()
                .and_then(|c| std::str::from_utf8(c).ok()),
        };
        let details = host.response_code_details();
        let (headers, _) = routing::on_response_headers(
            &self.shared,
            self.routed.as_mut(),
            self.info.request_id.as_deref(),
            head,
            details,
            TimingPolicy::Free,
        );
        for (name, value) in headers {
            host.set_response_header(name, &value);
        }
        HeadersStatus::Continue
    }

    /// A response body chunk: read for the first token and the usage when timed.
    pub fn on_response_body(&mut self, host: &mut impl StreamHost) -> BodyStatus {
        if let Some(t) = self.routed.as_mut().and_then(|r| r.guard.timing_mut()) {
            let now = Instant::now();
            for chunk in host.response_chunk() {
                t.on_chunk(chunk, now);
            }
        }
        BodyStatus::Continue
    }

    /// The stream is over, however it ended: releases the ticket now.
    pub fn on_stream_complete(&mut self) {
        self.routed = None;
    }

    /// Whether a ticket is held (tests).
    pub fn is_routed(&self) -> bool {
        self.routed.is_some()
    }
}

#[cfg(test)]
mod tests;
