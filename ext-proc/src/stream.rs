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
            // STREAMED or FULL_DUPLEX_STREAMED: a misconfiguration that cannot route, since
            // Envoy sends the headers upstream after its reply to them, before the body is
            // here (measured against Envoy 1.40). Collect and route at the last chunk
            // anyway; the decision takes effect only if the whole body came at once.
            return Ok(respond::continue_body(true));
        }
        // BUFFERED (or BUFFERED_PARTIAL): this one message is the whole body (or all of it
        // Envoy will send), also when `end_of_stream` is false (request trailers follow, and
        // `request_trailer_mode: SKIP` keeps them from kvroute).
        // Waiting for more would let the request go un-routed to the fallback route.
        let endpoint = Endpoint::from_path(&self.info.path);
        let body = std::mem::take(&mut self.body);
        let extracted = extract(endpoint, &body).map_err(reject)?;
        let model = extracted.model.as_deref().unwrap_or("");
        let to = self.route(
            model,
            extracted.prompt.as_bytes(),
            extracted.max_output_tokens,
        )?;
        Ok(respond::route_in_body(&to.as_route_to()))
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
        let guard = TicketGuard::new(self.shared.clone(), decision.ticket);
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
mod tests {
    use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
    use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
    use envoy_types::pb::envoy::service::ext_proc::v3::HttpBody;

    use super::*;
    use crate::config::from_toml;

    fn shared() -> Arc<Shared> {
        shared_with("[routing]\nseed = 3\n[limits]\nmax_body_bytes = 1000\n[models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\" }, { name = \"b\", address = \"10.0.0.2:80\" }]")
    }

    fn shared_with(text: &str) -> Arc<Shared> {
        let c = from_toml(text);
        Shared::new(&c, &mut prometheus_client::registry::Registry::default()).unwrap()
    }

    fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> ProcessingRequest {
        let headers = pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).into(),
                raw_value: v.as_bytes().to_vec(),
                ..Default::default()
            })
            .collect();
        let h = HttpHeaders {
            headers: Some(HeaderMap { headers }),
            end_of_stream,
            ..Default::default()
        };
        ProcessingRequest {
            request: Some(Request::RequestHeaders(h)),
            ..Default::default()
        }
    }

    fn body(b: &str) -> ProcessingRequest {
        body_part(b, true)
    }

    fn body_part(b: &str, end_of_stream: bool) -> ProcessingRequest {
        let b = HttpBody {
            body: b.as_bytes().to_vec(),
            end_of_stream,
            ..Default::default()
        };
        ProcessingRequest {
            request: Some(Request::RequestBody(b)),
            ..Default::default()
        }
    }

    /// Request headers of a POST as Envoy sends them first, saying its request body mode.
    fn post_headers(mode: Option<BodySendMode>) -> ProcessingRequest {
        use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;
        let mut h = headers(&[(":path", "/v1/completions")], false);
        h.protocol_config = mode.map(|m| ProtocolConfiguration {
            request_body_mode: m as i32,
            ..Default::default()
        });
        h
    }

    fn is_routing_reply(r: &ProcessingResponse) -> bool {
        matches!(r.response, Some(Response::RequestBody(_))) && r.dynamic_metadata.is_some()
    }

    fn response_headers(status: &str) -> ProcessingRequest {
        let mut r = headers(&[(":status", status)], false);
        if let Some(Request::RequestHeaders(h)) = r.request.take() {
            r.request = Some(Request::ResponseHeaders(h));
        }
        r
    }

    /// The names of the headers a response-headers reply sets.
    fn header_keys(r: ProcessingResponse) -> Vec<String> {
        let Some(Response::ResponseHeaders(h)) = r.response else {
            panic!("no response-headers reply: {r:?}")
        };
        h.response
            .unwrap()
            .header_mutation
            .unwrap()
            .set_headers
            .into_iter()
            .map(|o| o.header.unwrap().key)
            .collect()
    }

    fn in_flight(s: &Shared) -> u32 {
        s.router.lock().pods().iter().map(|p| p.in_flight).sum()
    }

    #[test]
    fn post_is_routed_on_the_body_and_released_on_drop() {
        let sh = shared();
        let mut st = StreamState::new(sh.clone());
        let r = st
            .on_message(headers(
                &[(":path", "/v1/completions"), ("x-request-id", "r1")],
                false,
            ))
            .unwrap();
        assert!(
            matches!(r.response, Some(Response::RequestHeaders(_))) && r.dynamic_metadata.is_none()
        );
        let r = st
            .on_message(body(r#"{"model":"m","prompt":"hello"}"#))
            .unwrap();
        assert!(
            matches!(r.response, Some(Response::RequestBody(_))) && r.dynamic_metadata.is_some()
        );
        assert_eq!(in_flight(&sh), 1);
        let keys = header_keys(st.on_message(response_headers("200")).unwrap());
        assert_eq!(
            keys,
            [
                "target-pod",
                "target-pod-ip",
                "routing-strategy",
                "x-kvroute-decision",
                "request-id"
            ]
        );
        drop(st);
        assert_eq!(in_flight(&sh), 0);
        assert_eq!(
            sh.router
                .lock()
                .stats()
                .tickets
                .completed
                .iter()
                .sum::<u64>(),
            1
        );
    }

    #[test]
    fn a_buffered_body_followed_by_trailers_is_routed() {
        // BUFFERED: Envoy sends the whole body in one message, with end_of_stream false when
        // request trailers follow (an HTTP/2 client); they never reach kvroute (SKIP).
        for mode in [
            Some(BodySendMode::Buffered),
            Some(BodySendMode::BufferedPartial),
            None,
        ] {
            let sh = shared();
            let mut st = StreamState::new(sh.clone());
            st.on_message(post_headers(mode)).unwrap();
            let r = st
                .on_message(body_part(r#"{"model":"m","prompt":"hello"}"#, false))
                .unwrap();
            assert!(is_routing_reply(&r), "{mode:?}: not routed: {r:?}");
            assert_eq!(in_flight(&sh), 1);
        }
    }

    #[test]
    fn a_streamed_body_is_collected_and_routed_at_its_last_chunk() {
        let sh = shared();
        let mut st = StreamState::new(sh.clone());
        st.on_message(post_headers(Some(BodySendMode::Streamed)))
            .unwrap();
        let r = st.on_message(body_part(r#"{"model":"m","#, false)).unwrap();
        assert!(!is_routing_reply(&r) && in_flight(&sh) == 0, "{r:?}");
        let r = st
            .on_message(body_part(r#""prompt":"hello"}"#, true))
            .unwrap();
        assert!(is_routing_reply(&r), "{r:?}");
        assert_eq!(in_flight(&sh), 1);
    }

    #[test]
    fn a_body_over_the_limit_without_content_length_gets_413() {
        // No content-length (chunked or HTTP/2): the limit is checked on the body itself.
        let sh = shared(); // max_body_bytes = 1000
        for (mode, parts) in [
            (Some(BodySendMode::Buffered), vec![1001]),
            (Some(BodySendMode::Streamed), vec![600, 401]),
        ] {
            let mut st = StreamState::new(sh.clone());
            st.on_message(post_headers(mode)).unwrap();
            let last = parts
                .iter()
                .filter_map(|n| st.on_message(body_part(&"x".repeat(*n), false)))
                .last()
                .unwrap();
            let Some(Response::ImmediateResponse(i)) = last.response else {
                panic!("{mode:?}: not rejected: {last:?}")
            };
            assert_eq!(i.status.unwrap().code, 413);
            let marker = i
                .headers
                .unwrap()
                .set_headers
                .into_iter()
                .any(|h| h.header.unwrap().key == "x-error-request-body-processing");
            assert!(marker);
        }
        let mut st = StreamState::new(sh.clone());
        st.on_message(post_headers(None)).unwrap();
        let at_limit = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(975));
        assert_eq!(at_limit.len(), 1000);
        assert!(is_routing_reply(&st.on_message(body(&at_limit)).unwrap()));
        assert_eq!(sh.router.lock().stats().tickets.issued, 1);
    }

    #[test]
    fn a_model_removed_by_a_reload_is_unknown_again() {
        let pod = "pods = [{ name = \"a\", address = \"10.0.0.1:80\" }]";
        let sh = Shared::new(
            &from_toml(&format!(
                "[models.m]\n{pod}\n[models.gone]\n{pod}\n[models.empty]\nallow_no_pods = true\npods = []"
            )),
            &mut prometheus_client::registry::Registry::default(),
        )
        .unwrap();
        let status = |model: &str| {
            let mut st = StreamState::new(sh.clone());
            st.on_message(headers(&[(":path", "/v1/completions")], false));
            let text = format!(r#"{{"model":"{model}","prompt":"hi"}}"#);
            match st.on_message(body(&text)).unwrap().response {
                Some(Response::ImmediateResponse(i)) => {
                    let j: serde_json::Value = serde_json::from_slice(&i.body).unwrap();
                    (i.status.unwrap().code, j["error"]["code"].clone())
                }
                _ => (200, serde_json::Value::Null),
            }
        };
        assert_eq!(status("gone").0, 200);
        assert_eq!(status("empty").0, 503);
        sh.apply(&from_toml(&format!("[models.m]\n{pod}"))).unwrap();
        for model in ["gone", "empty"] {
            assert_eq!(status(model), (400, "model_not_found".into()), "{model}");
        }
        assert_eq!(status("m").0, 200);
        // Added back, served again.
        sh.apply(&from_toml(&format!(
            "[models.m]\n{pod}\n[models.gone]\n{pod}"
        )))
        .unwrap();
        assert_eq!(status("gone").0, 200);
    }

    #[test]
    fn the_bodys_output_token_limit_reaches_the_router() {
        let queue_behind = |body_text: &str| {
            let sh = shared_with("[routing]\nseed = 3\ndefault_strategy = \"least-ttft\"\n[ttft]\nmax_seqs = 1\n[models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\" }]");
            let mut st = StreamState::new(sh.clone());
            st.on_message(headers(&[(":path", "/v1/completions")], false))
                .unwrap();
            st.on_message(body(body_text)).unwrap();
            let next = sh
                .router
                .lock()
                .route(RouteRequest::new("m", &[]), sh.now());
            next.unwrap().prediction.queue_ms
        };
        let unlimited = queue_behind(r#"{"model":"m","prompt":"hello"}"#);
        let limited = queue_behind(r#"{"model":"m","prompt":"hello","max_tokens":2}"#);
        assert!(limited < unlimited / 10, "{limited} vs {unlimited}");
    }

    #[test]
    fn get_is_routed_in_the_header_phase() {
        let sh = shared();
        let mut st = StreamState::new(sh.clone());
        let r = st
            .on_message(headers(&[(":path", "/v1/models")], true))
            .unwrap();
        assert!(
            matches!(r.response, Some(Response::RequestHeaders(_))) && r.dynamic_metadata.is_some()
        );
        assert_eq!(in_flight(&sh), 1);
        drop(st);
        assert_eq!(in_flight(&sh), 0);
    }

    #[test]
    fn rejections_take_no_ticket_and_end_the_exchange() {
        let sh = shared();
        let cases: Vec<(Vec<ProcessingRequest>, u16)> = vec![
            (
                vec![headers(
                    &[(":path", "/v1/completions"), ("routing-strategy", "nope")],
                    false,
                )],
                400,
            ),
            (
                vec![headers(
                    &[(":path", "/v1/completions"), ("content-length", "5000")],
                    false,
                )],
                413,
            ),
            (
                vec![headers(&[(":path", "/v1/completions")], false), body("{")],
                400,
            ),
            (
                vec![
                    headers(&[(":path", "/v1/completions")], false),
                    body(r#"{"model":"x"}"#),
                ],
                400,
            ),
            (
                vec![
                    headers(&[(":path", "/v1/chat/completions")], false),
                    body(r#"{"model":"m"}"#),
                ],
                400,
            ),
        ];
        for (msgs, status) in cases {
            let mut st = StreamState::new(sh.clone());
            let last = msgs
                .into_iter()
                .filter_map(|m| st.on_message(m))
                .last()
                .unwrap();
            let Some(Response::ImmediateResponse(i)) = last.response else {
                panic!("not rejected")
            };
            assert_eq!(i.status.unwrap().code, i32::from(status));
            assert!(
                st.on_message(response_headers("200")).is_none(),
                "replied after a rejection"
            );
            assert_eq!(in_flight(&sh), 0);
        }
        assert_eq!(sh.router.lock().stats().tickets.issued, 0);
    }

    #[test]
    fn a_model_without_pods_answers_503_and_capacities_follow_reloads() {
        let text = |cap: &str| {
            format!("[ttft]\nmax_seqs = 8\n[models.empty]\nallow_no_pods = true\npods = []\n[models.m]\npods = [{{ name = \"a\", address = \"10.0.0.1:80\"{cap} }}]")
        };
        let sh = Shared::new(
            &from_toml(&text(", max_seqs = 3")),
            &mut prometheus_client::registry::Registry::default(),
        )
        .unwrap();
        let max_seqs = |sh: &Shared| sh.router.lock().pods()[0].max_seqs;
        assert_eq!(max_seqs(&sh), 3);
        sh.apply(&from_toml(&text(""))).unwrap();
        assert_eq!(max_seqs(&sh), 8, "a removed override falls back to [ttft]");

        let mut st = StreamState::new(sh.clone());
        st.on_message(headers(&[(":path", "/v1/completions")], false));
        let r = st
            .on_message(body(r#"{"model":"empty","prompt":"hi"}"#))
            .unwrap();
        let Some(Response::ImmediateResponse(i)) = r.response else {
            panic!("not rejected")
        };
        assert_eq!(i.status.unwrap().code, 503);
    }

    fn response_body(b: &[u8]) -> ProcessingRequest {
        ProcessingRequest {
            request: Some(Request::ResponseBody(HttpBody {
                body: b.to_vec(),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn event_streams_are_timed_within_the_budget() {
        let sh = shared_with("[stream_timing]\nmax_streams = 1\n[models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\" }]");
        let respond = |st: &mut StreamState, pairs: &[(&str, &str)]| {
            let mut r = headers(pairs, false);
            if let Some(Request::RequestHeaders(h)) = r.request.take() {
                r.request = Some(Request::ResponseHeaders(h));
            }
            st.on_message(r).unwrap().mode_override
        };
        let sse = [(":status", "200"), ("content-type", "text/event-stream")];
        let routed = || {
            let mut st = StreamState::new(sh.clone());
            st.on_message(headers(&[(":path", "/v1/models")], true));
            st
        };
        let (mut a, mut b, mut json, mut failed) = (routed(), routed(), routed(), routed());
        let mode = respond(&mut a, &sse).expect("the first event stream is timed");
        assert_eq!(mode, respond::stream_body_mode());
        assert_eq!(respond(&mut b, &sse), None, "over the budget of 1");
        let not_sse = [(":status", "200"), ("content-type", "application/json")];
        assert_eq!(respond(&mut json, &not_sse), None);
        drop(a);
        let err = [(":status", "500"), ("content-type", "text/event-stream")];
        assert_eq!(respond(&mut failed, &err), None, "only 2xx responses");
        assert_eq!(
            sh.stream_budget.open(),
            0,
            "the permit came back with the stream"
        );
        let mut c = routed();
        assert!(respond(&mut c, &sse).is_some());
        let reply = c.on_message(response_body(b"data: {}\n\n")).unwrap();
        assert!(matches!(reply.response, Some(Response::ResponseBody(_))));
        assert_eq!(sh.stream_budget.open(), 1);
        drop((b, json, failed, c));
        assert_eq!(sh.stream_budget.open(), 0);
        assert_eq!(in_flight(&sh), 0);
    }

    fn immediate(r: &ProcessingResponse) -> (i32, serde_json::Value) {
        let Some(Response::ImmediateResponse(i)) = &r.response else {
            panic!("not rejected: {r:?}")
        };
        let code = i.status.as_ref().unwrap().code;
        (code, serde_json::from_slice(&i.body).unwrap())
    }

    #[test]
    fn the_gateways_subset_hint_restricts_the_pods() {
        use envoy_types::pb::envoy::config::core::v3::Metadata;
        use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
        let hint = |list: &str| {
            let mut h = headers(&[(":path", "/v1/models")], true);
            let value = Value {
                kind: Some(Kind::StringValue(list.to_owned())),
            };
            let hint = Struct {
                fields: [(envoy_context::SUBSET_HINT_KEY.to_owned(), value)]
                    .into_iter()
                    .collect(),
            };
            h.metadata_context = Some(Metadata {
                filter_metadata: [(envoy_context::SUBSET_HINT_NAMESPACE.to_owned(), hint)]
                    .into_iter()
                    .collect(),
                ..Default::default()
            });
            h
        };
        let sh = shared();
        for _ in 0..8 {
            let mut st = StreamState::new(sh.clone());
            let r = st.on_message(hint("10.0.0.2:80")).unwrap();
            assert!(r.dynamic_metadata.is_some(), "{r:?}");
            let to = st.routed.as_ref().unwrap().address.clone();
            assert_eq!(&*to, "10.0.0.2:80");
        }
        let mut st = StreamState::new(sh.clone());
        let (code, body) = immediate(&st.on_message(hint("10.9.9.9:1")).unwrap());
        assert_eq!(code, 503);
        assert_eq!(body["error"]["code"], "service_unavailable");
        assert_eq!(in_flight(&sh), 0);
    }

    #[test]
    fn a_routing_strategy_that_is_not_utf8_is_a_bad_strategy() {
        let sh = shared();
        let mut st = StreamState::new(sh.clone());
        let mut h = headers(&[(":path", "/v1/models")], true);
        if let Some(Request::RequestHeaders(hh)) = &mut h.request {
            hh.headers.as_mut().unwrap().headers.push(HeaderValue {
                key: "routing-strategy".into(),
                raw_value: vec![0xff, b'x'],
                ..Default::default()
            });
        }
        let (code, body) = immediate(&st.on_message(h).unwrap());
        assert_eq!(code, 400);
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("incorrect routing strategy"));
    }

    #[test]
    fn pod_headers_are_hidden_when_the_setting_says_so() {
        let sh = shared_with("[routing]\nexpose_pod_headers = false\n[models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\" }]");
        let mut st = StreamState::new(sh.clone());
        st.on_message(headers(&[(":path", "/v1/models")], true));
        let keys = header_keys(st.on_message(response_headers("200")).unwrap());
        assert_eq!(keys, ["routing-strategy"]);
    }

    #[test]
    fn envoys_code_details_decide_the_outcome() {
        use std::collections::HashMap;
        let sh = shared();
        let with_details = |status: &str, details: &str| {
            let mut r = response_headers(status);
            let attrs = envoy_types::pb::google::protobuf::Struct {
                fields: [(
                    envoy_context::CODE_DETAILS.to_owned(),
                    envoy_types::pb::google::protobuf::Value {
                        kind: Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
                            details.to_owned(),
                        )),
                    },
                )]
                .into_iter()
                .collect(),
            };
            r.attributes = HashMap::from([("envoy.filters.http.ext_proc".to_owned(), attrs)]);
            r
        };
        let refused = "upstream_reset_before_response_started{remote_connection_failure}";
        for (status, details, index) in [
            ("503", refused, 3),
            ("500", "via_upstream", 2),
            (
                "503",
                "upstream_reset_before_response_started{connection_termination}",
                4,
            ),
        ] {
            let mut st = StreamState::new(sh.clone());
            st.on_message(headers(&[(":path", "/v1/models")], true));
            st.on_message(with_details(status, details));
            drop(st);
            let completed = sh.router.lock().stats().tickets.completed;
            assert_eq!(completed[index], 1, "{details}: {completed:?}");
        }
    }

    #[test]
    fn upstream_5xx_marks_the_ticket_failed() {
        let sh = shared();
        let mut st = StreamState::new(sh.clone());
        st.on_message(headers(&[(":path", "/v1/models")], true));
        st.on_message(response_headers("503"));
        drop(st);
        assert_eq!(
            sh.router.lock().stats().tickets.completed[2],
            1,
            "failed outcome"
        );
    }

    /// Request headers of a POST to `path` as Envoy sends them first when request and
    /// response bodies are `FULL_DUPLEX_STREAMED`.
    fn duplex_headers(path: &str) -> ProcessingRequest {
        use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;
        let mut h = headers(&[(":path", path), ("x-request-id", "rid")], false);
        h.protocol_config = Some(ProtocolConfiguration {
            request_body_mode: BodySendMode::FullDuplexStreamed as i32,
            response_body_mode: BodySendMode::FullDuplexStreamed as i32,
            ..Default::default()
        });
        h
    }

    /// The reply `on_message` returned, then every queued one.
    fn all_replies(st: &mut StreamState, msg: ProcessingRequest) -> Vec<ProcessingResponse> {
        let mut out: Vec<_> = st.on_message(msg).into_iter().collect();
        out.extend(std::iter::from_fn(|| st.next_queued()));
        out
    }

    /// `(bytes, end_of_stream)` of a streamed body reply (request or response).
    fn streamed(r: &ProcessingResponse) -> (Vec<u8>, bool) {
        use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
        let b = match &r.response {
            Some(Response::RequestBody(b) | Response::ResponseBody(b)) => b,
            other => panic!("not a body reply: {other:?}"),
        };
        let m = b.response.as_ref().and_then(|c| c.body_mutation.clone());
        let Some(Mutation::StreamedResponse(s)) = m.and_then(|m| m.mutation) else {
            panic!("not a streamed body: {r:?}")
        };
        (s.body, s.end_of_stream)
    }

    const LARGE: &str = "[routing]\nseed = 3\n[limits]\nmax_body_bytes = 400000\n[models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\" }, { name = \"b\", address = \"10.0.0.2:80\" }]";

    #[test]
    fn full_duplex_defers_the_header_reply_and_echoes_the_body_in_64_kib_pieces() {
        let sh = shared_with(LARGE);
        let mut st = StreamState::new(sh.clone());
        let text = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(150_000));
        assert!(all_replies(&mut st, duplex_headers("/v1/completions")).is_empty());
        let parts: Vec<&[u8]> = text.as_bytes().chunks(40_000).collect();
        for p in &parts[..parts.len() - 1] {
            let r = all_replies(&mut st, body_part(std::str::from_utf8(p).unwrap(), false));
            assert!(r.is_empty(), "a chunk before the last gets no reply: {r:?}");
        }
        assert_eq!(in_flight(&sh), 0, "not routed before the body's end");
        let last = std::str::from_utf8(parts[parts.len() - 1]).unwrap();
        let replies = all_replies(&mut st, body_part(last, true));
        // The headers reply carries the routing.
        let first = &replies[0];
        let Some(Response::RequestHeaders(h)) = &first.response else {
            panic!("the first reply is not the headers': {first:?}")
        };
        let common = h.response.as_ref().unwrap();
        assert!(common.clear_route_cache);
        let keys: Vec<&str> = common
            .header_mutation
            .as_ref()
            .unwrap()
            .set_headers
            .iter()
            .map(|o| o.header.as_ref().unwrap().key.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                respond::DESTINATION_HEADER,
                "target-pod",
                "routing-strategy"
            ]
        );
        let md = first.dynamic_metadata.as_ref().expect("envoy.lb metadata");
        assert!(md.fields.contains_key(respond::LB_NAMESPACE));
        assert_eq!(in_flight(&sh), 1);
        // Then the body, whole, in pieces of at most 64 KiB, only the last ending the stream.
        let pieces: Vec<(Vec<u8>, bool)> = replies[1..].iter().map(streamed).collect();
        assert_eq!(pieces.len(), text.len().div_ceil(crate::duplex::MAX_CHUNK));
        assert!(pieces
            .iter()
            .all(|(b, _)| b.len() <= crate::duplex::MAX_CHUNK));
        let ends: Vec<bool> = pieces.iter().map(|p| p.1).collect();
        assert!(ends[..ends.len() - 1].iter().all(|e| !e) && ends[ends.len() - 1]);
        let joined: Vec<u8> = pieces.into_iter().flat_map(|p| p.0).collect();
        assert_eq!(joined, text.as_bytes());
        drop(st);
        assert_eq!(in_flight(&sh), 0);
    }

    #[test]
    fn full_duplex_trailers_end_the_request() {
        let sh = shared();
        let mut st = StreamState::new(sh.clone());
        assert!(all_replies(&mut st, duplex_headers("/v1/completions")).is_empty());
        let text = r#"{"model":"m","prompt":"hello"}"#;
        assert!(all_replies(&mut st, body_part(text, false)).is_empty());
        let trailers = ProcessingRequest {
            request: Some(Request::RequestTrailers(Default::default())),
            ..Default::default()
        };
        let replies = all_replies(&mut st, trailers);
        assert_eq!(replies.len(), 3, "{replies:?}");
        assert!(matches!(
            replies[0].response,
            Some(Response::RequestHeaders(_))
        ));
        assert!(replies[0].dynamic_metadata.is_some());
        assert_eq!(streamed(&replies[1]), (text.as_bytes().to_vec(), false));
        assert!(matches!(
            replies[2].response,
            Some(Response::RequestTrailers(_))
        ));
        assert_eq!(in_flight(&sh), 1);
    }

    #[test]
    fn full_duplex_errors_are_immediate_responses_without_a_ticket() {
        let sh = shared(); // max_body_bytes = 1000
        let cases: Vec<(Vec<ProcessingRequest>, u16)> = vec![
            (
                vec![
                    duplex_headers("/v1/completions"),
                    body(r#"{"model":"x","prompt":"p"}"#),
                ],
                400,
            ),
            (vec![duplex_headers("/v1/completions"), body("{")], 400),
            (
                vec![
                    duplex_headers("/v1/chat/completions"),
                    body(r#"{"model":"m"}"#),
                ],
                400,
            ),
            (
                vec![
                    duplex_headers("/v1/completions"),
                    body_part(&"x".repeat(600), false),
                    body_part(&"x".repeat(401), false),
                ],
                413,
            ),
        ];
        for (msgs, status) in cases {
            let mut st = StreamState::new(sh.clone());
            let replies: Vec<_> = msgs
                .into_iter()
                .flat_map(|m| all_replies(&mut st, m))
                .collect();
            assert_eq!(replies.len(), 1, "{replies:?}");
            assert_eq!(immediate(&replies[0]).0, i32::from(status));
            assert!(all_replies(&mut st, body_part("more", true)).is_empty());
            assert_eq!(in_flight(&sh), 0);
        }
        // A bad strategy is answered at once, on the headers.
        let mut st = StreamState::new(sh.clone());
        let mut h = duplex_headers("/v1/completions");
        if let Some(Request::RequestHeaders(hh)) = &mut h.request {
            hh.headers.as_mut().unwrap().headers.push(HeaderValue {
                key: "routing-strategy".into(),
                raw_value: b"nope".to_vec(),
                ..Default::default()
            });
        }
        assert_eq!(immediate(&st.on_message(h).unwrap()).0, 400);
        assert_eq!(sh.router.lock().stats().tickets.issued, 0);
    }

    #[test]
    fn full_duplex_response_chunks_are_echoed_and_timed_outside_the_budget() {
        let sh = shared_with("[stream_timing]\nmax_streams = 1\n[models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\" }]");
        let mut st = StreamState::new(sh.clone());
        all_replies(&mut st, duplex_headers("/v1/completions"));
        let replies = all_replies(&mut st, body(r#"{"model":"m","prompt":"hi"}"#));
        assert_eq!(replies.len(), 2);
        let mut r = headers(
            &[(":status", "200"), ("content-type", "text/event-stream")],
            false,
        );
        if let Some(Request::RequestHeaders(h)) = r.request.take() {
            r.request = Some(Request::ResponseHeaders(h));
        }
        let replies = all_replies(&mut st, r);
        assert_eq!(replies.len(), 1);
        assert!(matches!(
            replies[0].response,
            Some(Response::ResponseHeaders(_))
        ));
        assert_eq!(
            replies[0].mode_override, None,
            "the body comes through kvroute anyway"
        );
        assert_eq!(sh.stream_budget.open(), 0, "no budget taken");
        let usage =
            "data: {\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
        let chunks: [(&[u8], bool); 4] = [
            (b"data: {}\n\n", false),
            (b"", false),
            (usage.as_bytes(), false),
            (b"", true),
        ];
        for (bytes, end_of_stream) in chunks {
            let msg = ProcessingRequest {
                request: Some(Request::ResponseBody(HttpBody {
                    body: bytes.to_vec(),
                    end_of_stream,
                    ..Default::default()
                })),
                ..Default::default()
            };
            let replies = all_replies(&mut st, msg);
            if bytes.is_empty() && !end_of_stream {
                assert!(replies.is_empty(), "nothing to pass back");
                continue;
            }
            assert_eq!(replies.len(), 1);
            assert!(matches!(
                replies[0].response,
                Some(Response::ResponseBody(_))
            ));
            assert_eq!(streamed(&replies[0]), (bytes.to_vec(), end_of_stream));
        }
        let timing = st.routed.as_mut().unwrap().guard.timing_mut().unwrap();
        assert!(timing.first_chunk().is_some());
        assert_eq!(timing.usage().unwrap().prompt_tokens, Some(7));
        let trailers = ProcessingRequest {
            request: Some(Request::ResponseTrailers(Default::default())),
            ..Default::default()
        };
        let replies = all_replies(&mut st, trailers);
        assert!(matches!(
            replies[..],
            [ProcessingResponse {
                response: Some(Response::ResponseTrailers(_)),
                ..
            }]
        ));
        drop(st);
        assert_eq!(in_flight(&sh), 0);
    }

    #[test]
    fn full_duplex_get_is_routed_on_its_headers() {
        let sh = shared();
        let mut st = StreamState::new(sh.clone());
        let mut h = duplex_headers("/v1/models");
        if let Some(Request::RequestHeaders(hh)) = &mut h.request {
            hh.end_of_stream = true;
        }
        let replies = all_replies(&mut st, h);
        assert_eq!(replies.len(), 1);
        assert!(matches!(
            replies[0].response,
            Some(Response::RequestHeaders(_))
        ));
        assert!(replies[0].dynamic_metadata.is_some());
        assert_eq!(in_flight(&sh), 1);
    }

    #[test]
    fn buffered_exchanges_queue_nothing() {
        let sh = shared();
        let mut st = StreamState::new(sh.clone());
        let msgs = [
            post_headers(Some(BodySendMode::Buffered)),
            body(r#"{"model":"m","prompt":"hello"}"#),
            response_headers("200"),
            response_body(b"{}"),
        ];
        for m in msgs {
            assert_eq!(all_replies(&mut st, m).len(), 1, "one reply per message");
        }
        assert_eq!(in_flight(&sh), 1);
    }
}
