//! `ProcessingResponse` builders: the routing decision (header mutation + `envoy.lb`
//! dynamic metadata), client response headers, and `ImmediateResponse` rejections with
//! OpenAI-style JSON and AIBrix's marker headers (AIBrix v0.7.0's
//! `pkg/plugins/gateway/util.go`).
//!
//! Every header value goes in `raw_value`: Envoy 1.40 sets a header to the empty string when
//! the value is in `value` (measured). Text a client sent (the model name,
//! the request id) goes through [`echoed_value`] first: Envoy rejects a whole header mutation
//! with one invalid value (CR, LF, NUL), so a raw one would cost the reply its other headers.

use envoy_types::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderValue, HeaderValueOption,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::ProcessingMode;
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_response::Response, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse,
    ImmediateResponse, ProcessingResponse, TrailersResponse,
};
use std::borrow::Cow;

use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

/// Header (and `envoy.lb` metadata key) carrying the chosen `ip:port`, as the Gateway API
/// Inference Extension names it.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// Dynamic-metadata namespace the shipped Envoy config routes on.
pub const LB_NAMESPACE: &str = "envoy.lb";

/// One header to set (overwriting any client value).
pub fn header(key: &str, value: impl Into<Vec<u8>>) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            raw_value: value.into(),
            ..Default::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

/// Longest header value kvroute makes of text a client sent ([`echoed_value`]), in bytes.
pub const MAX_ECHOED_VALUE_BYTES: usize = 256;

/// `text` (sent by a client: a model name, a request id) as a header value that Envoy accepts
/// and that stays small: every byte outside visible ASCII (`!` to `~`) and `%` itself is
/// percent-encoded (`a b\r\n` → `a%20b%0D%0A`; UTF-8 byte by byte), and a result longer than
/// [`MAX_ECHOED_VALUE_BYTES`] is cut (between escapes) and ends in `...` at that length.
pub fn echoed_value(text: &str) -> Vec<u8> {
    const MORE: &[u8] = b"...";
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(text.len().min(MAX_ECHOED_VALUE_BYTES));
    let mut cut = 0;
    for &b in text.as_bytes() {
        if out.len() + MORE.len() <= MAX_ECHOED_VALUE_BYTES {
            cut = out.len();
        }
        if b.is_ascii_graphic() && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
        if out.len() > MAX_ECHOED_VALUE_BYTES {
            out.truncate(cut);
            out.extend_from_slice(MORE);
            break;
        }
    }
    out
}

fn mutation(headers: Vec<HeaderValueOption>) -> Option<HeaderMutation> {
    (!headers.is_empty()).then(|| HeaderMutation {
        set_headers: headers,
        remove_headers: Vec::new(),
    })
}

/// Where to send the request: request headers `x-gateway-destination-endpoint` and
/// `target-pod` (AIBrix) set to `address`, plus `envoy.lb/x-gateway-destination-endpoint`
/// metadata. `clear_route_cache` makes Envoy re-match the route, so the metadata-present
/// route (not the round-robin fallback) is taken.
#[derive(Clone, Debug)]
pub struct RouteTo<'a> {
    /// `ip:port` of the chosen pod.
    pub address: &'a str,
    /// `routing-strategy` to forward upstream (AIBrix forwards it).
    pub strategy: &'a str,
    /// The chosen engine's rank when the pod is one engine of a data-parallel server.
    pub data_parallel_rank: Option<u32>,
}

impl RouteTo<'_> {
    /// The request headers set for the upstream: `x-gateway-destination-endpoint` and
    /// `target-pod` (AIBrix) with the chosen `ip:port`, `routing-strategy` (AIBrix forwards
    /// it), and, for an engine of a data-parallel server, `x-data-parallel-rank` (vLLM sends
    /// the request to that engine).
    pub fn upstream_headers(&self) -> impl Iterator<Item = (&'static str, Cow<'_, str>)> {
        [
            (DESTINATION_HEADER, Cow::Borrowed(self.address)),
            ("target-pod", Cow::Borrowed(self.address)),
            ("routing-strategy", Cow::Borrowed(self.strategy)),
        ]
        .into_iter()
        .chain(
            self.data_parallel_rank
                .map(|r| (crate::data_parallel::RANK_HEADER, Cow::Owned(r.to_string()))),
        )
    }
}

fn route_common(to: &RouteTo<'_>) -> CommonResponse {
    let headers = to
        .upstream_headers()
        .map(|(name, value)| header(name, value.as_bytes()))
        .collect();
    CommonResponse {
        header_mutation: mutation(headers),
        clear_route_cache: true,
        ..Default::default()
    }
}

/// `envoy.lb` metadata: `x-gateway-destination-endpoint` (GIE's key, which the ORIGINAL_DST
/// cluster reads), and for an engine of a data-parallel server `x-data-parallel-rank` (the
/// shipped route adds it as a request header when the request-headers phase is skipped).
fn lb_metadata(to: &RouteTo<'_>) -> Struct {
    let text = |s: String| Value {
        kind: Some(Kind::StringValue(s)),
    };
    let mut inner = Struct::default();
    inner
        .fields
        .insert(DESTINATION_HEADER.to_owned(), text(to.address.to_owned()));
    if let Some(rank) = to.data_parallel_rank {
        inner.fields.insert(
            crate::data_parallel::RANK_HEADER.to_owned(),
            text(rank.to_string()),
        );
    }
    let mut outer = Struct::default();
    outer.fields.insert(
        LB_NAMESPACE.to_owned(),
        Value {
            kind: Some(Kind::StructValue(inner)),
        },
    );
    outer
}

/// Routing decision as the reply to `request_headers` (requests without a body).
pub fn route_in_headers(to: &RouteTo<'_>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(route_common(to)),
        })),
        dynamic_metadata: Some(lb_metadata(to)),
        ..Default::default()
    }
}

/// Routing decision as the reply to the buffered `request_body` (header mutations in a body
/// reply apply only in BUFFERED mode).
pub fn route_in_body(to: &RouteTo<'_>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestBody(BodyResponse {
            response: Some(route_common(to)),
        })),
        dynamic_metadata: Some(lb_metadata(to)),
        ..Default::default()
    }
}

/// Plain CONTINUE to `request_headers` (the body follows).
pub fn continue_request_headers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse::default())),
        ..Default::default()
    }
}

/// Plain CONTINUE to a non-final request body chunk, or any body chunk of the response.
pub fn continue_body(request: bool) -> ProcessingResponse {
    body_reply(request, BodyResponse::default())
}

/// `b` as the reply to a request (`request`) or response body message.
pub fn body_reply(request: bool, b: BodyResponse) -> ProcessingResponse {
    let response = if request {
        Response::RequestBody(b)
    } else {
        Response::ResponseBody(b)
    };
    ProcessingResponse {
        response: Some(response),
        ..Default::default()
    }
}

/// Reply to trailers (request or response): no change.
pub fn continue_trailers(request: bool) -> ProcessingResponse {
    let t = TrailersResponse::default();
    let response = if request {
        Response::RequestTrailers(t)
    } else {
        Response::ResponseTrailers(t)
    };
    ProcessingResponse {
        response: Some(response),
        ..Default::default()
    }
}

/// Client response headers: `target-pod`, `target-pod-ip`, `routing-strategy`, `request-id`,
/// `x-kvroute-decision` (each only when known). With `stream_body`, also asks Envoy to send the
/// response body through kvroute chunk by chunk ([`stream_body_mode`]).
pub fn response_headers(headers: Vec<HeaderValueOption>, stream_body: bool) -> ProcessingResponse {
    let common = CommonResponse {
        header_mutation: mutation(headers),
        ..Default::default()
    };
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse {
            response: Some(common),
        })),
        mode_override: stream_body.then(stream_body_mode),
        ..Default::default()
    }
}

/// The processing mode for the rest of a timed response ([`crate::stream_timing`]): the body
/// STREAMED (each chunk to kvroute and back), trailers SEND as in the shipped configuration
/// (the side stream stays open until the response ends); the request fields repeat the
/// shipped configuration (the request is over by then).
pub fn stream_body_mode() -> ProcessingMode {
    use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::{
        BodySendMode, HeaderSendMode,
    };
    ProcessingMode {
        request_header_mode: HeaderSendMode::Send as i32,
        response_header_mode: HeaderSendMode::Send as i32,
        request_body_mode: BodySendMode::Buffered as i32,
        response_body_mode: BodySendMode::Streamed as i32,
        request_trailer_mode: HeaderSendMode::Skip as i32,
        response_trailer_mode: HeaderSendMode::Send as i32,
    }
}

/// `Retry-After` for a wait of `ms`: whole seconds, rounded up, at least 1.
pub fn retry_after_secs(ms: u64) -> u64 {
    ms.div_ceil(1_000).max(1)
}

/// A reply that only extends Envoy's timer for the message kvroute is answering
/// (`override_message_timeout`: Envoy ignores its other fields, keeps waiting for the real
/// reply, and honours it once per message, up to its filter's `max_message_timeout`). Sent
/// when [`crate::admission`] holds a request.
pub fn extend_message_timeout(timeout: std::time::Duration) -> ProcessingResponse {
    ProcessingResponse {
        override_message_timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(timeout.subsec_nanos()).unwrap_or(0),
        }),
        ..Default::default()
    }
}

/// A request kvroute answers itself, with AIBrix's status, marker header and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reject {
    /// 400: model absent, empty or not served (`x-error-no-model-backends: <model>`, the
    /// name made header-safe by [`echoed_value`]).
    UnknownModel(String),
    /// 503: the model has no ready pod (`x-error-no-model-backends: true`).
    NoReadyPod(String),
    /// 503: the gateway's endpoint subset hint names no ready pod of the model
    /// (`x-error-routing: true`; the Gateway API Inference Extension's protocol says 503).
    NoPodInSubset(String),
    /// 400: the `routing-strategy` header does not parse (`x-error-routing: true`).
    BadStrategy(String),
    /// 400: the body is not usable JSON (`x-error-request-body-processing: true`).
    BadBody(String),
    /// 400: chat request without messages (`x-error-request-body-processing: true`).
    NoMessages,
    /// 413: body larger than the configured limit (`x-error-request-body-processing: true`).
    TooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// 429: admission shed the request ([`crate::admission`]; `x-kvroute-shed: <reason>`,
    /// `Retry-After` in whole seconds, rounded up, and `retry-after-ms`, which OpenAI's SDKs
    /// read first).
    Shed {
        /// The router model.
        model: String,
        /// Why: `saturated`, `queue_full`, `deadline`, `late` (the core's
        /// [`kvroute_core::ShedReason`]) or `would_queue` (kvroute cannot hold it: the
        /// in-Envoy module).
        reason: &'static str,
        /// When to try again, ms.
        retry_after_ms: u64,
    },
}

impl Reject {
    /// One rejection of each kind (tests).
    #[cfg(test)]
    pub(crate) fn every() -> Vec<Reject> {
        vec![
            Reject::UnknownModel("m".into()),
            Reject::NoReadyPod("m".into()),
            Reject::NoPodInSubset("m".into()),
            Reject::BadStrategy("s".into()),
            Reject::BadBody("b".into()),
            Reject::NoMessages,
            Reject::TooLarge { limit: 1 },
            Reject::Shed {
                model: "m".into(),
                reason: "queue_full",
                retry_after_ms: 1_500,
            },
        ]
    }

    /// HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Reject::UnknownModel(_)
            | Reject::BadStrategy(_)
            | Reject::BadBody(_)
            | Reject::NoMessages => 400,
            Reject::NoReadyPod(_) | Reject::NoPodInSubset(_) => 503,
            Reject::TooLarge { .. } => 413,
            Reject::Shed { .. } => 429,
        }
    }

    /// Short label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Reject::UnknownModel(_) => "model_not_found",
            Reject::NoReadyPod(_) => "no_ready_pod",
            Reject::NoPodInSubset(_) => "no_pod_in_subset",
            Reject::BadStrategy(_) => "bad_strategy",
            Reject::BadBody(_) => "bad_body",
            Reject::NoMessages => "no_messages",
            Reject::TooLarge { .. } => "too_large",
            Reject::Shed { .. } => "shed",
        }
    }

    /// `(message, code, param, marker header, marker value)`.
    fn parts(
        &self,
    ) -> (
        String,
        Option<&'static str>,
        Option<&'static str>,
        &'static str,
        Vec<u8>,
    ) {
        const BODY: &str = "x-error-request-body-processing";
        match self {
            Reject::UnknownModel(m) => (
                format!("model {m} does not exist"),
                Some("model_not_found"),
                Some("model"),
                "x-error-no-model-backends",
                echoed_value(m),
            ),
            Reject::NoReadyPod(m) => (
                format!("error on getting pods for model {m}"),
                Some("service_unavailable"),
                None,
                "x-error-no-model-backends",
                b"true".to_vec(),
            ),
            Reject::NoPodInSubset(m) => (
                format!("no ready pod for model {m} among the endpoints the gateway allows"),
                Some("service_unavailable"),
                None,
                "x-error-routing",
                b"true".to_vec(),
            ),
            Reject::BadStrategy(s) => (
                format!("incorrect routing strategy {s}"),
                None,
                None,
                "x-error-routing",
                b"true".to_vec(),
            ),
            Reject::BadBody(_) => (
                "error processing request body".into(),
                None,
                None,
                BODY,
                b"true".to_vec(),
            ),
            Reject::NoMessages => (
                "no messages in the request body".into(),
                None,
                Some("messages"),
                BODY,
                b"true".to_vec(),
            ),
            Reject::TooLarge { limit } => (
                format!("request body exceeds the limit of {limit} bytes"),
                Some("request_too_large"),
                None,
                BODY,
                b"true".to_vec(),
            ),
            Reject::Shed {
                model,
                reason,
                retry_after_ms,
            } => (
                format!(
                    "model {model} is saturated: request shed ({reason}); retry after {} s",
                    retry_after_secs(*retry_after_ms)
                ),
                Some("rate_limit_exceeded"),
                None,
                "x-kvroute-shed",
                reason.as_bytes().to_vec(),
            ),
        }
    }

    /// The OpenAI-style JSON error body.
    pub fn body(&self) -> Vec<u8> {
        let (message, code, param, _, _) = self.parts();
        let error_type = match self.status() {
            400 | 404 => "invalid_request_error",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            _ => "api_error",
        };
        let v = serde_json::json!({ "error": { "message": message, "type": error_type, "code": code, "param": param } });
        v.to_string().into_bytes()
    }

    /// The reply's headers: `request-id` (when known) first, `content-type`, the marker
    /// header, and for a shed request `retry-after` and `retry-after-ms`.
    pub fn headers(&self, request_id: Option<&str>) -> Vec<(&'static str, Vec<u8>)> {
        let (_, _, _, marker, marker_value) = self.parts();
        let mut headers = Vec::with_capacity(5);
        if let Some(id) = request_id {
            headers.push(("request-id", echoed_value(id)));
        }
        headers.push(("content-type", b"application/json".to_vec()));
        headers.push((marker, marker_value));
        if let Reject::Shed { retry_after_ms, .. } = self {
            let secs = retry_after_secs(*retry_after_ms);
            headers.push(("retry-after", secs.to_string().into_bytes()));
            headers.push(("retry-after-ms", retry_after_ms.to_string().into_bytes()));
        }
        headers
    }

    /// Envoy's `response.code_details` for the reply: `kvroute_<kind>` (the shipped
    /// configuration's local-reply rules leave replies with these details unchanged).
    pub fn details(&self) -> String {
        format!("kvroute_{}", self.kind())
    }

    /// The `ImmediateResponse` ([`Reject::headers`], [`Reject::body`], [`Reject::details`]).
    pub fn to_response(&self, request_id: Option<&str>) -> ProcessingResponse {
        let headers = self
            .headers(request_id)
            .into_iter()
            .map(|(k, v)| header(k, v))
            .collect();
        let immediate = ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(self.status()),
            }),
            headers: mutation(headers),
            body: self.body(),
            details: self.details(),
            ..Default::default()
        };
        ProcessingResponse {
            response: Some(Response::ImmediateResponse(immediate)),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_use_raw_value_and_overwrite() {
        let h = header("target-pod", "10.0.0.1:80");
        let v = h.header.unwrap();
        assert_eq!(
            (v.value.as_str(), v.raw_value.as_slice()),
            ("", &b"10.0.0.1:80"[..])
        );
        assert_eq!(
            h.append_action,
            HeaderAppendAction::OverwriteIfExistsOrAdd as i32
        );
    }

    #[test]
    fn route_reply_carries_metadata_and_clears_route_cache() {
        let r = route_in_body(&RouteTo {
            address: "10.0.0.1:80",
            strategy: "prefix-cache",
            data_parallel_rank: None,
        });
        let md = r.dynamic_metadata.unwrap();
        let Some(Kind::StructValue(lb)) = &md.fields[LB_NAMESPACE].kind else {
            panic!("no envoy.lb")
        };
        assert_eq!(
            lb.fields[DESTINATION_HEADER].kind,
            Some(Kind::StringValue("10.0.0.1:80".into()))
        );
        let Some(Response::RequestBody(b)) = r.response else {
            panic!("not a body reply")
        };
        let common = b.response.unwrap();
        assert!(common.clear_route_cache);
        let set: Vec<_> = common.header_mutation.unwrap().set_headers;
        let names: Vec<_> = set
            .iter()
            .map(|h| h.header.as_ref().unwrap().key.as_str())
            .collect();
        assert_eq!(
            names,
            [DESTINATION_HEADER, "target-pod", "routing-strategy"]
        );
    }

    #[test]
    fn an_engine_of_a_data_parallel_server_gets_its_rank_header() {
        let to = RouteTo {
            address: "10.0.0.1:80",
            strategy: "least-ttft",
            data_parallel_rank: Some(3),
        };
        let Some(Kind::StructValue(lb)) =
            &route_in_body(&to).dynamic_metadata.unwrap().fields[LB_NAMESPACE].kind
        else {
            panic!("no envoy.lb")
        };
        assert_eq!(
            lb.fields["x-data-parallel-rank"].kind,
            Some(Kind::StringValue("3".into()))
        );
        let headers: Vec<(&str, String)> = to
            .upstream_headers()
            .map(|(n, v)| (n, v.into_owned()))
            .collect();
        assert_eq!(
            headers,
            [
                (DESTINATION_HEADER, "10.0.0.1:80".to_owned()),
                ("target-pod", "10.0.0.1:80".to_owned()),
                ("routing-strategy", "least-ttft".to_owned()),
                ("x-data-parallel-rank", "3".to_owned()),
            ]
        );
    }

    #[test]
    fn every_rejection_names_itself_in_envoys_details() {
        // The shipped Envoy config leaves replies whose details start with "kvroute_" as they
        // are (local_reply_config); any other would be rewritten as one of Envoy's own errors.
        for r in Reject::every() {
            use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
            let Some(Response::ImmediateResponse(i)) = r.to_response(None).response else {
                panic!("{r:?}: not an immediate response")
            };
            assert_eq!(i.details, format!("kvroute_{}", r.kind()));
        }
    }

    #[test]
    fn rejections_follow_aibrix() {
        let r = Reject::UnknownModel("x".into());
        assert_eq!(r.status(), 400);
        let body: serde_json::Value = serde_json::from_slice(&r.body()).unwrap();
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(Reject::NoReadyPod("x".into()).status(), 503);
        assert_eq!(Reject::TooLarge { limit: 1 }.status(), 413);
        let Some(Response::ImmediateResponse(i)) =
            Reject::NoMessages.to_response(Some("id")).response
        else {
            panic!("not immediate")
        };
        let keys: Vec<_> = i
            .headers
            .unwrap()
            .set_headers
            .into_iter()
            .map(|h| h.header.unwrap().key)
            .collect();
        assert_eq!(
            keys,
            [
                "request-id",
                "content-type",
                "x-error-request-body-processing"
            ]
        );
    }

    #[test]
    fn a_shed_request_gets_429_retry_after_and_an_openai_style_body() {
        let r = Reject::Shed {
            model: "m".into(),
            reason: "deadline",
            retry_after_ms: 1_001,
        };
        assert_eq!((r.status(), r.kind()), (429, "shed"));
        let body: serde_json::Value = serde_json::from_slice(&r.body()).unwrap();
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        assert_eq!(
            body["error"]["message"],
            "model m is saturated: request shed (deadline); retry after 2 s"
        );
        let headers = r.headers(None);
        let get = |k: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        assert_eq!(get("retry-after").as_deref(), Some("2"));
        assert_eq!(get("retry-after-ms").as_deref(), Some("1001"));
        assert_eq!(get("x-kvroute-shed").as_deref(), Some("deadline"));
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(3_000), 3);
        let t = extend_message_timeout(std::time::Duration::from_millis(31_500));
        let d = t.override_message_timeout.unwrap();
        assert_eq!((d.seconds, d.nanos, t.response), (31, 500_000_000, None));
    }

    #[test]
    fn client_text_becomes_a_short_visible_ascii_header_value() {
        assert_eq!(echoed_value("llama-3.1-8b"), b"llama-3.1-8b");
        assert_eq!(echoed_value("a b%\r\n\0é"), b"a%20b%25%0D%0A%00%C3%A9");
        let long = echoed_value(&"\n".repeat(1 << 20));
        assert_eq!(
            long.len(),
            MAX_ECHOED_VALUE_BYTES - 1,
            "cut between escapes"
        );
        assert!(long.ends_with(b"%0A..."));
        let exact = "m".repeat(MAX_ECHOED_VALUE_BYTES);
        assert_eq!(echoed_value(&exact), exact.as_bytes(), "fits: not cut");
        let over = echoed_value(&format!("{exact}x"));
        assert_eq!(over.len(), MAX_ECHOED_VALUE_BYTES);
        assert!(over.ends_with(b"m..."));

        let model = format!("evil\r\nx-injected: 1\0{}", "m".repeat(3 << 20));
        let Some(Response::ImmediateResponse(i)) = Reject::UnknownModel(model)
            .to_response(Some("id\u{7f}"))
            .response
        else {
            panic!("not immediate")
        };
        let headers: Vec<_> = i
            .headers
            .unwrap()
            .set_headers
            .into_iter()
            .map(|h| h.header.unwrap())
            .collect();
        assert_eq!(headers[0].key, "request-id");
        assert_eq!(headers[0].raw_value, b"id%7F");
        let marker = &headers[2];
        assert_eq!(marker.key, "x-error-no-model-backends");
        assert!(marker.raw_value.len() <= MAX_ECHOED_VALUE_BYTES);
        assert!(marker
            .raw_value
            .starts_with(b"evil%0D%0Ax-injected:%201%00mmm"));
        assert!(headers
            .iter()
            .all(|h| h.raw_value.iter().all(u8::is_ascii_graphic)));
    }
}
