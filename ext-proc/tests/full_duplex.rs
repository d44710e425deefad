//! kvroute as a Gateway API Inference Extension gateway calls its endpoint picker: request
//! and response bodies `FULL_DUPLEX_STREAMED`, request and response trailers SEND (Istio's
//! per-route override for an InferencePool, `pilot/pkg/networking/core/route/route.go`, and
//! Envoy AI Gateway's default `duplex`), fail closed (`failure_mode_allow: false`, Istio's
//! default for a pool). Through a real Envoy 1.40, the real `kvroute-ext-proc` and two
//! `kvroute-sim serve` replicas: the shipped config rendered as usual, with only those
//! settings of its ext_proc filter changed.
//!
//! Like tests/e2e.rs they need Envoy: `#[ignore]`d in the plain `cargo test --workspace`,
//! run by `make test-e2e` (`cargo test -p kvroute-ext-proc --test full_duplex -- --ignored`).

mod support;

use std::path::Path;
use std::time::Duration;

use support::*;

/// The shipped config for `kv_config`, its ext_proc filter switched to Istio's picker
/// settings (each setting replaced exactly once; Istio sends the request headers, which
/// full duplex needs), and without the buffer filter the shipped config enables on the
/// routed paths to hold the request while it skips the request headers (Istio has none).
fn full_duplex_yaml(kv_config: &Path, ext_grpc: &str) -> Vec<u8> {
    let mut text = String::from_utf8(render_envoy_config(kv_config, ext_grpc, true)).unwrap();
    // Route kvroute_fallback's typed_per_filter_config (the buffer filter, nothing else).
    let start = text
        .find("                typed_per_filter_config:\n                  # With the request-headers phase skipped")
        .expect("the shipped config changed shape: kvroute_fallback's buffer filter");
    let limit = start + text[start..].find("max_request_bytes").unwrap();
    let end = limit + text[limit..].find('\n').unwrap() + 1;
    assert!(
        !text[start..end].contains("- name:"),
        "{}",
        &text[start..end]
    );
    text.replace_range(start..end, "");
    let settings = [
        ("request_header_mode:", "SEND"),
        ("request_body_mode:", "FULL_DUPLEX_STREAMED"),
        ("response_body_mode:", "FULL_DUPLEX_STREAMED"),
        ("request_trailer_mode:", "SEND"),
        ("response_trailer_mode:", "SEND"),
        ("failure_mode_allow:", "false"),
    ];
    let mut replaced = [0; 6];
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        match settings.iter().position(|(k, _)| trimmed.starts_with(k)) {
            Some(i) => {
                replaced[i] += 1;
                out.push_str(&format!("{indent}{} {}", settings[i].0, settings[i].1));
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    assert_eq!(replaced, [1; 6], "the shipped config changed shape");
    out.into_bytes()
}

/// Two replicas, kvroute and an Envoy calling kvroute in full duplex.
fn duplex_stack(tag: &str, extra_config: &str) -> Stack {
    let dir = TempDir::new(tag);
    let sims = vec![
        Sim::start(&dir, "replica-a", 5.0),
        Sim::start(&dir, "replica-b", 5.0),
    ];
    let config = dir.path("kvroute.toml");
    write_config(&config, &sims.iter().collect::<Vec<_>>(), extra_config);
    let ext = ExtProc::start(&dir, &config, None);
    let envoy = Envoy::start_yaml(&dir, &full_duplex_yaml(&config, &ext.grpc));
    Stack {
        envoy,
        ext,
        sims,
        config,
        dir,
    }
}

fn replica(r: &Resp) -> String {
    r.header("x-kvroute-sim-replica")
        .unwrap_or_else(|| panic!("no replica header: {r:?}"))
        .to_owned()
}

/// Asserts that kvroute routed `r` (its decision header names the pod that answered).
fn assert_routed(r: &Resp) {
    assert_eq!(r.status, 200, "{}", r.text());
    let why = r
        .header("x-kvroute-decision")
        .unwrap_or_else(|| panic!("not routed by kvroute: {r:?}"));
    assert!(why.contains(&format!("pod={}", replica(r))), "{why}");
    assert_eq!(r.header("target-pod"), Some(replica(r).as_str()));
}

/// The `usage.prompt_tokens` of a non-streaming answer, or of a stream's usage event.
fn prompt_tokens(r: &Resp) -> u64 {
    let text = r.text();
    if !text.starts_with("data:") {
        return r.json()["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no usage: {text}"));
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find_map(|e| e["usage"]["prompt_tokens"].as_u64())
        .unwrap_or_else(|| panic!("no usage event: {text}"))
}

/// A chat body asking for the usage event when streamed.
fn chat_with_usage(content: &str, max_tokens: u32, stream: bool) -> Vec<u8> {
    serde_json::json!({ "model": "study", "messages": [{ "role": "user", "content": content }],
        "max_tokens": max_tokens, "stream": stream, "stream_options": { "include_usage": true } })
    .to_string()
    .into_bytes()
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn full_duplex_requests_are_routed_and_reach_the_pod_intact() {
    let s = duplex_stack("duplex-route", "");
    let direct = |r: &Resp, path: &str, body: &[u8]| {
        // The same body sent to the same replica directly: its prompt-token count.
        let sim = s.sims.iter().find(|x| x.name == replica(r)).unwrap();
        prompt_tokens(&http(&sim.addr, "POST", path, &[], body))
    };
    let mut sent = 0;
    for (i, stream) in [false, true].into_iter().enumerate() {
        for (path, body) in [
            (
                "/v1/completions",
                completion("study", &prompt("dx-comp", i as u32, 3_000), 4, stream),
            ),
            (
                "/v1/chat/completions",
                chat_with_usage(&prompt("dx-chat", i as u32, 3_000), 4, stream),
            ),
        ] {
            let r = s.post(path, &[("x-request-id", "rid-dx")], &body);
            sent += 1;
            assert_routed(&r);
            assert_eq!(r.header("request-id"), Some("rid-dx"));
            assert_eq!(
                prompt_tokens(&r),
                direct(&r, path, &body),
                "{path} stream={stream}"
            );
            if stream {
                assert!(r.text().ends_with("data: [DONE]\n\n"), "{}", r.text());
            }
        }
    }

    // A body of about 300 KB: five 64 KiB pieces each way through kvroute, intact (letters
    // without spaces: the replica's tokenizer makes 12 of them one token, so that the prompt
    // fits its context).
    let letters = format!("dx-big {}", "abcdefghijkl".repeat(25_000));
    let big = completion("study", &letters, 4, false);
    assert!(big.len() > 4 * 65_536, "{}", big.len());
    let r = s.post("/v1/completions", &[], &big);
    sent += 1;
    assert_routed(&r);
    assert_eq!(prompt_tokens(&r), direct(&r, "/v1/completions", &big));

    // HTTP/2 with request trailers: the trailers end the request; routed all the same.
    let h2_body = completion("study", &prompt("dx-h2", 1, 2_000), 2, false);
    let h2 = h2_post(
        &s.envoy.listen,
        "/v1/completions",
        &[],
        &h2_body,
        &[("x-checksum", "abc")],
    );
    sent += 1;
    assert_routed(&h2);
    assert_eq!(prompt_tokens(&h2), direct(&h2, "/v1/completions", &h2_body));

    // A GET has no body: routed on its headers.
    let models = http(&s.envoy.listen, "GET", "/v1/models", &[], b"");
    sent += 1;
    assert_routed(&models);

    s.expect_in_flight(0);
    let m = s.ext.metrics();
    assert_eq!(
        metric_sum(&m, "kvroute_tickets_completed_total"),
        sent,
        "{m}"
    );
    assert_eq!(metric_sum(&m, "kvroute_ticket_release_errors_total"), 0);
    assert_eq!(
        metric_sum(&m, "kvroute_ext_proc_stream_ends_total{how=\"closed\"}"),
        sent,
        "{m}"
    );
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn full_duplex_keeps_prefix_affinity_and_kvroutes_errors() {
    let s = duplex_stack("duplex-affinity", "");
    for family in ["dx-fam-a", "dx-fam-b"] {
        let pods: Vec<String> = (0..4)
            .map(|q| {
                let body = completion("study", &prompt(family, q, 20_000), 2, false);
                let r = s.post("/v1/completions", &[], &body);
                assert_routed(&r);
                replica(&r)
            })
            .collect();
        assert!(pods.iter().all(|p| *p == pods[0]), "{family}: {pods:?}");
    }
    let m = s.ext.metrics();
    assert!(
        metric_sum(
            &m,
            "aibrix_prefix_cache_routing_selection_total{model=\"study\",selection=\"prefix_match\""
        ) >= 6,
        "{m}"
    );

    // kvroute's own answers, exactly as it sends them.
    let r = s.post(
        "/v1/completions",
        &[],
        &completion("nope", "hello", 2, false),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("x-error-no-model-backends"), Some("nope"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let r = s.post("/v1/completions", &[], b"{not json");
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("x-error-request-body-processing"), Some("true"));
    let r = s.post(
        "/v1/completions",
        &[("routing-strategy", "bogus")],
        &completion("study", "hello", 2, false),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("x-error-routing"), Some("true"));
    s.expect_in_flight(0);
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn full_duplex_streams_responses_intact_and_releases_after_aborts() {
    let s = duplex_stack("duplex-stream", "");
    let body = completion("study", &prompt("dx-sse", 1, 4_000), 64, true);
    let r = s.post("/v1/completions", &[], &body);
    assert_routed(&r);
    let text = r.text();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("{e:?}")))
        .collect();
    // 64 token events, the usage event, [DONE]; every event whole JSON.
    assert_eq!(events.len(), 66, "{text}");
    assert_eq!(events[65], "[DONE]");
    for e in &events[..65] {
        let _: serde_json::Value =
            serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}"));
    }
    assert_eq!(prompt_tokens(&r), {
        let sim = s.sims.iter().find(|x| x.name == replica(&r)).unwrap();
        prompt_tokens(&http(&sim.addr, "POST", "/v1/completions", &[], &body))
    });
    s.expect_in_flight(0);
    // The stream was timed (its body passes through kvroute in this mode).
    let m = s.ext.metrics();
    assert_eq!(metric_sum(&m, "kvroute_timed_responses_total"), 1, "{m}");

    // Client aborts mid-stream.
    for i in 0..4 {
        let body = completion("study", &prompt("dx-abort", i, 4_000), 400, true);
        let got = abort_after(&s.envoy.listen, "/v1/completions", &[], &body, "data:");
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    }
    s.expect_in_flight(0);
    let m = s.ext.metrics();
    assert_eq!(metric_sum(&m, "kvroute_ticket_release_errors_total"), 0);
    assert_eq!(metric_sum(&m, "kvroute_tickets_completed_total"), 5, "{m}");
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn full_duplex_bodies_reach_the_pod_byte_for_byte() {
    let dir = TempDir::new("duplex-capture");
    let (addr, seen) = capture_pod();
    let config = dir.path("kvroute.toml");
    write_capture_config(&config, &addr);
    let ext = ExtProc::start(&dir, &config, None);
    let envoy = Envoy::start_yaml(&dir, &full_duplex_yaml(&config, &ext.grpc));
    let bodies = [
        completion("study", "hi", 2, false),
        completion("study", &prompt("dx-bytes", 1, 65_536 - 100), 2, false),
        completion("study", &prompt("dx-bytes", 2, 300_000), 2, false),
    ];
    for body in &bodies {
        let r = http(&envoy.listen, "POST", "/v1/completions", &[], body);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("target-pod"), Some("capture"));
        let got = seen.lock().unwrap().pop().expect("the pod got the request");
        assert_eq!(got.body.len(), body.len());
        assert!(got.body == *body, "the body changed on the way");
        // Envoy drops content-length in this mode (allow_content_length_header unset) and
        // sends the body chunked.
        assert!(
            got.head.iter().any(|h| h == "transfer-encoding: chunked"),
            "{:?}",
            got.head
        );
        assert!(
            !got.head.iter().any(|h| h.starts_with("content-length:")),
            "{:?}",
            got.head
        );
        // The client may not steer: the destination header is kvroute's.
        assert!(got
            .head
            .iter()
            .any(|h| *h == format!("x-gateway-destination-endpoint: {addr}")));
    }
    wait_for(Duration::from_secs(5), || {
        (ext.in_flight() == 0).then_some(())
    })
    .expect("in-flight back to 0");
}
