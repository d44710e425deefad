//! One request's routing, independent of how Envoy talks to kvroute: read the request headers
//! ([`RequestInfo`]), extract the prompt and route ([`route_body`], [`route_without_body`]),
//! and say which headers go upstream ([`upstream_headers`]) and back to the client
//! ([`on_response_headers`]). The ext_proc stream ([`crate::stream`]) and the in-Envoy module
//! (crate `kvroute-envoy`) both drive it, so the two paths read requests, decide, reject and
//! name headers the same way.
//!
//! Locking rule ([`crate::shared`]): the prompt is hashed outside the router lock; the
//! decision is one short `route` call under it.

use std::sync::Arc;

use kvroute_core::{BlockExtras, Decision, PromptTokens, RouteError, RouteRequest, StrategySpec};

use crate::extract::{extract, reject, Endpoint};
use crate::health::ResponseEnd;
use crate::respond::{echoed_value, Reject, DESTINATION_HEADER};
use crate::shared::Shared;
use crate::stream_timing::{self, is_event_stream, ResponseTiming};
use crate::ticket_guard::TicketGuard;
use crate::tokenize::Tokenized;

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
    /// `x-session-id` (AIBrix's session-affinity: base64 of the session's pod `ip:port`).
    pub session_id: Option<String>,
}

impl RequestInfo {
    /// Reads one request header (`key` lower-case, as Envoy passes them). Non-UTF-8 values
    /// count as absent, except a `routing-strategy`, which is kept (lossily) so that it gets
    /// the 400 of an invalid strategy.
    pub fn read_header(&mut self, key: &str, value: &[u8]) {
        let Ok(text) = std::str::from_utf8(value) else {
            if key == "routing-strategy" {
                self.strategy = Some(String::from_utf8_lossy(value).into_owned());
            }
            return;
        };
        match key {
            ":path" => self.path = text.to_owned(),
            "x-request-id" => self.request_id = Some(text.to_owned()),
            "routing-strategy" if !text.trim().is_empty() => self.strategy = Some(text.to_owned()),
            "content-length" => self.content_length = text.trim().parse().ok(),
            "model" if !text.is_empty() => self.model = Some(text.to_owned()),
            "x-session-id" if !text.trim().is_empty() => {
                self.session_id = Some(text.trim().to_owned())
            }
            _ => {}
        }
    }

    /// The checks the request headers allow: a `routing-strategy` that parses (else 400) and
    /// an announced body within `max_body_bytes` (else 413). Returns the parsed strategy.
    pub fn check(&self, max_body_bytes: usize) -> Result<Option<StrategySpec>, Reject> {
        let strategy = match &self.strategy {
            Some(s) => {
                Some(StrategySpec::parse(s).map_err(|e| Reject::BadStrategy(bad_strategy(s, &e)))?)
            }
            None => None,
        };
        if self
            .content_length
            .is_some_and(|n| n > max_body_bytes as u64)
        {
            return Err(Reject::TooLarge {
                limit: max_body_bytes,
            });
        }
        Ok(strategy)
    }
}

/// What follows "incorrect routing strategy " in the 400 for a spec that does not parse: the
/// spec as written (AIBrix's message), and for an AIBrix strategy kvroute does not implement or
/// cannot weight, why.
fn bad_strategy(spec: &str, e: &kvroute_core::StrategyError) -> String {
    use kvroute_core::StrategyError::{NotWeightable, Unsupported};
    match e {
        Unsupported { .. } | NotWeightable(_) => format!("{}: {e}", spec.trim()),
        _ => spec.trim().to_owned(),
    }
}

/// A routed request: where it went, and the guard that releases its slot exactly once.
#[derive(Debug)]
pub struct Routed {
    /// The chosen pod's name.
    pub pod_name: Arc<str>,
    /// The chosen pod's `ip:port`.
    pub address: Arc<str>,
    /// The strategy as the client wrote it, else the configured default (echoed in
    /// `routing-strategy`).
    pub strategy: String,
    /// The decision (rendered for `x-kvroute-decision` only when asked for).
    pub decision: Decision,
    /// Releases the ticket when dropped.
    pub guard: TicketGuard,
}

/// What a request is routed with, besides its prompt.
#[derive(Clone, Copy, Debug)]
pub struct RouteInputs<'a> {
    /// The request headers' facts.
    pub info: &'a RequestInfo,
    /// The parsed `routing-strategy` ([`RequestInfo::check`]).
    pub strategy: Option<&'a StrategySpec>,
    /// The gateway's endpoint subset hint, if it passed one.
    pub subset: Option<&'a [String]>,
}

/// Extracts the model and prompt from a whole request body and routes on them: on token
/// blocks when the model has a tokenizer ([`crate::tokenize`], tokenized here), else on text
/// blocks.
pub fn route_body(
    shared: &Arc<Shared>,
    at: RouteInputs<'_>,
    body: &[u8],
) -> Result<Routed, Reject> {
    route_body_tokenized(shared, at, body, None)
}

/// [`route_body`] with the body's tokenization already done elsewhere (`Some`: the result of
/// [`tokenize_body`], which kvroute-ext-proc runs on its bounded pool); `None` tokenizes here.
pub fn route_body_tokenized(
    shared: &Arc<Shared>,
    at: RouteInputs<'_>,
    body: &[u8],
    tokenized: Option<Option<Tokenized>>,
) -> Result<Routed, Reject> {
    let endpoint = Endpoint::from_path(&at.info.path);
    let extracted = extract(endpoint, body).map_err(reject)?;
    let model = extracted.model.as_deref().unwrap_or("");
    let tokenized = tokenized.unwrap_or_else(|| tokenize_body(shared, &at.info.path, body));
    let prompt = match &tokenized {
        Some(t) => Prompt::Tokens(t),
        None => Prompt::Text(extracted.prompt.as_bytes()),
    };
    route(shared, at, model, prompt, extracted.max_output_tokens)
}

/// The body's prompt as token ids, when the model it names has a tokenizer; `None` otherwise,
/// and when the tokenizer cannot take the body (counted and logged at debug: the request is
/// then routed on text blocks). Call it outside any lock: it may take milliseconds for a long
/// prompt not seen before.
pub fn tokenize_body(shared: &Shared, path: &str, body: &[u8]) -> Option<Tokenized> {
    let started = std::time::Instant::now();
    let (model, result) = shared
        .tokenizers()
        .tokenize(Endpoint::from_path(path), body)?;
    let seconds = started.elapsed().as_secs_f64();
    let (label, tokenized) = match result {
        Ok(Some(t)) => ("tokens", Some(t)),
        Ok(None) => ("skipped", None),
        Err(e) => {
            tracing::debug!(model, error = %e, "not tokenized; routing on text blocks");
            ("error", None)
        }
    };
    shared.metrics.observe_tokenize(&model, label, seconds);
    tokenized
}

/// A prompt as the router keys it.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    /// Text: 128-byte blocks (AIBrix's scheme).
    Text(&'a [u8]),
    /// Token ids: token blocks ([`crate::tokenize`]).
    Tokens(&'a Tokenized),
}

/// Routes a request without a body: its `model` header, else the default model, no prompt.
pub fn route_without_body(shared: &Arc<Shared>, at: RouteInputs<'_>) -> Result<Routed, Reject> {
    let model = at
        .info
        .model
        .clone()
        .or_else(|| shared.settings().default_model.clone());
    route(
        shared,
        at,
        model.as_deref().unwrap_or(""),
        Prompt::Text(&[]),
        None,
    )
}

/// Keys `prompt`'s blocks outside the router lock, then routes under it (with the body's
/// output-token limit, if any), records the decision and its metrics. A reload that changes
/// the hashing between the two locks only costs this request its prefix match.
pub fn route(
    shared: &Arc<Shared>,
    at: RouteInputs<'_>,
    model: &str,
    prompt: Prompt<'_>,
    max_output_tokens: Option<u32>,
) -> Result<Routed, Reject> {
    let settings = shared.settings();
    let model = settings.routing_model.as_deref().unwrap_or(model);
    let hash = shared.router.lock().hash_config();
    let (hashes, tokens) = match prompt {
        Prompt::Text(text) => (hash.hashes(text), None),
        Prompt::Tokens(t) => {
            // The block size was validated with the configuration.
            let keys = kvroute_core::TokenKeyConfig::new(t.block_tokens, hash.seed())
                .map(|k| {
                    k.keys(
                        &t.ids,
                        BlockExtras {
                            lora: None,
                            cache_salt: t.cache_salt.as_deref(),
                        },
                    )
                })
                .unwrap_or_default();
            let size = PromptTokens {
                prompt_tokens: u32::try_from(t.ids.len()).unwrap_or(u32::MAX),
                block_tokens: t.block_tokens,
            };
            (keys, Some(size))
        }
    };
    let subset: Option<Vec<&str>> = at.subset.map(|s| s.iter().map(String::as_str).collect());
    let now = shared.now();
    let started = std::time::Instant::now();
    let req = RouteRequest {
        model,
        strategy: at.strategy,
        hashes: &hashes,
        tokens,
        max_output_tokens,
        endpoint_subset: subset.as_deref(),
        session_id: at.info.session_id.as_deref(),
        ..RouteRequest::new(model, &hashes)
    };
    let result = shared.router.lock().route(req, now);
    let decision = match result {
        Ok(d) => d,
        Err(RouteError::UnknownModel) => return Err(Reject::UnknownModel(model.to_owned())),
        Err(RouteError::NoPodInSubset) => return Err(Reject::NoPodInSubset(model.to_owned())),
        Err(_) => return Err(Reject::NoReadyPod(model.to_owned())),
    };
    let guard = TicketGuard::new(
        shared.clone(),
        decision.ticket,
        Arc::from(model),
        decision.pod_name.clone(),
    );
    shared.metrics.observe_prediction(
        model,
        &decision.pod_name,
        f64::from(decision.prediction.ttft_ms) / 1_000.0,
    );
    shared
        .metrics
        .observe_routing(model, started.elapsed().as_secs_f64());
    let strategy = match &at.info.strategy {
        Some(s) => s.clone(),
        None => settings.default_strategy_text.clone(),
    };
    let request_id = at.info.request_id.as_deref();
    shared
        .decisions
        .record(request_id, model, &strategy, &decision);
    tracing::debug!(
        request_id = request_id.unwrap_or(""),
        pod = &*decision.pod_name,
        reason = decision.reason.as_str(),
        decision = %decision,
        "routed"
    );
    Ok(Routed {
        pod_name: decision.pod_name.clone(),
        address: decision.address.clone(),
        strategy,
        decision,
        guard,
    })
}

/// The request headers set for the upstream: `x-gateway-destination-endpoint` and
/// `target-pod` (AIBrix) with the chosen `ip:port`, and `routing-strategy` (AIBrix forwards
/// it).
pub fn upstream_headers<'a>(address: &'a str, strategy: &'a str) -> [(&'static str, &'a str); 3] {
    [
        (DESTINATION_HEADER, address),
        ("target-pod", address),
        ("routing-strategy", strategy),
    ]
}

/// Logs a rejection and counts it: the reason at debug for a bad body, one line at info.
pub fn log_reject(shared: &Shared, request_id: Option<&str>, reject: &Reject) {
    shared.metrics.reject(reject.kind());
    let request_id = request_id.unwrap_or("");
    if let Reject::BadBody(reason) = reject {
        tracing::debug!(request_id, reason, "request body rejected");
    }
    tracing::info!(
        request_id,
        status = reject.status(),
        kind = reject.kind(),
        "rejected"
    );
}

/// How a 2xx server-sent-event response may be timed ([`crate::stream_timing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimingPolicy {
    /// Timing costs a round trip per chunk: within the `[stream_timing]` budget.
    Budgeted,
    /// The body passes by anyway (full-duplex ext_proc, the in-Envoy module): every such
    /// response is timed, unless `max_streams` is 0.
    Free,
}

/// What the response headers said.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResponseHead<'a> {
    /// `:status`, when it parsed.
    pub status: Option<u16>,
    /// `content-type`.
    pub content_type: Option<&'a str>,
}

/// Handles the response headers: tells the guard the status and Envoy's code details,
/// starts timing the body where `policy` allows, and returns the client headers to set
/// (`target-pod`, `target-pod-ip`, `routing-strategy`, `x-kvroute-decision`, `request-id`,
/// each only when known and allowed) and whether the body is now timed under the budget
/// (then the ext_proc reply must ask Envoy to stream the body through kvroute).
pub fn on_response_headers(
    shared: &Shared,
    routed: Option<&mut Routed>,
    request_id: Option<&str>,
    head: ResponseHead<'_>,
    code_details: Option<String>,
    policy: TimingPolicy,
) -> (Vec<(&'static str, Vec<u8>)>, bool) {
    let mut headers = Vec::with_capacity(5);
    let mut budgeted = false;
    let settings = shared.settings();
    if let Some(r) = routed {
        r.guard.on_response(ResponseEnd {
            headers_seen: true,
            status: head.status,
            code_details,
        });
        if head.status.is_some_and(|s| (200..300).contains(&s))
            && head.content_type.is_some_and(is_event_stream)
            && settings.max_timed_streams > 0
        {
            match policy {
                TimingPolicy::Free => {
                    r.guard.time_response(ResponseTiming::unbudgeted());
                    shared.metrics.response_timed();
                }
                TimingPolicy::Budgeted => {
                    let cold_prefill = r
                        .decision
                        .prediction
                        .is_cold_prefill(settings.engine_block_tokens);
                    let max = stream_timing::budget_for(settings.max_timed_streams, cold_prefill);
                    if let Some(permit) = shared.stream_budget.try_acquire(max) {
                        r.guard.time_response(ResponseTiming::new(permit));
                        shared.metrics.response_timed();
                        budgeted = true;
                    }
                }
            }
        }
        if settings.expose_pod_headers {
            headers.push(("target-pod", r.pod_name.as_bytes().to_vec()));
            headers.push(("target-pod-ip", r.address.as_bytes().to_vec()));
        }
        headers.push(("routing-strategy", r.strategy.as_bytes().to_vec()));
        if let Some(session) = &r.decision.session_id {
            // session-affinity: the id that brings the client's next request back here.
            headers.push(("x-session-id", session.as_bytes().to_vec()));
        }
        if settings.expose_pod_headers {
            headers.push(("x-kvroute-decision", r.decision.to_string().into_bytes()));
        }
    }
    if let Some(id) = request_id {
        headers.push(("request-id", echoed_value(id)));
    }
    (headers, budgeted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_headers_are_read_leniently() {
        let mut info = RequestInfo::default();
        for (k, v) in [
            (":path", &b"/v1/completions"[..]),
            ("x-request-id", b"r1"),
            ("routing-strategy", b"  "),
            ("content-length", b" 12 "),
            ("model", b""),
        ] {
            info.read_header(k, v);
        }
        assert_eq!(info.path, "/v1/completions");
        assert_eq!(info.request_id.as_deref(), Some("r1"));
        assert_eq!(info.strategy, None, "a blank strategy is no strategy");
        assert_eq!(info.content_length, Some(12));
        assert_eq!(info.model, None);
        info.read_header("routing-strategy", b"\xffx");
        assert!(matches!(info.check(100), Err(Reject::BadStrategy(_))));
    }

    #[test]
    fn unsupported_strategies_say_why() {
        let info = |s: &str| RequestInfo {
            strategy: Some(s.into()),
            ..Default::default()
        };
        assert_eq!(
            info(" pd ").check(100),
            Err(Reject::BadStrategy(
                "pd: routing strategy \"pd\" is not supported by kvroute: needs prefill and \
                 decode pods and a KV-cache transfer between them"
                    .into()
            ))
        );
        assert_eq!(
            info("fastest").check(100),
            Err(Reject::BadStrategy("fastest".into()))
        );
        assert!(info("least-kv-cache:2,session-affinity").check(100).is_ok());
    }

    #[test]
    fn check_rejects_announced_oversize_bodies() {
        let info = RequestInfo {
            content_length: Some(101),
            strategy: Some("least-request".into()),
            ..Default::default()
        };
        assert_eq!(info.check(100), Err(Reject::TooLarge { limit: 100 }));
        assert!(info.check(101).unwrap().is_some());
    }
}
