//! The shipped Envoy config's hardening, through a real Envoy 1.40, the real
//! `kvroute-ext-proc` and `kvroute-sim serve` replicas (envoy/README.md, "Routed paths" and
//! "Envoy's own replies"):
//! - only the routed set of paths and methods reaches kvroute and the pods; Envoy answers any
//!   other request itself with a JSON 404;
//! - Envoy's own replies (connect failure, connection closed before the response, body above
//!   the buffer limit) are OpenAI-style JSON errors;
//! - kvroute's own answers reach the client exactly as kvroute sent them.
//!
//! Like tests/e2e.rs they need Envoy: `#[ignore]`d in the plain `cargo test --workspace`,
//! run by `make test-e2e` (`cargo test -p kvroute-ext-proc --test envoy_hardening -- --ignored`).

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use kvroute_ext_proc::respond::Reject;
use support::*;

/// Requests Envoy sent to ext_proc, and to a pod (routed or round-robin).
fn envoy_traffic(envoy: &Envoy) -> (u64, u64) {
    let ext_proc = envoy_stat(envoy, "http.kvroute_gateway.ext_proc.streams_started");
    let pods = envoy_stat(envoy, "cluster.kvroute_pods.upstream_rq_total")
        + envoy_stat(envoy, "cluster.kvroute_fallback.upstream_rq_total");
    (ext_proc, pods)
}

/// A loopback address nothing listens on (bound once, then released).
fn dead_address() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// A server that accepts each connection, reads the request and closes without answering.
fn closing_server() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
            let mut buf = [0u8; 65536];
            let _ = c.read(&mut buf);
        }
    });
    addr
}

/// POSTs `body` chunked (no `content-length`) and reads Envoy's answer even when Envoy resets
/// the connection after it: Envoy answers a body above its buffer limit before reading the
/// rest, then closes the connection with that rest unread (a reset, which the harness's
/// readers treat as a failure). The answer has a `content-length`; the body read is cut to it.
fn post_chunked_answered_early(addr: &str, path: &str, body: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\n\r\n{:x}\r\n",
        body.len()
    );
    // Writing may fail once Envoy has answered and closed: the answer is read below.
    let _ = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .and_then(|()| s.write_all(b"\r\n0\r\n\r\n"));
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
        if let Some(r) = complete_response(&raw) {
            return r;
        }
    }
    complete_response(&raw)
        .unwrap_or_else(|| panic!("no complete response: {}", String::from_utf8_lossy(&raw)))
}

/// `raw` as a response once its head and `content-length` bytes of body are there.
fn complete_response(raw: &[u8]) -> Option<Resp> {
    let (status, headers, start) = parse_head(raw)?;
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")?
        .1
        .parse()
        .ok()?;
    let body = raw.get(start..start + length)?.to_vec();
    Some(Resp {
        status,
        headers,
        body,
    })
}

/// Asserts an OpenAI-style JSON error from Envoy: `status`, `content-type: application/json`,
/// exactly the keys `message`, `type`, `param` (null) and `code`; returns the error object.
fn json_error(r: &Resp, status: u16, error_type: &str, code: &str) -> serde_json::Value {
    assert_eq!(r.status, status, "{r:?}\n{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    let j = r.json();
    let e = j["error"].clone();
    let mut keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["code", "message", "param", "type"], "{j}");
    assert_eq!(e["type"], error_type, "{j}");
    assert_eq!(e["code"], code, "{j}");
    assert!(e["param"].is_null(), "{j}");
    e
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn only_the_routed_paths_reach_kvroute_and_the_pods() {
    let s = Stack::start("paths", "", true);
    let listen = &s.envoy.listen;

    // Outside the routed set: Envoy's JSON 404, without calling ext_proc or a pod. The
    // message names method and path, never the query string.
    let before = envoy_traffic(&s.envoy);
    let cases: [(&str, &str, &[u8], &str); 9] = [
        ("GET", "/health", b"", "GET /health"),
        ("GET", "/metrics", b"", "GET /metrics"),
        (
            "POST",
            "/reset_prefix_cache",
            b"",
            "POST /reset_prefix_cache",
        ),
        ("GET", "/", b"", "GET /"),
        ("POST", "/v1/foo?secret=1", b"{}", "POST /v1/foo"),
        (
            "POST",
            "/v1/responses",
            br#"{"model":"study"}"#,
            "POST /v1/responses",
        ),
        ("GET", "/v1/completions", b"", "GET /v1/completions"),
        ("POST", "/v1/models", b"{}", "POST /v1/models"),
        ("POST", "/v1/completions/x", b"{}", "POST /v1/completions/x"),
    ];
    for (method, path, body, shown) in cases {
        let r = http(listen, method, path, &[], body);
        let e = json_error(&r, 404, "invalid_request_error", "not_found");
        assert_eq!(
            e["message"],
            format!("Invalid URL ({shown})"),
            "{method} {path}"
        );
        assert!(
            r.header("x-kvroute-sim-replica").is_none(),
            "{method} {path} reached a pod: {r:?}"
        );
    }
    assert_eq!(
        envoy_traffic(&s.envoy),
        before,
        "an unrouted request reached ext_proc or a pod"
    );

    // The routed set still reaches the pod kvroute chose (query strings ignored).
    let routed = |n: u64| envoy_stat(&s.envoy, "cluster.kvroute_pods.upstream_rq_total") == n;
    let r = http(listen, "GET", "/v1/models", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["data"][0]["id"], "study");
    assert!(r.header("x-kvroute-sim-replica").is_some(), "{r:?}");
    assert!(routed(1));
    let body = completion("study", &prompt("paths", 1, 2_000), 2, false);
    let r = s.post("/v1/completions?api-version=1", &[], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post("/v1/chat/completions", &[], &chat("study", "hi", 2, false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(routed(3));
    // Embeddings are routed on `model` (the replicas do not serve them: their own 404).
    let r = s.post(
        "/v1/embeddings",
        &[],
        br#"{"model":"study","input":"hello"}"#,
    );
    assert!(r.header("x-kvroute-sim-replica").is_some(), "{r:?}");
    assert!(routed(4));
    s.expect_in_flight(0);
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn envoys_own_failures_are_openai_json() {
    let dead = dead_address();
    let closing = closing_server();
    // Active checks off, so that kvroute keeps routing to the broken pods (Envoy answers).
    let extra = format!(
        "[limits]\nmax_body_bytes = 65536\n[engine_metrics]\nscrape_interval_ms = 0\n\
         [health]\ncheck_interval_ms = 0\n\
         [models.gone]\npods = [{{ name = \"gone-a\", address = \"{dead}\" }}]\n\
         [models.closing]\npods = [{{ name = \"closing-a\", address = \"{closing}\" }}]\n"
    );
    let s = Stack::start("local-replies", &extra, true);

    // Connect refused (UF): 503, Envoy's reason as the message, none of kvroute's markers.
    let r = s.post("/v1/completions", &[], &completion("gone", "x", 1, false));
    let e = json_error(&r, 503, "overloaded_error", "service_unavailable");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("remote connection failure"), "{message}");
    assert!(r.header("x-error-no-model-backends").is_none(), "{r:?}");

    // The pod closes the connection without an answer (UC): 503 as well.
    let r = s.post(
        "/v1/completions",
        &[],
        &completion("closing", "x", 1, false),
    );
    let e = json_error(&r, 503, "overloaded_error", "service_unavailable");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("connection termination"), "{message}");

    // A body above Envoy's buffer limit (twice max_body_bytes) without content-length: Envoy's
    // 413, in the same words as kvroute's own 413 (marker header included).
    let big = completion("study", &"x".repeat(300_000), 1, false);
    let r = post_chunked_answered_early(&s.envoy.listen, "/v1/completions", &big);
    json_error(&r, 413, "api_error", "request_too_large");
    let kvroutes: serde_json::Value =
        serde_json::from_slice(&Reject::TooLarge { limit: 65_536 }.body()).unwrap();
    assert_eq!(r.json(), kvroutes);
    assert_eq!(r.header("x-error-request-body-processing"), Some("true"));
    assert!(r.header("x-kvroute-sim-replica").is_none());

    // Each answer above was Envoy's, after kvroute routed the first two: no pod answered.
    assert_eq!(
        envoy_stat(&s.envoy, "cluster.kvroute_pods.upstream_rq_2xx"),
        0
    );
    s.expect_in_flight(0);
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn kvroutes_own_answers_pass_through_unchanged() {
    let s = Stack::start("passthrough", "[limits]\nmax_body_bytes = 65536\n", true);
    let id = [("x-request-id", "rid-pass")];
    // (request headers, body, kvroute's answer, its marker header and value)
    type Case = (
        Vec<(&'static str, &'static str)>,
        Vec<u8>,
        Reject,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            vec![],
            completion("nope", "x", 1, false),
            Reject::UnknownModel("nope".into()),
            "x-error-no-model-backends",
            "nope",
        ),
        (
            vec![("routing-strategy", "fastest")],
            completion("study", "x", 1, false),
            Reject::BadStrategy("fastest".into()),
            "x-error-routing",
            "true",
        ),
        (
            vec![],
            b"{not json".to_vec(),
            Reject::BadBody(String::new()),
            "x-error-request-body-processing",
            "true",
        ),
        // Over max_body_bytes but under Envoy's buffer limit: kvroute's 413, not Envoy's.
        (
            vec![],
            completion("study", &"x".repeat(100_000), 1, false),
            Reject::TooLarge { limit: 65_536 },
            "x-error-request-body-processing",
            "true",
        ),
    ];
    for (headers, body, reject, marker, value) in cases {
        let mut all = id.to_vec();
        all.extend(headers);
        let r = s.post("/v1/completions", &all, &body);
        assert_eq!(r.status, reject.status(), "{reject:?}: {}", r.text());
        assert_eq!(
            r.body,
            reject.body(),
            "{reject:?}: body changed on the way: {}",
            r.text()
        );
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.header(marker), Some(value), "{r:?}");
        assert_eq!(r.header("request-id"), Some("rid-pass"), "{r:?}");
        assert_eq!(
            r.header("content-length"),
            Some(reject.body().len().to_string().as_str())
        );
        assert!(r.header("x-kvroute-sim-replica").is_none());
    }
    s.expect_in_flight(0);
}

/// The Envoy Gateway patch's local_reply_config (envoy/gateway/gateway.yaml) is the template's
/// (tested above through a real Envoy), re-indented, with the body limit written out.
#[test]
fn gateway_local_replies_are_the_templates() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy");
    let template = std::fs::read_to_string(root.join("envoy.template.yaml")).unwrap();
    let gateway = std::fs::read_to_string(root.join("gateway/gateway.yaml")).unwrap();
    // The lines under `key` (more indented than it, up to the next line that is not),
    // dedented, comments dropped.
    let block = |text: &str, key: &str| -> Vec<String> {
        let mut lines = text.lines().skip_while(|l| l.trim() != key);
        let head = lines.next().unwrap_or_else(|| panic!("no {key}"));
        let indent = head.len() - head.trim_start().len();
        lines
            .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .map(|l| l[indent..].to_owned())
            .collect()
    };
    let ours = block(&template, "local_reply_config:");
    let theirs = block(
        gateway
            .split("path: /default_filter_chain/filters/0/typed_config/local_reply_config")
            .nth(1)
            .expect("no local_reply_config patch"),
        "value:",
    );
    assert!(ours.len() > 20, "{ours:#?}");
    let ours: Vec<String> = ours
        .iter()
        .map(|l| l.replace("__MAX_BODY_BYTES__", "4194304"))
        .collect();
    assert_eq!(
        ours, theirs,
        "keep envoy/gateway/gateway.yaml's local_reply_config in step with the template"
    );
}
