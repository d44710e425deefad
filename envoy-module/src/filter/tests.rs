//! The filter's logic over a fake host: what Envoy would be told at each call.

use std::borrow::Cow;
use std::collections::BTreeMap;

use kvroute_ext_proc::config::{ConfigSource, Overrides};
use kvroute_ext_proc::env::EnvSnapshot;

use super::*;

const CONFIG: &str = "[routing]\nseed = 3\n[limits]\nmax_body_bytes = 1000\n[models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\" }, { name = \"b\", address = \"10.0.0.2:80\" }]";

fn shared() -> Arc<Shared> {
    shared_with(CONFIG)
}

fn shared_with(text: &str) -> Arc<Shared> {
    let source = ConfigSource {
        path: None,
        env: EnvSnapshot::default(),
        overrides: Overrides::default(),
        process_seed: 1,
    };
    let config = source.load_bytes(text.as_bytes()).unwrap();
    Shared::new(
        &config,
        &mut prometheus_client::registry::Registry::default(),
    )
    .unwrap()
}

/// A local reply as sent: status, headers, body, details.
type Reply = (u16, Vec<(String, Vec<u8>)>, Vec<u8>, String);

/// A stream as Envoy would show it, recording what the filter asked.
#[derive(Default)]
struct FakeHost {
    request_headers: BTreeMap<String, Vec<u8>>,
    body: Vec<u8>,
    upstream: Option<String>,
    response_headers: BTreeMap<String, Vec<u8>>,
    chunk: Vec<u8>,
    details: Option<String>,
    reply: Option<Reply>,
}

impl FakeHost {
    fn post(path: &str, body: &str) -> FakeHost {
        let mut h = FakeHost::default();
        h.request_headers.insert(":path".into(), path.into());
        h.request_headers
            .insert("x-request-id".into(), b"r-1".to_vec());
        h.body = body.as_bytes().to_vec();
        h
    }
}

impl StreamHost for FakeHost {
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        self.request_headers.get(name).cloned()
    }
    fn set_request_header(&mut self, name: &str, value: &[u8]) -> bool {
        self.request_headers.insert(name.into(), value.to_vec());
        true
    }
    fn request_body(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.body)
    }
    fn request_body_len(&self) -> usize {
        self.body.len()
    }
    fn set_destination(&mut self, address: &str) -> bool {
        self.upstream = Some(address.into());
        true
    }
    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        self.response_headers.get(name).cloned()
    }
    fn set_response_header(&mut self, name: &str, value: &[u8]) -> bool {
        self.response_headers.insert(name.into(), value.to_vec());
        true
    }
    fn response_chunk(&self) -> Vec<&[u8]> {
        vec![&self.chunk]
    }
    fn response_code_details(&self) -> Option<String> {
        self.details.clone()
    }
    fn response_code(&self) -> Option<u16> {
        None
    }
    fn send_local_reply(
        &mut self,
        status: u16,
        headers: &[(&str, &[u8])],
        body: &[u8],
        details: &str,
    ) {
        let headers = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
            .collect();
        self.reply = Some((status, headers, body.to_vec(), details.to_owned()));
    }
}

fn in_flight(sh: &Shared) -> u64 {
    sh.router
        .lock()
        .pods()
        .iter()
        .map(|p| u64::from(p.in_flight))
        .sum()
}

#[test]
fn a_completion_is_routed_at_the_body_end_and_released_at_the_stream_end() {
    let sh = shared();
    let mut f = Filter::new(sh.clone());
    let mut host = FakeHost::post("/v1/completions", r#"{"model":"m","prompt":"hello"}"#);
    assert_eq!(f.on_request_headers(&mut host, false), HeadersStatus::Stop);
    assert_eq!(
        f.on_request_body(&mut host, false),
        BodyStatus::StopAndBuffer
    );
    assert_eq!(f.on_request_body(&mut host, true), BodyStatus::Continue);
    let upstream = host.upstream.clone().expect("an upstream host");
    assert!(upstream == "10.0.0.1:80" || upstream == "10.0.0.2:80");
    for name in ["x-gateway-destination-endpoint", "target-pod"] {
        assert_eq!(host.request_headers[name], upstream.as_bytes(), "{name}");
    }
    assert_eq!(in_flight(&sh), 1);

    host.response_headers
        .insert(":status".into(), b"200".to_vec());
    host.response_headers
        .insert("content-type".into(), b"text/event-stream".to_vec());
    assert_eq!(f.on_response_headers(&mut host), HeadersStatus::Continue);
    assert_eq!(host.response_headers["target-pod-ip"], upstream.as_bytes());
    assert_eq!(host.response_headers["request-id"], b"r-1");
    assert!(host.response_headers.contains_key("x-kvroute-decision"));
    host.chunk = b"data: {\"choices\":[{\"text\":\"hi\"}]}\n\n".to_vec();
    assert_eq!(f.on_response_body(&mut host), BodyStatus::Continue);
    f.on_stream_complete();
    assert_eq!(in_flight(&sh), 0, "released at the stream's end");
    drop(f);
    assert_eq!(in_flight(&sh), 0, "and only once");
    let stats = sh.router.lock().stats();
    assert_eq!(stats.tickets.completed.iter().sum::<u64>(), 1);
}

#[test]
fn dropping_an_unfinished_stream_releases_its_ticket() {
    let sh = shared();
    let mut f = Filter::new(sh.clone());
    let mut host = FakeHost::post("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
    f.on_request_headers(&mut host, false);
    f.on_request_body(&mut host, true);
    assert!(f.is_routed());
    drop(f);
    assert_eq!(in_flight(&sh), 0);
}

#[test]
fn rejections_are_local_replies_with_aibrix_bodies() {
    let sh = shared();
    let cases: [(&str, &str, Option<&str>, u16, &str); 4] = [
        (
            "/v1/completions",
            r#"{"model":"nope","prompt":"x"}"#,
            None,
            400,
            "kvroute_model_not_found",
        ),
        (
            "/v1/completions",
            "{not json",
            None,
            400,
            "kvroute_bad_body",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m"}"#,
            None,
            400,
            "kvroute_no_messages",
        ),
        (
            "/v1/completions",
            r#"{"model":"m","prompt":"x"}"#,
            Some("fastest"),
            400,
            "kvroute_bad_strategy",
        ),
    ];
    for (path, body, strategy, status, details) in cases {
        let mut f = Filter::new(sh.clone());
        let mut host = FakeHost::post(path, body);
        if let Some(s) = strategy {
            host.request_headers
                .insert("routing-strategy".into(), s.into());
        }
        if f.on_request_headers(&mut host, false) == HeadersStatus::Continue
            || f.on_request_body(&mut host, true) != BodyStatus::Continue
        {
            // Rejected at the headers or at the body.
        }
        let (got, headers, reply, got_details) = host.reply.clone().expect("a local reply");
        assert_eq!(
            (got, got_details.as_str()),
            (status, details),
            "{path} {body}"
        );
        let json: serde_json::Value = serde_json::from_slice(&reply).unwrap();
        assert!(json["error"]["message"].is_string());
        assert!(headers.iter().any(|(k, _)| k == "content-type"));
        assert_eq!(host.upstream, None);
        assert!(!f.is_routed());
        // kvroute's own reply passes back through the filter unchanged.
        host.response_headers
            .insert(":status".into(), status.to_string().into_bytes());
        f.on_response_headers(&mut host);
        assert!(!host.response_headers.contains_key("target-pod"));
    }
    assert_eq!(in_flight(&sh), 0);
}

#[test]
fn a_body_past_the_limit_is_dropped_and_answered_413_at_its_end() {
    let sh = shared();
    let mut f = Filter::new(sh.clone());
    let mut host = FakeHost::post("/v1/completions", &"x".repeat(1001));
    assert_eq!(f.on_request_headers(&mut host, false), HeadersStatus::Stop);
    // Past the limit: no longer buffered, no reply while the client is still sending.
    assert_eq!(f.on_request_body(&mut host, false), BodyStatus::Stop);
    assert!(host.reply.is_none());
    assert_eq!(f.on_request_body(&mut host, false), BodyStatus::Stop);
    assert_eq!(f.on_request_body(&mut host, true), BodyStatus::Stop);
    assert_eq!(host.reply.as_ref().unwrap().0, 413);
    // An announced length over the limit is decided at the headers, answered at the end
    // (of the body, or of the trailers).
    for trailers in [false, true] {
        let mut f = Filter::new(sh.clone());
        let mut host = FakeHost::post("/v1/completions", "");
        host.request_headers
            .insert("content-length".into(), b"5000".to_vec());
        assert_eq!(f.on_request_headers(&mut host, false), HeadersStatus::Stop);
        assert!(host.reply.is_none());
        assert_eq!(f.on_request_body(&mut host, false), BodyStatus::Stop);
        if trailers {
            assert_eq!(f.on_request_trailers(&mut host), HeadersStatus::Stop);
        } else {
            assert_eq!(f.on_request_body(&mut host, true), BodyStatus::Stop);
        }
        let (status, _, _, details) = host.reply.clone().unwrap();
        assert_eq!((status, details.as_str()), (413, "kvroute_too_large"));
    }
    // Without a body, a bad request is answered at once.
    let mut f = Filter::new(sh.clone());
    let mut host = FakeHost::default();
    host.request_headers
        .insert(":path".into(), b"/v1/models".to_vec());
    host.request_headers
        .insert("routing-strategy".into(), b"fastest".to_vec());
    assert_eq!(f.on_request_headers(&mut host, true), HeadersStatus::Stop);
    assert_eq!(host.reply.as_ref().unwrap().0, 400);
    assert_eq!(in_flight(&sh), 0);
}

#[test]
fn an_upstream_5xx_counts_as_failed_and_a_request_without_body_routes_on_headers() {
    let sh = shared();
    let mut f = Filter::new(sh.clone());
    let mut host = FakeHost::default();
    host.request_headers
        .insert(":path".into(), b"/v1/models".to_vec());
    host.request_headers.insert("model".into(), b"m".to_vec());
    assert_eq!(
        f.on_request_headers(&mut host, true),
        HeadersStatus::Continue
    );
    assert!(host.upstream.is_some());
    host.response_headers
        .insert(":status".into(), b"503".to_vec());
    host.details = Some("via_upstream".into());
    f.on_response_headers(&mut host);
    drop(f);
    let stats = sh.router.lock().stats();
    assert_eq!(
        stats.tickets.completed[kvroute_core::Outcome::Failed as usize],
        1
    );
}

#[test]
fn a_request_admission_would_hold_is_shed_with_429_and_retry_after() {
    // Two pods of one sequence each, both busy past the target: kvroute-ext-proc would hold
    // the third request; the module cannot, so it is taken out of the queue and shed.
    let text = "[routing]\nseed = 3\ndefault_strategy = \"least-ttft\"\n[engine_metrics]\nscrape_interval_ms = 0\n\
        [models.m]\npods = [{ name = \"a\", address = \"10.0.0.1:80\", max_seqs = 1 }, { name = \"b\", address = \"10.0.0.2:80\", max_seqs = 1 }]\n\
        [admission.models.m]\nttft_target_ms = 1000\n";
    let sh = shared_with(text);
    let body = r#"{"model":"m","prompt":"hello","max_tokens":100}"#;
    let mut busy = Vec::new();
    for _ in 0..3 {
        let mut f = Filter::new(sh.clone());
        let mut host = FakeHost::post("/v1/completions", body);
        f.on_request_headers(&mut host, false);
        f.on_request_body(&mut host, true);
        busy.push((f, host));
    }
    let (f, host) = &busy[2];
    assert!(!f.is_routed());
    let (status, headers, reply, details) = host.reply.clone().expect("a local reply");
    assert_eq!((status, details.as_str()), (429, "kvroute_shed"));
    let header = |k: &str| {
        headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header("retry-after").as_deref(), Some("1"));
    assert_eq!(header("x-kvroute-shed").as_deref(), Some("would_queue"));
    let json: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(json["error"]["code"], "rate_limit_exceeded");
    assert_eq!(in_flight(&sh), 2);
    assert_eq!(
        sh.router.lock().admission_stats("m").unwrap().queue_len,
        0,
        "nothing left queued"
    );
}
