//! The per-request state machine, message by message.

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::HttpBody;

use super::*;
use crate::config::from_toml;
use kvroute_core::RouteRequest;

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
    assert!(matches!(r.response, Some(Response::RequestBody(_))) && r.dynamic_metadata.is_some());
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

/// The request attributes of the shipped configuration, as Envoy sends them with its first
/// message of a request: `(expression index in REQUEST_ATTRIBUTES, value)`; the others absent.
fn request_attributes(
    values: &[(usize, &str)],
) -> std::collections::HashMap<String, envoy_types::pb::google::protobuf::Struct> {
    use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
    let fields = values
        .iter()
        .map(|(i, v)| {
            let value = Value {
                kind: Some(Kind::StringValue((*v).to_owned())),
            };
            (envoy_context::REQUEST_ATTRIBUTES[*i].0.to_owned(), value)
        })
        .collect();
    [("envoy.filters.http.ext_proc".to_owned(), Struct { fields })].into()
}

/// A BUFFERED request body as Envoy sends it when it skips the request headers: the first
/// message of the request, with the request attributes.
fn body_first(b: &str, attributes: &[(usize, &str)]) -> ProcessingRequest {
    let mut m = body(b);
    if !attributes.is_empty() {
        m.attributes = request_attributes(attributes);
    }
    m.protocol_config = Some(
        envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration {
            request_body_mode: BodySendMode::Buffered as i32,
            ..Default::default()
        },
    );
    m
}

/// The value of header `name` in a response-headers reply.
fn header_value(r: &ProcessingResponse, name: &str) -> Option<String> {
    let Some(Response::ResponseHeaders(h)) = &r.response else {
        panic!("no response-headers reply: {r:?}")
    };
    let set = &h.response.as_ref()?.header_mutation.as_ref()?.set_headers;
    set.iter().find_map(|o| {
        let h = o.header.as_ref()?;
        (h.key == name).then(|| String::from_utf8_lossy(&h.raw_value).into_owned())
    })
}

#[test]
fn without_request_headers_the_attributes_with_the_body_stand_for_them() {
    // request_header_mode SKIP: the body is the first message and carries the path, the
    // request id and the strategy as request attributes.
    let sh = shared();
    let mut st = StreamState::new(sh.clone());
    let first = body_first(
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        &[
            (0, "/v1/chat/completions"),
            (1, "rid-7"),
            (2, "least-request"),
        ],
    );
    let r = st.on_message(first).unwrap();
    assert!(is_routing_reply(&r), "{r:?}");
    assert_eq!(in_flight(&sh), 1);
    let reply = st.on_message(response_headers("200")).unwrap();
    assert_eq!(header_value(&reply, "request-id").as_deref(), Some("rid-7"));
    assert_eq!(
        header_value(&reply, "routing-strategy").as_deref(),
        Some("least-request")
    );
    assert!(header_value(&reply, "x-kvroute-decision")
        .unwrap()
        .contains("reason=least_request"));
    drop(st);
    assert_eq!(in_flight(&sh), 0);

    // The path decides how the body is read: a chat body without messages is refused.
    let mut st = StreamState::new(sh.clone());
    let r = st.on_message(body_first(
        r#"{"model":"m"}"#,
        &[(0, "/v1/chat/completions"), (1, "rid-8")],
    ));
    let (code, j) = immediate(&r.unwrap());
    assert_eq!(
        (code, j["error"]["param"].as_str()),
        (400, Some("messages"))
    );

    // Absent attributes (no strategy header; an id that was not UTF-8): the defaults.
    let mut st = StreamState::new(sh.clone());
    let r = st.on_message(body_first(
        r#"{"model":"m","prompt":"hello"}"#,
        &[(0, "/v1/completions")],
    ));
    assert!(is_routing_reply(&r.unwrap()));
    let reply = st.on_message(response_headers("200")).unwrap();
    assert_eq!(header_value(&reply, "request-id"), None);
    assert_eq!(
        header_value(&reply, "routing-strategy").as_deref(),
        Some("prefix-cache")
    );
}

#[test]
fn a_bad_strategy_attribute_is_refused_before_the_body_is_read() {
    let sh = shared();
    // A strategy that does not parse, and the stand-in Envoy sends for one that is not UTF-8.
    for strategy in ["fastest", "\u{FFFD}"] {
        let mut st = StreamState::new(sh.clone());
        let r = st.on_message(body_first(
            "{not even json",
            &[(0, "/v1/completions"), (1, "rid-9"), (2, strategy)],
        ));
        let r = r.unwrap();
        let (code, j) = immediate(&r);
        assert_eq!(code, 400, "{strategy}");
        assert_eq!(
            j["error"]["message"],
            format!("incorrect routing strategy {strategy}")
        );
        let Some(Response::ImmediateResponse(i)) = r.response else {
            unreachable!()
        };
        let request_id = i.headers.unwrap().set_headers[0].header.clone().unwrap();
        assert_eq!(
            (request_id.key.as_str(), &request_id.raw_value[..]),
            ("request-id", &b"rid-9"[..])
        );
        assert!(st.on_message(response_headers("200")).is_none());
    }
    // A blank strategy is no strategy, as a blank header.
    let mut st = StreamState::new(sh.clone());
    let r = st.on_message(body_first(
        r#"{"model":"m","prompt":"x"}"#,
        &[(0, "/v1/completions"), (2, "")],
    ));
    assert!(is_routing_reply(&r.unwrap()));
    assert_eq!(sh.router.lock().stats().tickets.issued, 1);
}

#[test]
fn request_headers_win_over_request_attributes() {
    // A configuration that sends both (request headers SEND and request_attributes, as the
    // shipped GET route does): the headers are read, the attributes ignored.
    let sh = shared();
    let mut st = StreamState::new(sh.clone());
    let mut h = headers(
        &[
            (":path", "/v1/completions"),
            ("x-request-id", "from-header"),
        ],
        false,
    );
    h.attributes = request_attributes(&[
        (0, "/v1/chat/completions"),
        (1, "from-attributes"),
        (2, "fastest"),
    ]);
    let r = st.on_message(h).unwrap();
    assert!(
        matches!(r.response, Some(Response::RequestHeaders(_))),
        "{r:?}"
    );
    // Read as /v1/completions (a chat body would need messages), no strategy.
    let r = st
        .on_message(body(r#"{"model":"m","prompt":"hello"}"#))
        .unwrap();
    assert!(is_routing_reply(&r), "{r:?}");
    let reply = st.on_message(response_headers("200")).unwrap();
    assert_eq!(
        header_value(&reply, "request-id").as_deref(),
        Some("from-header")
    );
}

#[test]
fn a_body_without_headers_or_attributes_routes_on_its_model() {
    // request_header_mode SKIP without the request_attributes: no path, so only `model` is
    // read (a warning says what is missing).
    let sh = shared();
    let mut st = StreamState::new(sh.clone());
    let r = st.on_message(body_first(r#"{"model":"m","prompt":"hello"}"#, &[]));
    assert!(is_routing_reply(&r.unwrap()));
    assert_eq!(in_flight(&sh), 1);
}

mod admission;
mod full_duplex;
