//! FULL_DUPLEX_STREAMED bodies: deferred header replies, echoed chunks, errors.

use super::*;

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
