//! Admission under saturation in the stream: a held request's timer extension, its verdict
//! after the pump, 429s with Retry-After, cancels, deadlines, and the module's shed.

use futures_util::FutureExt;

use super::*;
use crate::admission::{self, Verdict};

/// Two pods of one sequence each, routed by least-ttft: an idle pod is predicted to start a
/// short prompt in well under a second, a busy one only after its request (100 output tokens
/// at 50 ms) ends; the target, 1 s, is met by an idle pod only.
fn saturable(queue_timeout_ms: u64) -> Arc<Shared> {
    shared_with(&format!(
        "[routing]\nseed = 3\ndefault_strategy = \"least-ttft\"\n[engine_metrics]\nscrape_interval_ms = 0\n\
         [models.m]\npods = [{{ name = \"a\", address = \"10.0.0.1:80\", max_seqs = 1 }}, {{ name = \"b\", address = \"10.0.0.2:80\", max_seqs = 1 }}]\n\
         [admission]\ntenant_header = \"x-tenant\"\n\
         [admission.models.m]\nttft_target_ms = 1000\nmax_queue = 2\nqueue_timeout_ms = {queue_timeout_ms}\n"
    ))
}

const BODY: &str = r#"{"model":"m","prompt":"hello","max_tokens":100}"#;

/// A POST with these extra request headers, up to its body's reply.
fn post(sh: &Arc<Shared>, extra: &[(&str, &str)]) -> (StreamState, Option<ProcessingResponse>) {
    let mut st = StreamState::new(sh.clone());
    let mut pairs = vec![(":path", "/v1/completions")];
    pairs.extend_from_slice(extra);
    st.on_message(headers(&pairs, false)).unwrap();
    let r = st.on_message(body(BODY));
    (st, r)
}

fn queue_len(sh: &Shared) -> u64 {
    sh.router.lock().admission_stats("m").unwrap().queue_len
}

/// The timer extension a held request's first reply is (and nothing else).
fn extension_secs(r: &ProcessingResponse) -> f64 {
    let d = r
        .override_message_timeout
        .as_ref()
        .expect("a timer extension");
    assert!(r.response.is_none(), "{r:?}");
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

/// The verdict once the pump has run (none yet: `None`).
fn verdict(st: &mut StreamState) -> Option<Verdict> {
    st.verdict().now_or_never()
}

fn retry_after(r: &ProcessingResponse) -> Option<String> {
    let Some(Response::ImmediateResponse(i)) = &r.response else {
        panic!("not rejected: {r:?}")
    };
    let set = &i.headers.as_ref()?.set_headers;
    set.iter().find_map(|o| {
        let h = o.header.as_ref()?;
        (h.key == "retry-after").then(|| String::from_utf8_lossy(&h.raw_value).into_owned())
    })
}

#[test]
fn a_held_request_is_routed_when_a_slot_frees_and_sheddable_ones_get_429() {
    let sh = saturable(60_000);
    let (a, r) = post(&sh, &[]);
    assert!(is_routing_reply(&r.unwrap()));
    let (_b, r) = post(&sh, &[]);
    assert!(is_routing_reply(&r.unwrap()));
    assert_eq!(in_flight(&sh), 2);

    // Both pods busy past the target: held, and Envoy's timer extended to the queue timeout
    // and the grace.
    let (mut held, r) = post(&sh, &[("x-request-id", "held-1"), ("x-tenant", "t1")]);
    assert_eq!(extension_secs(&r.unwrap()), 61.0);
    assert!(held.is_holding());
    assert_eq!(queue_len(&sh), 1);
    // A message meanwhile is kept for after the verdict.
    let trailers = ProcessingRequest {
        request: Some(Request::RequestTrailers(Default::default())),
        ..Default::default()
    };
    assert!(held.on_message(trailers).is_none());
    assert!(held.next_stashed().is_none(), "kept while held");

    // Sheddable (by name or a negative number): 429 at once, with Retry-After.
    for p in ["sheddable", "-5"] {
        let (st, r) = post(&sh, &[("x-kvroute-priority", p)]);
        let r = r.unwrap();
        let (code, body) = immediate(&r);
        assert_eq!(code, 429, "{p}");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        let secs: u64 = retry_after(&r).unwrap().parse().unwrap();
        assert!(secs >= 1, "{secs}");
        assert!(!st.is_holding());
    }

    // Nothing freed: the pump leaves it held.
    admission::pump(&sh);
    assert!(verdict(&mut held).is_none());
    // A completion frees a slot: the pump routes the held request there.
    drop(a);
    assert_eq!(in_flight(&sh), 1);
    admission::pump(&sh);
    let v = verdict(&mut held).expect("a verdict");
    let reply = held.on_verdict(v).unwrap();
    assert!(is_routing_reply(&reply), "{reply:?}");
    assert!(!held.is_holding());
    assert_eq!((in_flight(&sh), queue_len(&sh)), (2, 0));
    let stashed = held
        .next_stashed()
        .expect("the trailers, after the verdict");
    let r = held.on_message(stashed).unwrap();
    assert!(matches!(r.response, Some(Response::RequestTrailers(_))));
    // The dispatched request is answered and released as any other.
    let keys = header_keys(held.on_message(response_headers("200")).unwrap());
    assert!(keys.contains(&"target-pod".to_owned()));
    drop(held);
    assert_eq!(in_flight(&sh), 1);
    let s = sh.router.lock().admission_stats("m").unwrap();
    assert_eq!((s.admitted, s.queued, s.dispatched), (2, 1, 1));
    assert_eq!((s.shed_saturated, s.queue_len), (2, 0));
}

#[test]
fn a_client_that_leaves_takes_its_request_out_of_the_queue() {
    let sh = saturable(60_000);
    let busy: Vec<_> = (0..2).map(|_| post(&sh, &[]).0).collect();
    let (first, _) = post(&sh, &[]);
    let (second, _) = post(&sh, &[]);
    assert_eq!(queue_len(&sh), 2);
    // Full: 429 queue_full.
    let (_, r) = post(&sh, &[]);
    assert_eq!(immediate(&r.unwrap()).0, 429);
    drop(first);
    assert_eq!(queue_len(&sh), 1);
    // The head left: the next one is routed when a slot frees.
    drop(busy);
    admission::pump(&sh);
    let mut second = second;
    assert!(matches!(verdict(&mut second), Some(Verdict::Routed(_))));
    let stats = sh.router.lock().admission_stats("m").unwrap();
    assert_eq!(
        (stats.cancelled, stats.dispatched, stats.queue_len),
        (1, 1, 0)
    );
}

#[test]
fn a_request_held_past_its_deadline_gets_429() {
    let sh = saturable(30);
    let _busy: Vec<_> = (0..2).map(|_| post(&sh, &[]).0).collect();
    let (mut held, r) = post(&sh, &[("x-request-id", "late")]);
    assert_eq!(extension_secs(&r.unwrap()), 1.03);
    std::thread::sleep(std::time::Duration::from_millis(40));
    admission::pump(&sh);
    let v = verdict(&mut held).expect("shed at its deadline");
    let r = held.on_verdict(v).unwrap();
    let (code, body) = immediate(&r);
    assert_eq!(code, 429);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("(deadline)"),
        "{body}"
    );
    assert_eq!(retry_after(&r).as_deref(), Some("1"));
    assert_eq!(queue_len(&sh), 0);
    // Nothing more goes out after the 429.
    assert!(held.on_message(response_headers("200")).is_none());
}

#[test]
fn a_held_full_duplex_request_gets_no_timer_extension_and_its_replies_in_order() {
    use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;
    let sh = saturable(60_000);
    let busy: Vec<_> = (0..2).map(|_| post(&sh, &[]).0).collect();
    let mut st = StreamState::new(sh.clone());
    let mut h = headers(&[(":path", "/v1/completions")], false);
    h.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: BodySendMode::FullDuplexStreamed as i32,
        ..Default::default()
    });
    assert!(st.on_message(h).is_none());
    assert!(st.on_message(body(BODY)).is_none(), "no timer to extend");
    assert!(st.is_holding());
    drop(busy);
    admission::pump(&sh);
    let v = verdict(&mut st).unwrap();
    let first = st.on_verdict(v).unwrap();
    assert!(matches!(first.response, Some(Response::RequestHeaders(_))));
    assert!(first.dynamic_metadata.is_some());
    let echo = st.next_queued().expect("the body passed back");
    assert!(matches!(echo.response, Some(Response::RequestBody(_))));
    assert!(st.next_queued().is_none());
}

#[test]
fn a_caller_that_cannot_hold_gets_429_would_queue_and_leaves_nothing_queued() {
    let sh = saturable(60_000);
    let _busy: Vec<_> = (0..2).map(|_| post(&sh, &[]).0).collect();
    let info = RequestInfo {
        path: "/v1/completions".into(),
        ..Default::default()
    };
    let at = RouteInputs {
        info: &info,
        strategy: None,
        subset: None,
    };
    let err = routing::route_body(&sh, at, BODY.as_bytes()).unwrap_err();
    assert_eq!(
        err,
        Reject::Shed {
            model: "m".into(),
            reason: "would_queue",
            retry_after_ms: admission::WOULD_QUEUE_RETRY_AFTER_MS
        }
    );
    assert_eq!(queue_len(&sh), 0);
    assert!(sh.holds.is_empty());
}
