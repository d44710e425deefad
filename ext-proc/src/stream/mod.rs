//! One HTTP request's ext_proc exchange: a state machine fed with Envoy's messages, answering
//! each with exactly one `ProcessingResponse` (or failing the stream with a `Status`, never
//! ending it with OK: that would let Envoy continue un-routed), except with
//! `FULL_DUPLEX_STREAMED` bodies (below).
//!
//! Flow with the shipped config (request headers SKIP, request body BUFFERED, response
//! headers SEND or SKIP, response trailers SEND; `request_headers` SEND on `GET /v1/models`):
//! 1. `request_headers` (when Envoy sends them: bodyless requests, and configurations that
//!    keep the phase, as Envoy Gateway's and GIE gateways'): read `:path`, `x-request-id`,
//!    `routing-strategy`, `content-length`. Reject a bad strategy (400) or an announced body
//!    over the limit (413). Without a body (`end_of_stream`), route now; otherwise CONTINUE.
//! 2. `request_body` (BUFFERED: the whole body in one message): when no request headers
//!    came, the same facts come as request attributes with this message
//!    ([`envoy_context::REQUEST_ATTRIBUTES`]) and the strategy is checked here. Extract model
//!    and prompt, hash outside the lock, route, reply with the destination (headers +
//!    `envoy.lb` metadata; Envoy applies the header mutation only when it still holds the
//!    headers, i.e. when it sent them, but needs one to clear its route cache). The message's
//!    `end_of_stream` is false when request trailers follow (an HTTP/2 or gRPC client); with
//!    `request_trailer_mode: SKIP` nothing more comes, so the body is routed whatever
//!    `end_of_stream` says.
//! 3. `response_headers`: add `target-pod`, `target-pod-ip`, `routing-strategy`,
//!    `request-id`, `x-kvroute-decision`; note the status for the ticket outcome. A 2xx
//!    event stream is timed when the [`crate::stream_timing`] budget allows: the reply asks
//!    Envoy to stream its body through kvroute.
//! 4. `response_body` (timed responses only): read, passed on unchanged.
//! 5. `response_trailers` (rare): no change.
//!
//! With `FULL_DUPLEX_STREAMED` bodies (as the first message's `protocol_config` says; how
//! Gateway API Inference Extension gateways call their picker) the request side differs:
//! the reply to the request headers is held back while the body's chunks are collected (no
//! reply to each); at the last chunk (`end_of_stream`) or at the request trailers the body
//! is extracted and routed as above, and the replies go out in order: the request-headers
//! reply with the destination ([`respond::route_in_headers`]), the body passed back in
//! pieces of at most 64 KiB, the last with `end_of_stream` (or the trailers' reply after
//! them). Each response body chunk is passed back as it comes. [`crate::duplex`] queues these
//! replies; [`StreamState::next_queued`] hands out those [`StreamState::on_message`] did not
//! return. Rejections are the same `ImmediateResponse`s.
//!
//! Held requests ([`crate::admission`]): when the router queues the request, the routing
//! reply is withheld. Envoy is first asked to extend the routing message's timer
//! ([`respond::extend_message_timeout`]; not with FULL_DUPLEX_STREAMED bodies, which have no
//! timer); the service's driver then awaits [`StreamState::verdict`] and sends what
//! [`StreamState::on_verdict`] makes of it: the routing reply exactly as for a request routed
//! at once, or the 429 of a shed request. A message Envoy sends meanwhile is kept and handled
//! after the verdict ([`StreamState::next_stashed`]). A stream dropped meanwhile drops the
//! [`crate::admission::Held`], which takes the request out of the queue.
//!
//! The [`TicketGuard`](crate::ticket_guard::TicketGuard) lives in this state and is dropped
//! when the stream ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use kvroute_core::StrategySpec;

use crate::admission::{AdmissionHeaders, Held, Verdict};
use crate::duplex::Outbox;
use crate::envoy_context;
use crate::respond::{self, header, Reject};
use crate::routing::{self, Admission, ResponseHead, RouteInputs, Routed, TimingPolicy};
use crate::shared::Shared;
use crate::tokenize::Tokenized;

pub use crate::routing::RequestInfo;

/// Reads the headers kvroute uses ([`RequestInfo::read_header`], and `admission`'s). Values
/// arrive in `raw_value` (Envoy 1.40); `value` is read as a fallback.
pub fn request_info(h: &HttpHeaders, admission: &AdmissionHeaders) -> RequestInfo {
    let mut info = RequestInfo::default();
    let Some(map) = &h.headers else { return info };
    for hv in &map.headers {
        let value = if hv.raw_value.is_empty() {
            hv.value.as_bytes()
        } else {
            &hv.raw_value
        };
        info.read_header(&hv.key, value);
        info.admission.read_header(admission, &hv.key, value);
    }
    info
}

/// Which Envoy message the routing decision answers.
#[derive(Debug)]
enum RoutingReply {
    /// The request headers (a request without a body).
    Headers,
    /// The whole BUFFERED body.
    Body,
    /// A FULL_DUPLEX_STREAMED request: the headers' reply, then the body passed back, then
    /// the trailers' reply when they ended the request.
    Duplex { body: Vec<u8>, trailers: bool },
}

/// A request admission holds, and the reply due once it is routed.
#[derive(Debug)]
struct Hold {
    held: Held,
    reply: RoutingReply,
}

/// Per-stream state. Dropping it releases the ticket, if any.
#[derive(Debug)]
pub struct StreamState {
    shared: Arc<Shared>,
    info: RequestInfo,
    strategy: Option<StrategySpec>,
    body: Vec<u8>,
    /// Whether Envoy sends the request body in chunks (`request_body_mode` STREAMED or
    /// FULL_DUPLEX_STREAMED, as its first message's `protocol_config` says) rather than in one
    /// message (BUFFERED, the shipped mode, assumed when Envoy does not say; BUFFERED_PARTIAL,
    /// whose one message is cut at Envoy's buffer limit: a cut body is a bad body, 400).
    body_in_chunks: bool,
    /// The request body comes `FULL_DUPLEX_STREAMED` (kvroute answers the request headers
    /// after the body, and passes the body back itself).
    duplex_request: bool,
    /// The response body comes `FULL_DUPLEX_STREAMED` (kvroute passes each chunk back).
    duplex_response: bool,
    /// Replies due beyond the one [`StreamState::on_message`] returned.
    outbox: Outbox,
    routed: Option<Routed>,
    rejected: bool,
    /// The request's facts were checked ([`RequestInfo::check`]): on the request headers, or,
    /// when Envoy skips them, on the request attributes at the body.
    checked: bool,
    /// The gateway's endpoint subset hint, if it passed one ([`crate::envoy_context`]).
    subset: Option<Vec<String>>,
    /// The body's tokenization, done before its message is handled
    /// ([`StreamState::tokenize_job`]); `None`: not done, the routing does it if needed.
    tokenized: Option<Option<Tokenized>>,
    /// The request admission holds, if it does.
    hold: Option<Hold>,
    /// Messages that came while the request was held, handled after its verdict.
    stashed: std::collections::VecDeque<ProcessingRequest>,
}

/// A request body to tokenize off the gRPC runtime ([`StreamState::tokenize_job`]).
#[derive(Debug)]
pub struct TokenizeJob {
    /// The request path (its endpoint decides how the body is read).
    pub path: String,
    /// The whole body.
    pub body: bytes::Bytes,
}

/// Set once a request body came with neither request headers nor request attributes.
static NO_REQUEST_FACTS_WARNED: AtomicBool = AtomicBool::new(false);

impl StreamState {
    /// A fresh stream.
    pub fn new(shared: Arc<Shared>) -> Self {
        StreamState {
            shared,
            info: RequestInfo::default(),
            strategy: None,
            body: Vec::new(),
            body_in_chunks: false,
            duplex_request: false,
            duplex_response: false,
            outbox: Outbox::default(),
            routed: None,
            rejected: false,
            checked: false,
            subset: None,
            tokenized: None,
            hold: None,
            stashed: std::collections::VecDeque::new(),
        }
    }

    /// The shared state.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The stream's end will not tell how the response ended (its connection was lost): the
    /// ticket, if any, is detached rather than released when the state is dropped.
    pub fn detach_ticket(&mut self) {
        if let Some(r) = &mut self.routed {
            r.guard.detach();
        }
    }

    /// Handles one message; `None` means no reply is due now (after a rejection Envoy sends
    /// nothing more, unknown message kinds need none, and with `FULL_DUPLEX_STREAMED` bodies
    /// the request headers and body chunks before the last wait for the body's end). Further
    /// replies this message made due come from [`StreamState::next_queued`], to be sent in
    /// order before the next message is read.
    pub fn on_message(&mut self, mut msg: ProcessingRequest) -> Option<ProcessingResponse> {
        if self.rejected {
            return None;
        }
        if self.hold.is_some() {
            self.stashed.push_back(msg);
            return None;
        }
        if self.routed.is_none() && self.subset.is_none() {
            self.subset = envoy_context::subset_hint(msg.metadata_context.as_ref());
        }
        if !self.checked && !msg.attributes.is_empty() {
            // The request attributes come with Envoy's first message of the request (the body
            // when it skips the headers); request headers, if they come, replace them.
            envoy_context::read_request_attributes(&msg.attributes, &mut self.info);
            let admission = &self.shared.settings().admission;
            self.info
                .admission
                .read_attributes(admission, &msg.attributes);
        }
        if let Some(p) = &msg.protocol_config {
            let chunked = [BodySendMode::Streamed, BodySendMode::FullDuplexStreamed];
            self.body_in_chunks = chunked.iter().any(|m| *m as i32 == p.request_body_mode);
            let duplex = BodySendMode::FullDuplexStreamed as i32;
            self.duplex_request = p.request_body_mode == duplex;
            self.duplex_response = p.response_body_mode == duplex;
        }
        let reply = match msg.request? {
            Request::RequestHeaders(h) => {
                // Full duplex: the headers are answered once the body is in.
                let hold = self.duplex_request && !h.end_of_stream;
                self.on_request_headers(&h).map(|r| r.filter(|_| !hold))
            }
            Request::RequestBody(b) if self.duplex_request => {
                self.on_duplex_request_body(b.body, b.end_of_stream)
            }
            Request::RequestBody(b) => {
                if self.routed.is_some() {
                    return Some(respond::continue_body(true));
                }
                self.on_request_body(b.body, b.end_of_stream)
            }
            Request::RequestTrailers(_) if self.duplex_request && self.routed.is_none() => {
                // The trailers end a full-duplex request: route on the body collected.
                self.route_duplex_body(true)
            }
            Request::RequestTrailers(_) => Ok(Some(respond::continue_trailers(true))),
            Request::ResponseHeaders(h) => {
                let details =
                    envoy_context::string_attribute(&msg.attributes, envoy_context::CODE_DETAILS);
                msg.attributes.clear();
                Ok(Some(self.on_response_headers(&h, details)))
            }
            Request::ResponseBody(b) => {
                if let Some(t) = self.routed.as_mut().and_then(|r| r.guard.timing_mut()) {
                    t.on_chunk(&b.body, std::time::Instant::now());
                }
                if self.duplex_response {
                    self.outbox.push_echo(false, b.body, b.end_of_stream);
                    Ok(self.outbox.pop())
                } else {
                    Ok(Some(respond::continue_body(false)))
                }
            }
            Request::ResponseTrailers(_) => Ok(Some(respond::continue_trailers(false))),
        };
        match reply {
            Ok(r) => r,
            Err(reject) => Some(self.reject(reject)),
        }
    }

    /// Answers the request with `reject` (an `ImmediateResponse`): nothing more is sent.
    fn reject(&mut self, reject: Reject) -> ProcessingResponse {
        self.rejected = true;
        routing::log_reject(&self.shared, self.info.request_id.as_deref(), &reject);
        // Nothing queued goes out after an immediate response.
        self.outbox = Outbox::default();
        reject.to_response(self.info.request_id.as_deref())
    }

    /// Whether admission holds the request (await [`StreamState::verdict`]).
    pub fn is_holding(&self) -> bool {
        self.hold.is_some()
    }

    /// The held request's verdict (pending forever when none is held). Cancel-safe.
    pub async fn verdict(&mut self) -> Verdict {
        match &mut self.hold {
            Some(h) => h.held.verdict().await,
            None => std::future::pending().await,
        }
    }

    /// The reply to a held request's verdict: the routing reply due (further ones queued for
    /// [`StreamState::next_queued`]), or the rejection's.
    pub fn on_verdict(&mut self, verdict: Verdict) -> Option<ProcessingResponse> {
        let hold = self.hold.take()?;
        match verdict {
            Verdict::Routed(routed) => self.routed_reply(routed, hold.reply),
            Verdict::Rejected(reject) => Some(self.reject(reject)),
        }
    }

    /// A message that came while the request was held, once it no longer is, in order.
    pub fn next_stashed(&mut self) -> Option<ProcessingRequest> {
        if self.hold.is_some() {
            return None;
        }
        self.stashed.pop_front()
    }

    /// What admission made of the request: the routing reply due now, or, for a held
    /// request, the timer extension (none with FULL_DUPLEX_STREAMED bodies: no timer).
    fn settle(&mut self, admission: Admission, reply: RoutingReply) -> Option<ProcessingResponse> {
        match admission {
            Admission::Routed(routed) => self.routed_reply(routed, reply),
            Admission::Held(held) => {
                let extend = (!self.duplex_request)
                    .then(|| respond::extend_message_timeout(held.message_timeout()));
                self.hold = Some(Hold { held, reply });
                extend
            }
        }
    }

    /// The routing reply for `routed` (queuing the duplex body's echo after it).
    fn routed_reply(
        &mut self,
        routed: Box<Routed>,
        reply: RoutingReply,
    ) -> Option<ProcessingResponse> {
        let to = routed.route_to();
        let first = match reply {
            RoutingReply::Headers => Some(respond::route_in_headers(&to)),
            RoutingReply::Body => Some(respond::route_in_body(&to)),
            RoutingReply::Duplex { body, trailers } => {
                self.outbox.push_reply(respond::route_in_headers(&to));
                self.outbox.push_echo(true, body, !trailers);
                if trailers {
                    self.outbox.push_reply(respond::continue_trailers(true));
                }
                self.outbox.pop()
            }
        };
        self.routed = Some(*routed);
        first
    }

    /// The tokenization `msg` needs before [`StreamState::on_message`] handles it: for a whole
    /// request body (BUFFERED, the shipped mode) not yet routed, when some model has a
    /// tokenizer. The caller runs it off the gRPC runtime ([`crate::service`]) and hands the
    /// result to [`StreamState::set_tokenized`]; without that, routing tokenizes inline.
    pub fn tokenize_job(&self, msg: &ProcessingRequest) -> Option<TokenizeJob> {
        let Some(Request::RequestBody(b)) = &msg.request else {
            return None;
        };
        if self.rejected
            || self.routed.is_some()
            || self.hold.is_some()
            || self.body_in_chunks
            || self.duplex_request
            || !self.body.is_empty()
            || b.body.is_empty()
            || self.shared.tokenizers().is_empty()
        {
            return None;
        }
        let path = if self.info.path.is_empty() {
            // With the request-headers phase skipped, the path comes with this message.
            let mut info = RequestInfo::default();
            envoy_context::read_request_attributes(&msg.attributes, &mut info);
            info.path
        } else {
            self.info.path.clone()
        };
        Some(TokenizeJob {
            path,
            body: bytes::Bytes::copy_from_slice(&b.body),
        })
    }

    /// The result of a [`TokenizeJob`], for the routing of the body that follows.
    pub fn set_tokenized(&mut self, tokenized: Option<Tokenized>) {
        self.tokenized = Some(tokenized);
    }

    /// The next reply due that [`StreamState::on_message`] did not return (full-duplex bodies
    /// only), in order.
    pub fn next_queued(&mut self) -> Option<ProcessingResponse> {
        self.outbox.pop()
    }

    /// A `FULL_DUPLEX_STREAMED` request body chunk: collected (within `max_body_bytes`, 413
    /// above it) without a reply; the last one routes.
    fn on_duplex_request_body(
        &mut self,
        chunk: Vec<u8>,
        end_of_stream: bool,
    ) -> Result<Option<ProcessingResponse>, Reject> {
        if self.routed.is_some() {
            // Not expected (the body ended already): passed on unchanged all the same.
            self.outbox.push_echo(true, chunk, end_of_stream);
            return Ok(self.outbox.pop());
        }
        let limit = self.shared.settings().max_body_bytes;
        if self.body.len().saturating_add(chunk.len()) > limit {
            return Err(Reject::TooLarge { limit });
        }
        if self.body.is_empty() {
            self.body = chunk;
        } else {
            self.body.extend_from_slice(&chunk);
        }
        if !end_of_stream {
            return Ok(None);
        }
        self.route_duplex_body(false)
    }

    /// Routes a full-duplex request on its whole body, then queues the replies (now, or once
    /// a held request is routed): the request headers' (the destination), the body passed
    /// back (ending the stream unless `trailers` end it), and the trailers' when they came.
    fn route_duplex_body(&mut self, trailers: bool) -> Result<Option<ProcessingResponse>, Reject> {
        let body = std::mem::take(&mut self.body);
        let admission = self.admit_body(&body)?;
        Ok(self.settle(admission, RoutingReply::Duplex { body, trailers }))
    }

    fn on_request_headers(
        &mut self,
        h: &HttpHeaders,
    ) -> Result<Option<ProcessingResponse>, Reject> {
        let settings = self.shared.settings();
        self.info = request_info(h, &settings.admission);
        self.checked = true;
        self.strategy = self.info.check(settings.max_body_bytes)?;
        if h.end_of_stream {
            let admission = routing::admit_without_body(&self.shared, self.inputs())?;
            return Ok(self.settle(admission, RoutingReply::Headers));
        }
        Ok(Some(respond::continue_request_headers()))
    }

    fn on_request_body(
        &mut self,
        chunk: Vec<u8>,
        end_of_stream: bool,
    ) -> Result<Option<ProcessingResponse>, Reject> {
        let limit = self.shared.settings().max_body_bytes;
        if !self.checked {
            // No request headers (request_header_mode: SKIP): the strategy is checked on the
            // request attributes that came with this first message.
            self.checked = true;
            if self.info.path.is_empty() && !NO_REQUEST_FACTS_WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "a request body came without request headers or request attributes: \
                     routing on the body's model only; with request_header_mode SKIP, Envoy's \
                     ext_proc filter needs the request_attributes of envoy/envoy.template.yaml"
                );
            }
            self.strategy = self.info.check(limit)?;
        }
        if self.body.len().saturating_add(chunk.len()) > limit {
            return Err(Reject::TooLarge { limit });
        }
        if self.body.is_empty() {
            self.body = chunk;
        } else {
            self.body.extend_from_slice(&chunk);
        }
        if self.body_in_chunks && !end_of_stream {
            // STREAMED: a misconfiguration that cannot route, since Envoy sends the headers
            // upstream after its reply to them, before the body is here (measured against
            // Envoy 1.40). Collect and route at the last chunk anyway; the decision takes
            // effect only if the whole body came at once. (FULL_DUPLEX_STREAMED has its own
            // path: kvroute answers the headers after the body.)
            return Ok(Some(respond::continue_body(true)));
        }
        // BUFFERED (or BUFFERED_PARTIAL): this one message is the whole body (or all of it
        // Envoy will send), also when `end_of_stream` is false (request trailers follow, and
        // `request_trailer_mode: SKIP` keeps them from kvroute).
        // Waiting for more would let the request go un-routed to the fallback route.
        let body = std::mem::take(&mut self.body);
        let admission = self.admit_body(&body)?;
        Ok(self.settle(admission, RoutingReply::Body))
    }

    /// Admits the request on its whole `body` (with its tokenization, when done).
    fn admit_body(&mut self, body: &[u8]) -> Result<Admission, Reject> {
        let tokenized = self.tokenized.take();
        routing::admit_body(&self.shared, self.inputs(), body, tokenized)
    }

    fn inputs(&self) -> RouteInputs<'_> {
        RouteInputs {
            info: &self.info,
            strategy: self.strategy.as_ref(),
            subset: self.subset.as_deref(),
        }
    }

    fn on_response_headers(
        &mut self,
        h: &HttpHeaders,
        code_details: Option<String>,
    ) -> ProcessingResponse {
        let value = |name: &str| {
            h.headers.as_ref().and_then(|m| {
                m.headers.iter().find(|v| v.key == name).and_then(|v| {
                    let s = if v.raw_value.is_empty() {
                        v.value.as_bytes()
                    } else {
                        &v.raw_value
                    };
                    std::str::from_utf8(s).ok()
                })
            })
        };
        let head = ResponseHead {
            status: value(":status").and_then(|s| s.parse::<u16>().ok()),
            content_type: value("content-type"),
        };
        // Full duplex: every chunk comes through kvroute anyway (one round trip each, paid
        // by the mode), so timing needs neither the budget nor a mode override.
        let policy = if self.duplex_response {
            TimingPolicy::Free
        } else {
            TimingPolicy::Budgeted
        };
        let (headers, timed) = routing::on_response_headers(
            &self.shared,
            self.routed.as_mut(),
            self.info.request_id.as_deref(),
            head,
            code_details,
            policy,
        );
        let headers = headers.into_iter().map(|(k, v)| header(k, v)).collect();
        respond::response_headers(headers, timed)
    }
}

#[cfg(test)]
mod tests;
