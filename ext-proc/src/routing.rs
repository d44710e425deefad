//! One request's routing, independent of how Envoy talks to kvroute: read the request headers
//! ([`RequestInfo`]), extract the prompt and route ([`route_body`], [`route_without_body`];
//! [`admit_body`], [`admit_without_body`] for a caller that holds what admission queues),
//! and say which headers go upstream
//! ([`RouteTo::upstream_headers`](crate::respond::RouteTo::upstream_headers)) and back to the
//! client ([`on_response_headers`]). The ext_proc stream ([`crate::stream`]) and the in-Envoy
//! module (crate `kvroute-envoy`) both drive it, so the two paths read requests, decide,
//! reject and name headers the same way.
//!
//! Locking rule ([`crate::shared`]): the prompt is hashed outside the router lock; the
//! decision is one short `admit` call under it ([`crate::admission`]: without a policy for
//! the model, `admit` is `route`).

use std::sync::Arc;

use kvroute_core::{
    Admitted, BlockExtras, BlockHash, Decision, PromptTokens, QueueId, RouteError, RouteRequest,
    StrategySpec,
};

use crate::admission::{self, metrics::Outcome, AdmissionInputs, Held};
use crate::extract::{extract, reject, Endpoint};
use crate::health::ResponseEnd;
use crate::respond::{echoed_value, Reject, RouteTo};
use crate::shared::Shared;
use crate::stream_timing::{is_event_stream, ResponseTiming};
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
    /// `x-session-id` (AIBrix's session-affinity: base64 of the session's pod `ip:port`;
    /// least-ttft reads it too).
    pub session_id: Option<String>,
    /// The `[admission]` headers (priority, tenant, GIE objective), read by
    /// [`AdmissionInputs::read_header`] with the configured names.
    pub admission: AdmissionInputs,
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

impl Routed {
    /// Where the request goes ([`RouteTo::upstream_headers`]).
    pub fn route_to(&self) -> RouteTo<'_> {
        RouteTo {
            address: &self.address,
            strategy: &self.strategy,
            data_parallel_rank: self.decision.data_parallel_rank,
        }
    }
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

/// What admission made of a request: routed, or held until the router dispatches it,
/// sheds it, or its client leaves ([`crate::admission`]).
#[derive(Debug)]
pub enum Admission {
    /// Routed now.
    Routed(Box<Routed>),
    /// Held: await [`Held::verdict`].
    Held(Held),
}

/// Extracts the model and prompt from a whole request body and routes on them: on token
/// blocks when the model has a tokenizer ([`crate::tokenize`], tokenized here), else on text
/// blocks. For a caller that cannot hold a request (the in-Envoy module): [`route_now`].
pub fn route_body(
    shared: &Arc<Shared>,
    at: RouteInputs<'_>,
    body: &[u8],
) -> Result<Routed, Reject> {
    route_now(shared, key_body(shared, at, body, None)?)
}

/// [`route_body`] for a caller that holds requests (the ext_proc stream: [`admit`]), with the
/// body's tokenization already done elsewhere (`Some`: the result of [`tokenize_body`], which
/// kvroute-ext-proc runs on its bounded pool; `None` tokenizes here).
pub fn admit_body(
    shared: &Arc<Shared>,
    at: RouteInputs<'_>,
    body: &[u8],
    tokenized: Option<Option<Tokenized>>,
) -> Result<Admission, Reject> {
    admit(shared, key_body(shared, at, body, tokenized)?)
}

/// Extracts the body's model, prompt and output-token limit, and keys the prompt.
fn key_body(
    shared: &Arc<Shared>,
    at: RouteInputs<'_>,
    body: &[u8],
    tokenized: Option<Option<Tokenized>>,
) -> Result<KeyedRequest, Reject> {
    let endpoint = Endpoint::from_path(&at.info.path);
    let extracted = extract(endpoint, body).map_err(reject)?;
    let model = extracted.model.as_deref().unwrap_or("");
    let tokenized = tokenized.unwrap_or_else(|| tokenize_body(shared, &at.info.path, body));
    let prompt = match &tokenized {
        Some(t) => Prompt::Tokens(t),
        None => Prompt::Text(extracted.prompt.as_bytes()),
    };
    Ok(key(shared, at, model, prompt, extracted.max_output_tokens))
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

/// Routes a request without a body: its `model` header, else the default model, no prompt
/// ([`route_now`]).
pub fn route_without_body(shared: &Arc<Shared>, at: RouteInputs<'_>) -> Result<Routed, Reject> {
    route_now(shared, key_without_body(shared, at))
}

/// [`route_without_body`] for a caller that holds requests ([`admit`]).
pub fn admit_without_body(shared: &Arc<Shared>, at: RouteInputs<'_>) -> Result<Admission, Reject> {
    admit(shared, key_without_body(shared, at))
}

fn key_without_body(shared: &Arc<Shared>, at: RouteInputs<'_>) -> KeyedRequest {
    let model = at
        .info
        .model
        .clone()
        .or_else(|| shared.settings().default_model.clone());
    key(
        shared,
        at,
        model.as_deref().unwrap_or(""),
        Prompt::Text(&[]),
        None,
    )
}

/// A request keyed for the router, owning all it is routed with, so that a held one can be
/// offered again later ([`crate::admission`]).
#[derive(Debug)]
pub struct KeyedRequest {
    /// The router model.
    pub model: Arc<str>,
    /// The parsed `routing-strategy`, if any.
    pub strategy: Option<StrategySpec>,
    /// The prompt's block keys.
    pub hashes: Vec<BlockHash>,
    /// Token counts when `hashes` are token-block keys.
    pub tokens: Option<PromptTokens>,
    /// The body's output-token limit.
    pub max_output_tokens: Option<u32>,
    /// The gateway's endpoint subset hint.
    pub subset: Option<Vec<String>>,
    /// `x-session-id`.
    pub session_id: Option<String>,
    /// Admission priority.
    pub priority: i32,
    /// Admission tenant.
    pub tenant: Option<String>,
    /// The strategy as echoed in `routing-strategy` (the client's, else the default's text).
    pub strategy_text: String,
    /// `x-request-id`, for the decision log and the logs.
    pub request_id: Option<String>,
}

impl KeyedRequest {
    /// Calls `f` with the request as the router takes it.
    pub fn with_request<R>(&self, f: impl FnOnce(RouteRequest<'_>) -> R) -> R {
        let subset: Option<Vec<&str>> = self
            .subset
            .as_ref()
            .map(|s| s.iter().map(String::as_str).collect());
        let req = RouteRequest {
            strategy: self.strategy.as_ref(),
            tokens: self.tokens,
            max_output_tokens: self.max_output_tokens,
            endpoint_subset: subset.as_deref(),
            session_id: self.session_id.as_deref(),
            ..RouteRequest::new(&self.model, &self.hashes)
        }
        .with_priority(self.priority, self.tenant.as_deref());
        f(req)
    }
}

/// The rejection for a routing error on `model`.
pub fn route_error(e: RouteError, model: &str) -> Reject {
    match e {
        RouteError::UnknownModel => Reject::UnknownModel(model.to_owned()),
        RouteError::NoPodInSubset => Reject::NoPodInSubset(model.to_owned()),
        _ => Reject::NoReadyPod(model.to_owned()),
    }
}

/// Keys `prompt`'s blocks (outside the router lock) for the router model, with everything
/// else the request is routed with (the body's output-token limit, if any). A reload that
/// changes the hashing before the request is admitted only costs it its prefix match.
pub fn key(
    shared: &Shared,
    at: RouteInputs<'_>,
    model: &str,
    prompt: Prompt<'_>,
    max_output_tokens: Option<u32>,
) -> KeyedRequest {
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
    KeyedRequest {
        model: Arc::from(model),
        strategy: at.strategy.cloned(),
        hashes,
        tokens,
        max_output_tokens,
        subset: at.subset.map(<[String]>::to_vec),
        session_id: at.info.session_id.clone(),
        priority: at.info.admission.priority(&settings.admission),
        tenant: at.info.admission.tenant.clone(),
        strategy_text: match &at.info.strategy {
            Some(s) => s.clone(),
            None => settings.default_strategy_text.clone(),
        },
        request_id: at.info.request_id.clone(),
    }
}

/// What one `admit` call decided.
enum Decided {
    Routed(Box<Routed>),
    /// Queued as this id, under a policy with this queue timeout (ms).
    Queued(QueueId, u64),
}

/// Admits `keyed` under the router lock: routed (the decision recorded with its metrics),
/// queued, or shed (429). Counts the outcome when the model has a policy.
fn decide(shared: &Arc<Shared>, keyed: &KeyedRequest) -> Result<Decided, Reject> {
    let now = shared.now();
    let started = std::time::Instant::now();
    let mut router = shared.router.lock();
    let result = keyed.with_request(|req| router.admit(req, now));
    let policy = router.admission_policy(&keyed.model);
    drop(router);
    // An arrival: a moment to offer the held requests again.
    shared.holds.kick();
    let model = &*keyed.model;
    let m = &shared.metrics.admission;
    match result {
        Ok(Admitted::Routed(d)) => {
            if policy.is_some() {
                m.count(model, Outcome::Admitted, "none", keyed.priority);
            }
            let seconds = started.elapsed().as_secs_f64();
            Ok(Decided::Routed(Box::new(finish(shared, keyed, d, seconds))))
        }
        // Queued under a policy (its timeout; the longest allowed if it is gone already).
        Ok(Admitted::Queued(id)) => Ok(Decided::Queued(
            id,
            policy.map_or(admission::MAX_QUEUE_TIMEOUT_MS, |p| p.queue_timeout_ms),
        )),
        Ok(Admitted::Shed(s)) => {
            m.count(model, Outcome::Shed, s.reason.as_str(), keyed.priority);
            Err(Reject::Shed {
                model: model.to_owned(),
                reason: s.reason.as_str(),
                retry_after_ms: s.retry_after_ms,
            })
        }
        Err(e) => Err(route_error(e, model)),
    }
}

/// Admits `keyed`, holding it when the router queues it (the ext_proc stream).
pub fn admit(shared: &Arc<Shared>, keyed: KeyedRequest) -> Result<Admission, Reject> {
    Ok(match decide(shared, &keyed)? {
        Decided::Routed(r) => Admission::Routed(r),
        Decided::Queued(id, timeout_ms) => {
            let m = &shared.metrics.admission;
            m.count(&keyed.model, Outcome::Queued, "none", keyed.priority);
            Admission::Held(Held::register(shared, id, keyed, timeout_ms))
        }
    })
}

/// Routes `keyed` now, for a caller that cannot hold a request (the in-Envoy module): one
/// the router queues is taken out of the queue at once and shed ([`Reject::Shed`],
/// `would_queue`, Retry-After [`admission::WOULD_QUEUE_RETRY_AFTER_MS`]).
pub fn route_now(shared: &Arc<Shared>, keyed: KeyedRequest) -> Result<Routed, Reject> {
    match decide(shared, &keyed)? {
        Decided::Routed(r) => Ok(*r),
        Decided::Queued(id, _) => {
            // Never registered: the pump leaves it alone meanwhile.
            shared.router.lock().cancel_queued(id);
            shared.holds.kick();
            let m = &shared.metrics.admission;
            m.count(&keyed.model, Outcome::Shed, "would_queue", keyed.priority);
            Err(Reject::Shed {
                model: keyed.model.to_string(),
                reason: "would_queue",
                retry_after_ms: admission::WOULD_QUEUE_RETRY_AFTER_MS,
            })
        }
    }
}

/// A decision made for `keyed` (in `seconds`) as a [`Routed`]: its ticket guarded, its
/// prediction and latency measured, the decision recorded and logged.
pub fn finish(
    shared: &Arc<Shared>,
    keyed: &KeyedRequest,
    decision: Decision,
    seconds: f64,
) -> Routed {
    let model = &*keyed.model;
    let guard = TicketGuard::new(
        shared.clone(),
        decision.ticket,
        keyed.model.clone(),
        decision.pod_name.clone(),
    );
    shared.metrics.observe_prediction(
        model,
        &decision.pod_name,
        f64::from(decision.prediction.ttft_ms) / 1_000.0,
    );
    shared.metrics.observe_routing(model, seconds);
    let request_id = keyed.request_id.as_deref();
    shared
        .decisions
        .record(request_id, model, &keyed.strategy_text, &decision);
    tracing::debug!(
        request_id = request_id.unwrap_or(""),
        pod = &*decision.pod_name,
        reason = decision.reason.as_str(),
        decision = %decision,
        "routed"
    );
    Routed {
        pod_name: decision.pod_name.clone(),
        address: decision.address.clone(),
        strategy: keyed.strategy_text.clone(),
        decision,
        guard,
    }
}

/// Logs a rejection and counts it: the reason at debug for a bad body, one line at info (a
/// shed request's with its model, reason and Retry-After).
pub fn log_reject(shared: &Shared, request_id: Option<&str>, reject: &Reject) {
    shared.metrics.reject(reject.kind());
    let request_id = request_id.unwrap_or("");
    match reject {
        Reject::BadBody(reason) => tracing::debug!(request_id, reason, "request body rejected"),
        Reject::Shed {
            model,
            reason,
            retry_after_ms,
        } => {
            tracing::info!(
                request_id,
                model,
                reason,
                retry_after_ms,
                "shed: 429 with Retry-After"
            );
            return;
        }
        _ => {}
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
                    let max = r
                        .decision
                        .prediction
                        .timing_budget(settings.max_timed_streams, settings.engine_block_tokens);
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
