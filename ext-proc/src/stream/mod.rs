//! One HTTP request's ext_proc exchange: a state machine fed with Envoy's messages, answering
//! each with exactly one `ProcessingResponse` (or failing the stream with a `Status`, never
//! ending it with OK: that would let Envoy continue un-routed, gotcha 8), except with
//! `FULL_DUPLEX_STREAMED` bodies (below).
//!
//! Flow with the shipped config (request headers SEND, request body BUFFERED, response
//! headers SEND or SKIP, response trailers SEND):
//! 1. `request_headers`: read `:path`, `x-request-id`, `routing-strategy`, `content-length`.
//!    Reject a bad strategy (400) or an announced body over the limit (413). Without a body
//!    (`end_of_stream`), route now; otherwise CONTINUE.
//! 2. `request_body` (BUFFERED: the whole body in one message): extract model and prompt,
//!    hash outside the lock, route, reply with the destination (headers + `envoy.lb`
//!    metadata). The message's `end_of_stream` is false when request trailers follow (an
//!    HTTP/2 or gRPC client); with `request_trailer_mode: SKIP` nothing more comes, so the
//!    body is routed whatever `end_of_stream` says.
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
//! The [`TicketGuard`] lives in this state and is dropped when the stream ends.

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use kvroute_core::{Decision, RouteError, RouteRequest, StrategySpec};

use crate::duplex::Outbox;
use crate::envoy_context;
use crate::extract::{extract, reject, Endpoint};
use crate::health::ResponseEnd;
use crate::respond::{self, echoed_value, header, Reject, RouteTo};
use crate::shared::Shared;
use crate::stream_timing::{self, is_event_stream, ResponseTiming};
use crate::ticket_guard::TicketGuard;

/// Request facts read from the request headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// `:path`
    pub path: String,
    /// `x-request-id` (Envoy generates one when the client sent none).
    pub request_id: Option<String>,
    /// `routing-strategy`, when present and not blank.
    pub strategy: Option<String>,
    /// `content-length`, when present and numeric.
    pub content_length: Option<u64>,
    /// `model` header (used for requests without a body).
    pub model: Option<String>,
}

impl RequestInfo {
    /// Reads the headers kvroute uses. Values arrive in `raw_value` (Envoy 1.40); `value` is
    /// read as a fallback. Non-UTF-8 values count as absent, except a `routing-strategy`,
    /// which is kept (lossily) so that it gets the 400 of an invalid strategy.
    pub fn from_headers(h: &HttpHeaders) -> RequestInfo {
        let mut info = RequestInfo::default();
        let Some(map) = &h.headers else { return info };
        for hv in &map.headers {
            let value = if hv.raw_value.is_empty() {
                Some(hv.value.as_str())
            } else {
                std::str::from_utf8(&hv.raw_value).ok()
            };
            let Some(value) = value else {
                // Not UTF-8: a strategy that cannot be valid gets the same 400 as any other.
                if hv.key == "routing-strategy" {
                    info.strategy = Some(String::from_utf8_lossy(&hv.raw_value).into_owned());
                }
                continue;
            };
            match hv.key.as_str() {
                ":path" => info.path = value.to_owned(),
                "x-request-id" => info.request_id = Some(value.to_owned()),
                "routing-strategy" if !value.trim().is_empty() => {
                    info.strategy = Some(value.to_owned())
                }
                "content-length" => info.content_length = value.trim().parse().ok(),
                "model" if !value.is_empty() => info.model = Some(value.to_owned()),
                _ => {}
            }
        }
        info
    }
}

/// What the decision left for the response headers and the guard.
#[derive(Debug)]
struct Routed {
    pod_name: Arc<str>,
    address: Arc<str>,
    strategy: String,
    /// Rendered only when the response-headers phase asks for `x-kvroute-decision`.
    decision: Decision,
    guard: TicketGuard,
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
    /// The gateway's endpoint subset hint, if it passed one ([`crate::envoy_context`]).
    subset: Option<Vec<String>>,
}

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
            subset: None,
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
        if self.routed.is_none() && self.subset.is_none() {
            self.subset = envoy_context::subset_hint(msg.metadata_context.as_ref());
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
                self.on_request_headers(&h).map(|r| (!hold).then_some(r))
            }
            Request::RequestBody(b) if self.duplex_request => {
                self.on_duplex_request_body(b.body, b.end_of_stream)
            }
            Request::RequestBody(b) => {
                if self.routed.is_some() {
                    return Some(respond::continue_body(true));
                }
                self.on_request_body(b.body, b.end_of_stream).map(Some)
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
            Err(reject) => {
                self.rejected = true;
                self.shared.metrics.reject(reject.kind());
                if let Reject::BadBody(reason) = &reject {
                    tracing::debug!(
                        request_id = self.info.request_id.as_deref().unwrap_or(""),
                        reason,
                        "request body rejected"
                    );
                }
                tracing::info!(
                    request_id = self.info.request_id.as_deref().unwrap_or(""),
                    status = reject.status(),
                    kind = reject.kind(),
                    "rejected"
                );
                // Nothing queued goes out after an immediate response.
                self.outbox = Outbox::default();
                Some(reject.to_response(self.info.request_id.as_deref()))
            }
        }
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

    /// Routes a full-duplex request on its whole body, then queues the replies: the request
    /// headers' (the destination), the body passed back (ending the stream unless
    /// `trailers` end it), and the trailers' when they came.
    fn route_duplex_body(&mut self, trailers: bool) -> Result<Option<ProcessingResponse>, Reject> {
        let (body, to) = self.route_collected_body()?;
        self.outbox
            .push_reply(respond::route_in_headers(&to.as_route_to()));
        self.outbox.push_echo(true, body, !trailers);
        if trailers {
            self.outbox.push_reply(respond::continue_trailers(true));
        }
        Ok(self.outbox.pop())
    }

    fn on_request_headers(&mut self, h: &HttpHeaders) -> Result<ProcessingResponse, Reject> {
        self.info = RequestInfo::from_headers(h);
        if let Some(s) = &self.info.strategy {
            self.strategy =
                Some(StrategySpec::parse(s).map_err(|_| Reject::BadStrategy(s.trim().to_owned()))?);
        }
        let limit = self.shared.settings().max_body_bytes;
        if self.info.content_length.is_some_and(|n| n > limit as u64) {
            return Err(Reject::TooLarge { limit });
        }
        if h.end_of_stream {
            let model = self
                .info
                .model
                .clone()
                .or_else(|| self.shared.settings().default_model.clone());
            let to = self.route(model.as_deref().unwrap_or(""), &[], None)?;
            return Ok(respond::route_in_headers(&to.as_route_to()));
        }
        Ok(respond::continue_request_headers())
    }

    fn on_request_body(
        &mut self,
        chunk: Vec<u8>,
        end_of_stream: bool,
    ) -> Result<ProcessingResponse, Reject> {
        let limit = self.shared.settings().max_body_bytes;
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
            return Ok(respond::continue_body(true));
        }
        // BUFFERED (or BUFFERED_PARTIAL): this one message is the whole body (or all of it
        // Envoy will send), also when `end_of_stream` is false (request trailers follow, and
        // `request_trailer_mode: SKIP` keeps them from kvroute).
        // Waiting for more would let the request go un-routed to the fallback route.
        let (_, to) = self.route_collected_body()?;
        Ok(respond::route_in_body(&to.as_route_to()))
    }

    /// Extracts the model and prompt from the body collected so far and routes on them;
    /// returns the body (taken from the state) and where the request goes.
    fn route_collected_body(&mut self) -> Result<(Vec<u8>, RoutedView), Reject> {
        let endpoint = Endpoint::from_path(&self.info.path);
        let body = std::mem::take(&mut self.body);
        let extracted = extract(endpoint, &body).map_err(reject)?;
        let model = extracted.model.as_deref().unwrap_or("");
        let to = self.route(
            model,
            extracted.prompt.as_bytes(),
            extracted.max_output_tokens,
        )?;
        drop(extracted);
        Ok((body, to))
    }

    /// Hashes `prompt` outside the router lock, then routes under it (with the body's
    /// output-token limit, if any). A reload that changes the hashing between the two locks
    /// only costs this request its prefix match.
    fn route(
        &mut self,
        model: &str,
        prompt: &[u8],
        max_output_tokens: Option<u32>,
    ) -> Result<RoutedView, Reject> {
        let settings = self.shared.settings();
        let model = settings.routing_model.as_deref().unwrap_or(model);
        let hash = self.shared.router.lock().hash_config();
        let hashes = hash.hashes(prompt);
        let subset: Option<Vec<&str>> = self
            .subset
            .as_ref()
            .map(|s| s.iter().map(String::as_str).collect());
        let now = self.shared.now();
        let started = std::time::Instant::now();
        let req = RouteRequest {
            model,
            strategy: self.strategy.as_ref(),
            hashes: &hashes,
            max_output_tokens,
            endpoint_subset: subset.as_deref(),
        };
        let result = self.shared.router.lock().route(req, now);
        let decision = match result {
            Ok(d) => d,
            Err(RouteError::UnknownModel) => return Err(Reject::UnknownModel(model.to_owned())),
            Err(RouteError::NoPodInSubset) => return Err(Reject::NoPodInSubset(model.to_owned())),
            Err(_) => return Err(Reject::NoReadyPod(model.to_owned())),
        };
        let guard = TicketGuard::new(
            self.shared.clone(),
            decision.ticket,
            Arc::from(model),
            decision.pod_name.clone(),
        );
        self.shared.metrics.observe_prediction(
            model,
            &decision.pod_name,
            f64::from(decision.prediction.ttft_ms) / 1_000.0,
        );
        self.shared
            .metrics
            .observe_routing(model, started.elapsed().as_secs_f64());
        let strategy = match &self.info.strategy {
            Some(s) => s.clone(),
            None => self.shared.settings().default_strategy_text.clone(),
        };
        self.shared
            .decisions
            .record(self.info.request_id.as_deref(), model, &strategy, &decision);
        tracing::debug!(
            request_id = self.info.request_id.as_deref().unwrap_or(""),
            pod = &*decision.pod_name,
            reason = decision.reason.as_str(),
            decision = %decision,
            "routed"
        );
        let routed = Routed {
            pod_name: decision.pod_name.clone(),
            address: decision.address.clone(),
            strategy,
            decision,
            guard,
        };
        let view = RoutedView {
            address: routed.address.clone(),
            strategy: routed.strategy.clone(),
        };
        self.routed = Some(routed);
        Ok(view)
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
        let status = value(":status").and_then(|s| s.parse::<u16>().ok());
        let mut headers = Vec::with_capacity(5);
        let mut timed = false;
        let settings = self.shared.settings();
        if let Some(r) = &mut self.routed {
            r.guard.on_response(ResponseEnd {
                headers_seen: true,
                status,
                code_details,
            });
            if status.is_some_and(|s| (200..300).contains(&s))
                && value("content-type").is_some_and(is_event_stream)
            {
                if self.duplex_response {
                    // Every chunk comes through kvroute anyway (one round trip each, paid by
                    // the mode): timed without the budget and without a mode override.
                    if settings.max_timed_streams > 0 {
                        r.guard.time_response(ResponseTiming::unbudgeted());
                        self.shared.metrics.response_timed();
                    }
                } else {
                    let cold_prefill = r
                        .decision
                        .prediction
                        .is_cold_prefill(settings.engine_block_tokens);
                    let max = stream_timing::budget_for(settings.max_timed_streams, cold_prefill);
                    if let Some(permit) = self.shared.stream_budget.try_acquire(max) {
                        r.guard.time_response(ResponseTiming::new(permit));
                        self.shared.metrics.response_timed();
                        timed = true;
                    }
                }
            }
            if settings.expose_pod_headers {
                headers.push(header("target-pod", r.pod_name.as_bytes()));
                headers.push(header("target-pod-ip", r.address.as_bytes()));
            }
            headers.push(header("routing-strategy", r.strategy.as_bytes()));
            if settings.expose_pod_headers {
                headers.push(header("x-kvroute-decision", r.decision.to_string()));
            }
        }
        if let Some(id) = &self.info.request_id {
            headers.push(header("request-id", echoed_value(id)));
        }
        respond::response_headers(headers, timed)
    }
}

/// The parts of a decision the routing reply needs.
#[derive(Debug)]
struct RoutedView {
    address: Arc<str>,
    strategy: String,
}

impl RoutedView {
    fn as_route_to(&self) -> RouteTo<'_> {
        RouteTo {
            address: &self.address,
            strategy: &self.strategy,
        }
    }
}

#[cfg(test)]
mod tests;
