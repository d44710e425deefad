//! The fake vLLM server and the load client, over real HTTP on 127.0.0.1 with ports chosen at
//! run time. Bounded: every request has a timeout; the engine runs 50–200× faster than real time.
//! The fault modes (`--fault-*`, `/fault`) and the body limit are tested here too; the
//! histograms of `/metrics` in serve/metrics.rs; data-parallel servers in serve/data_parallel.rs
//! and KV-cache events in serve/kv_events.rs (one test binary: they share the server's build).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use kvroute_sim::engine::EngineConfig;
use kvroute_sim::replay::{self, ReplayConfig};
use kvroute_sim::serve::{BoundServer, FaultSpec, ServeConfig, DEFAULT_MAX_BODY_BYTES};
use kvroute_sim::workload::{ArrivalProcess, Scenario};
use serde_json::Value;

// `/metrics`' histograms (their tests).
mod metrics;
// `--data-parallel-size`: several engines behind one port.
mod data_parallel;
// `--kv-events-*`: KV-cache events over ZMQ.
mod kv_events;
// The HTTP client and the child-process helpers the serve tests share.
#[path = "../support/serve.rs"]
mod support;
use support::{client, get, post, send, serve_in_background, stop, HttpClient};

async fn start(name: &str, speedup: f64) -> (String, tokio::sync::oneshot::Sender<()>) {
    start_with(name, speedup, FaultSpec::default()).await
}

async fn start_with(
    name: &str,
    speedup: f64,
    fault: FaultSpec,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    start_config(config(name, speedup, fault)).await
}

fn config(name: &str, speedup: f64, fault: FaultSpec) -> ServeConfig {
    ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        name: name.into(),
        model: "study".into(),
        speedup,
        engine: EngineConfig::default(),
        fault,
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        prompts: Default::default(),
        ..ServeConfig::default()
    }
}

async fn start_config(cfg: ServeConfig) -> (String, tokio::sync::oneshot::Sender<()>) {
    serve_in_background(BoundServer::bind(cfg).await.expect("bind"))
}

fn sse_payloads(body: &str) -> Vec<&str> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_usage_cached_tokens_and_names_the_replica() {
    let (url, _stop) = start("vllm-x", 100.0).await;
    let c = client();
    let prompt = "The service tracks request latency. ".repeat(1000);
    let body = serde_json::json!({
        "model": "study", "prompt": prompt, "max_tokens": 5, "stream": true,
        "stream_options": {"include_usage": true}, "ignore_eos": true,
    })
    .to_string();
    let (status, headers, first) = post(&c, &url, "/v1/completions", &[], &body).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(headers["x-kvroute-sim-replica"], "vllm-x");
    assert_eq!(headers["content-type"], "text/event-stream");
    let events = sse_payloads(&first);
    assert_eq!(events.last(), Some(&"[DONE]"));
    let texts: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(
        texts
            .iter()
            .filter(|v| v["choices"].as_array().is_some_and(|c| !c.is_empty()))
            .count(),
        5
    );
    let usage = &texts.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 5);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 3 * 1568, "{prompt_tokens}");

    // The same prompt again reuses whole 1,568-token blocks.
    let (_, _, second) = post(&c, &url, "/v1/completions", &[], &body).await;
    let events = sse_payloads(&second);
    let usage: Value = serde_json::from_str(events[events.len() - 2]).unwrap();
    assert_eq!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"],
        3 * 1568
    );

    let (status, metrics) = get(&c, &url, "/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ] {
        assert!(
            metrics.contains(&format!("{name}{{model_name=\"study\"}}")),
            "{name} missing:\n{metrics}"
        );
    }
    assert!(metrics.contains(&format!(
        "vllm:prefix_cache_hits_total{{model_name=\"study\"}} {}",
        3 * 1568
    )));
    let (status, _, reset) = post(&c, &url, "/reset_prefix_cache", &[], "").await;
    assert_eq!((status, reset.as_str()), (200, "{\"reset\":true}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_chat_models_health_and_errors() {
    let (url, _stop) = start("vllm-y", 200.0).await;
    let c = client();
    let (status, _, body) = post(
        &c,
        &url,
        "/v1/chat/completions",
        &[],
        r#"{"model":"study","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));

    let (status, models) = get(&c, &url, "/v1/models").await;
    assert_eq!(status, 200);
    assert!(models.contains("\"id\":\"study\""));
    assert_eq!(get(&c, &url, "/health").await.0, 200);

    let (status, headers, body) = post(&c, &url, "/v1/completions", &[], "{not json").await;
    assert_eq!(status, 400);
    assert_eq!(headers["x-kvroute-sim-replica"], "vllm-y");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("JSON"));

    let (status, _, body) = post(
        &c,
        &url,
        "/v1/completions",
        &[],
        r#"{"model":"other","prompt":"x"}"#,
    )
    .await;
    assert_eq!(status, 404, "{body}");

    let (status, headers, body) = post(
        &c,
        &url,
        "/v1/completions",
        &[("x-sim-status", "503")],
        r#"{"model":"study","prompt":"x"}"#,
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(headers["x-kvroute-sim-replica"], "vllm-y");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["code"],
        503
    );
    let (status, _, _) = post(
        &c,
        &url,
        "/v1/completions",
        &[("x-sim-status", "banana")],
        "{}",
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_200_concurrent_streams() {
    let (url, _stop) = start("vllm-z", 200.0).await;
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let body = serde_json::json!({
                "model": "study", "prompt": format!("request {i} asks about caches"), "max_tokens": 4,
                "stream": true, "stream_options": {"include_usage": true},
            })
            .to_string();
            let (status, _, text) = post(&c, &url, "/v1/completions", &[], &body).await;
            status == 200 && text.ends_with("data: [DONE]\n\n") && text.contains("\"completion_tokens\":4")
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap());
    }
    assert_eq!(ok, 200);
    let (_, metrics) = get(&c, &url, "/metrics").await;
    assert!(
        metrics.contains("vllm:request_success_total{model_name=\"study\"} 200"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_measures_a_live_server() {
    let (url, _stop) = start("solo", 100.0).await;
    let records =
        std::env::temp_dir().join(format!("kvroute-sim-replay-{}.jsonl", std::process::id()));
    let cfg = ReplayConfig {
        url: url.clone(),
        scenario: Scenario::Hot50,
        strategies: vec!["least-request".into()],
        requests: 12,
        rate: 1.6,
        speedup: 100.0,
        seed: 102,
        max_tokens: 16,
        records: Some(records.clone()),
        timeout_s: Some(20.0),
        direct: vec![url.clone()],
        model: "study".into(),
        arrivals: ArrivalProcess::Uniform,
    };
    let phases = replay::run(&cfg).await.expect("replay runs");
    assert_eq!(phases.len(), 1);
    let p = &phases[0];
    assert_eq!(p.records.len(), 12);
    assert!(
        p.records.iter().all(|r| r.success),
        "{:?}",
        p.records.iter().find(|r| !r.success)
    );
    assert!(p.records.iter().all(|r| r.pod.as_deref() == Some("solo")));
    assert_eq!(p.summary.split, vec![("solo".to_owned(), 12)]);
    // Primed: every family's prefix is on the one server, so every request hits.
    assert!(
        p.summary.token_hit.is_some_and(|h| h > 0.9),
        "{:?}",
        p.summary.token_hit
    );
    assert!(
        p.notes.iter().any(|n| n.contains("primed")),
        "{:?}",
        p.notes
    );
    let lines = std::fs::read_to_string(&records).unwrap();
    assert_eq!(lines.lines().count(), 12);
    let _ = std::fs::remove_file(&records);

    // A dead endpoint: every request fails, none hangs.
    let dead = ReplayConfig {
        url: "http://127.0.0.1:9".into(),
        direct: vec![],
        requests: 3,
        scenario: Scenario::Cold,
        ..cfg
    };
    let phases = replay::run(&dead).await.expect("replay runs");
    assert_eq!(phases[0].summary.succeeded, 0);
    assert!(replay::run(&ReplayConfig {
        url: "ftp://x".into(),
        ..dead.clone()
    })
    .await
    .is_err());
}

/// Starts the binary with `kvroute-sim serve --host 127.0.0.1 --port 0 ARGS...` and reads its
/// address from the first line.
fn spawn_serve(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kvroute-sim serve");
    let addr = support::listening_addr(&mut child);
    (child, addr)
}

#[test]
fn the_binary_prints_its_port_and_stops_on_sigterm() {
    let (child, addr) = spawn_serve(&["--name", "bin-a", "--speedup", "10"]);
    // It answers.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (status, _) =
        rt.block_on(async { get(&client(), &format!("http://{addr}"), "/health").await });
    assert_eq!(status, 200);
    stop(child);
}

/// A SIGTERM sent as soon as the first line is read is a clean exit, every time: the handlers
/// are installed before `listening on` is printed. Before, 17 of 300 starts driven from a shell
/// were killed by the signal instead; with the handlers installed late again, this test failed
/// in 4 of 4 runs.
#[test]
fn a_sigterm_right_after_the_first_line_is_a_clean_exit() {
    for _ in 0..300 {
        let (child, _) = spawn_serve(&["--name", "bin-a"]);
        stop(child);
    }
}

const SMALL: &str = r#"{"model":"study","prompt":"a short prompt","max_tokens":2}"#;
const CHAT: &str =
    r#"{"model":"study","messages":[{"role":"user","content":"hello"}],"max_tokens":2}"#;

/// The value of a `/metrics` sample (the whole line up to the value must match `series`).
fn sample(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in\n{metrics}"))
}

/// (faults by kind status/stall/close, requests the engine accepted).
async fn counts(c: &HttpClient, url: &str) -> ([u64; 3], u64) {
    let (status, m) = get(c, url, "/metrics").await;
    assert_eq!(status, 200, "{m}");
    let f = |k: &str| sample(&m, &format!("kvroute_sim_faults_total{{kind=\"{k}\"}}"));
    (
        [f("status"), f("stall"), f("close")],
        sample(
            &m,
            "kvroute_sim:requests_received_total{model_name=\"study\"}",
        ),
    )
}

async fn set_fault(c: &HttpClient, url: &str, spec: &str) -> String {
    let (status, headers, body) = post(c, url, "/fault", &[], spec).await;
    assert_eq!(status, 200, "POST /fault {spec}: {body}");
    assert!(headers.contains_key("x-kvroute-sim-replica"));
    body
}

/// The statuses of `n` small completions sent one after another.
async fn statuses(c: &HttpClient, url: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(post(c, url, "/v1/completions", &[], SMALL).await.0);
    }
    out
}

fn assert_openai_error(body: &str, code: u16) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let e = &v["error"];
    assert_eq!(e["code"], code, "{body}");
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(e["type"].is_string(), "{body}");
    assert!(e.get("param").is_some(), "{body}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_faults_switch_at_run_time_and_never_reach_the_engine() {
    let (url, _stop) = start("flt-a", 200.0).await;
    let c = client();
    assert_eq!(get(&c, &url, "/fault").await, (200, "{}".to_owned()));
    assert_eq!(statuses(&c, &url, 1).await, [200]);

    // Every inference request fails, the other endpoints do not.
    let spec = set_fault(&c, &url, r#"{"status":503,"rate":1.0}"#).await;
    assert_eq!(spec, r#"{"status":503}"#);
    assert_eq!(get(&c, &url, "/fault").await, (200, spec));
    let (status, headers, body) = post(&c, &url, "/v1/completions", &[], SMALL).await;
    assert_eq!(status, 503);
    assert_eq!(headers["x-kvroute-sim-replica"], "flt-a");
    assert_openai_error(&body, 503);
    let (status, headers, body) = post(&c, &url, "/v1/chat/completions", &[], CHAT).await;
    assert_eq!(
        (status, headers["x-kvroute-sim-replica"].to_str().unwrap()),
        (503, "flt-a")
    );
    assert_openai_error(&body, 503);
    assert_eq!(get(&c, &url, "/v1/models").await.0, 503);
    assert_eq!(get(&c, &url, "/health").await.0, 200);
    // No engine work: still the one request from before, nothing cached by the failures.
    let (faults, accepted) = counts(&c, &url).await;
    assert_eq!((faults, accepted), ([3, 0, 0], 1));
    let (_, m) = get(&c, &url, "/metrics").await;
    let queried = sample(&m, "vllm:prefix_cache_queries_total{model_name=\"study\"}");

    // Cleared with DELETE: served again.
    let (status, _, _, body) = send(&c, "DELETE", &url, "/fault", &[], Bytes::new()).await;
    assert_eq!((status, body.as_str()), (200, "{}"));
    assert_eq!(statuses(&c, &url, 2).await, [200, 200]);

    // Half of them, counter-based: the 2nd, 4th, ...; then cleared with `{}`.
    let spec = set_fault(&c, &url, r#"{"rate":0.5,"status":502}"#).await;
    assert_eq!(spec, r#"{"status":502,"rate":0.5}"#);
    assert_eq!(statuses(&c, &url, 4).await, [200, 502, 200, 502]);
    assert_eq!(set_fault(&c, &url, "{}").await, "{}");
    assert_eq!(statuses(&c, &url, 2).await, [200, 200]);
    let (faults, accepted) = counts(&c, &url).await;
    assert_eq!((faults, accepted), ([5, 0, 0], 7));
    let (_, m) = get(&c, &url, "/metrics").await;
    assert!(sample(&m, "vllm:prefix_cache_queries_total{model_name=\"study\"}") > queried);

    // The request header still works, and is counted.
    let (status, headers, body) = post(
        &c,
        &url,
        "/v1/completions",
        &[("x-sim-status", "429")],
        SMALL,
    )
    .await;
    assert_eq!(
        (status, headers["x-kvroute-sim-replica"].to_str().unwrap()),
        (429, "flt-a")
    );
    assert_openai_error(&body, 429);
    assert_eq!(counts(&c, &url).await, ([6, 0, 0], 7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_after_n_requests_and_health_flag() {
    let (url, _stop) = start("flt-b", 200.0).await;
    let c = client();
    // The first two succeed, every later one fails.
    let spec = set_fault(&c, &url, r#"{"after":2,"status":503}"#).await;
    assert_eq!(spec, r#"{"status":503,"after":2}"#);
    assert_eq!(statuses(&c, &url, 5).await, [200, 200, 503, 503, 503]);
    assert_eq!(get(&c, &url, "/health").await.0, 200);
    // Setting a spec restarts its count.
    set_fault(&c, &url, r#"{"after":2,"status":503}"#).await;
    assert_eq!(statuses(&c, &url, 3).await, [200, 200, 503]);

    // With `health`, /health and /metrics fail too once `after` requests have passed.
    let spec = set_fault(&c, &url, r#"{"after":1,"status":500,"health":true}"#).await;
    assert_eq!(spec, r#"{"status":500,"after":1,"health":true}"#);
    assert_eq!(get(&c, &url, "/health").await.0, 200);
    assert_eq!(statuses(&c, &url, 1).await, [200]);
    for path in ["/health", "/metrics"] {
        let (status, headers, _, body) = send(&c, "GET", &url, path, &[], Bytes::new()).await;
        assert_eq!(status, 500, "{path}");
        assert_eq!(headers["x-kvroute-sim-replica"], "flt-b");
        assert_openai_error(&body, 500);
    }
    assert_eq!(statuses(&c, &url, 1).await, [500]);
    // /fault and /reset_prefix_cache are never faulted.
    assert_eq!(get(&c, &url, "/fault").await.0, 200);
    assert_eq!(post(&c, &url, "/reset_prefix_cache", &[], "").await.0, 200);
    // Clearing restores 200 everywhere.
    set_fault(&c, &url, "{}").await;
    assert_eq!(get(&c, &url, "/health").await.0, 200);
    assert_eq!(statuses(&c, &url, 1).await, [200]);
    // 3 + 1 + 1 inference failures, /health and /metrics.
    assert_eq!(counts(&c, &url).await, ([7, 0, 0], 6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_delays_the_response_headers() {
    let (url, _stop) = start("flt-c", 200.0).await;
    let c = client();
    let stall = Duration::from_millis(400);
    assert_eq!(
        set_fault(&c, &url, r#"{"stall_ms":400}"#).await,
        r#"{"stall_ms":400}"#
    );
    // Streaming: the headers (and so the first token) come at least 400 ms late, then the
    // request is served normally.
    let body = r#"{"model":"study","prompt":"stalled","max_tokens":3,"stream":true}"#;
    let (status, headers, to_headers, text) =
        send(&c, "POST", &url, "/v1/completions", &[], body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(headers["x-kvroute-sim-replica"], "flt-c");
    assert!(to_headers >= stall, "headers after {to_headers:?}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let (status, _, to_headers, _) =
        send(&c, "POST", &url, "/v1/chat/completions", &[], CHAT).await;
    assert_eq!(status, 200);
    assert!(to_headers >= stall, "headers after {to_headers:?}");
    // A stall that ends in a status.
    set_fault(&c, &url, r#"{"stall_ms":300,"status":504}"#).await;
    let (status, _, to_headers, body) = send(&c, "POST", &url, "/v1/completions", &[], SMALL).await;
    assert_eq!(status, 504);
    assert_openai_error(&body, 504);
    assert!(to_headers >= Duration::from_millis(300), "{to_headers:?}");
    set_fault(&c, &url, "{}").await;
    // Stalled requests reach the engine, the failed one does not.
    assert_eq!(counts(&c, &url).await, ([1, 3, 0], 2));
}

/// Sends `request` on a new connection and reads until the server closes it: the bytes read,
/// or an error (a reset).
async fn raw_exchange(addr: &str, request: &[u8]) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(request).await?;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("the server closes the connection within 10 s")?;
    Ok(got)
}

/// One whole request; `connection: close` so that a served one ends with the connection.
fn raw_post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: sim\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_drops_the_connection_without_a_response() {
    let (url, _stop) = start("flt-d", 200.0).await;
    let addr = url.strip_prefix("http://").unwrap();
    let c = client();
    // Unfaulted, the same raw exchange gets a response (so the check below can fail).
    let ok = raw_exchange(addr, &raw_post("/v1/completions", SMALL))
        .await
        .expect("a response");
    assert!(
        ok.starts_with(b"HTTP/1.1 200 OK\r\n"),
        "{}",
        String::from_utf8_lossy(&ok)
    );

    assert_eq!(
        set_fault(&c, &url, r#"{"close":true}"#).await,
        r#"{"close":true}"#
    );
    for (path, body) in [("/v1/completions", SMALL), ("/v1/chat/completions", CHAT)] {
        match raw_exchange(addr, &raw_post(path, body)).await {
            Ok(bytes) => assert!(
                bytes.is_empty(),
                "{path}: got {:?}",
                String::from_utf8_lossy(&bytes)
            ),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{path}: {e}"),
        }
    }
    // An HTTP client sees the connection end before any response.
    let req = hyper::Request::post(format!("{url}/v1/completions"))
        .body(Full::new(Bytes::from(SMALL)))
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("timely")
        .expect_err("no response");
    assert!(format!("{err:?}").contains("IncompleteMessage"), "{err:?}");
    // /health is untouched (no `health`), and the server serves again once cleared.
    assert_eq!(get(&c, &url, "/health").await.0, 200);
    set_fault(&c, &url, "{}").await;
    assert_eq!(statuses(&c, &url, 1).await, [200]);
    assert_eq!(counts(&c, &url).await, ([0, 0, 3], 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_fault_specs_are_400_and_change_nothing() {
    let (url, _stop) = start("flt-e", 200.0).await;
    let c = client();
    set_fault(&c, &url, r#"{"after":1,"status":502}"#).await;
    for spec in [
        r#"{"status":200}"#,
        r#"{"status":600}"#,
        r#"{"status":"500"}"#,
        r#"{"rate":1.5}"#,
        r#"{"rate":-0.5}"#,
        r#"{"after":-1}"#,
        r#"{"stall_ms":3600001}"#,
        r#"{"close":true,"status":500}"#,
        r#"{"stall":100}"#,
        r#"{"close":true"#,
        "",
    ] {
        let (status, headers, body) = post(&c, &url, "/fault", &[], spec).await;
        assert_eq!(status, 400, "{spec}: {body}");
        assert_eq!(headers["x-kvroute-sim-replica"], "flt-e");
        let v = assert_openai_error(&body, 400);
        assert_eq!(v["error"]["type"], "BadRequestError");
    }
    assert_eq!(
        get(&c, &url, "/fault").await,
        (200, r#"{"status":502,"after":1}"#.to_owned())
    );
    assert_eq!(statuses(&c, &url, 2).await, [200, 502]);
}

#[test]
fn the_binary_takes_fault_and_body_limit_flags() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = client();
    let (child, addr) = spawn_serve(&[
        "--name",
        "bin-f",
        "--speedup",
        "50",
        "--fault-status",
        "502",
        "--fault-after",
        "1",
        "--fault-health",
        "--max-body-bytes",
        "4096",
    ]);
    let url = format!("http://{addr}");
    rt.block_on(async {
        assert_eq!(
            get(&c, &url, "/fault").await,
            (200, r#"{"status":502,"after":1,"health":true}"#.to_owned())
        );
        assert_eq!(get(&c, &url, "/health").await.0, 200);
        assert_eq!(statuses(&c, &url, 2).await, [200, 502]);
        assert_eq!(get(&c, &url, "/health").await.0, 502);
        // The run-time switch works on the process too.
        set_fault(&c, &url, r#"{"close":true}"#).await;
        let bytes = raw_exchange(&addr, &raw_post("/v1/completions", SMALL))
            .await
            .unwrap_or_default();
        assert!(bytes.is_empty(), "{}", String::from_utf8_lossy(&bytes));
        let (status, _, _, body) = send(&c, "DELETE", &url, "/fault", &[], Bytes::new()).await;
        assert_eq!((status, body.as_str()), (200, "{}"));
        // --max-body-bytes 4096.
        let prompt = "x".repeat(3000);
        let fits = format!(r#"{{"model":"study","prompt":"{prompt}","max_tokens":1}}"#);
        assert_eq!(post(&c, &url, "/v1/completions", &[], &fits).await.0, 200);
        let prompt = "x".repeat(5000);
        let over = format!(r#"{{"model":"study","prompt":"{prompt}","max_tokens":1}}"#);
        let (status, _, body) = post(&c, &url, "/v1/completions", &[], &over).await;
        assert_eq!(status, 413, "{body}");
        assert_openai_error(&body, 413);
        assert_eq!(counts(&c, &url).await, ([2, 0, 1], 2));
    });
    stop(child);
    for (flags, why) in [
        (&["--fault-rate", "1.5"][..], "rate"),
        (&["--fault-close", "--fault-status", "500"][..], "close"),
        (&["--fault-status", "200"][..], "200"),
        (&["--max-body-bytes", "0"][..], "0"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
            .args(["serve", "--port", "0", "--name", "bad"])
            .args(flags)
            .output()
            .expect("run kvroute-sim serve");
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{flags:?}: {err}");
        assert!(out.stdout.is_empty(), "{flags:?} must not start serving");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_bodies_up_to_8_mib_and_refuses_larger_with_413() {
    let (url, _stop) = start("big", 200.0).await;
    let c = client();
    // A 5 MiB chat request (an inline image, which the fake model ignores, and a text part).
    let image = "A".repeat(5 << 20);
    let body = serde_json::json!({
        "model": "study", "max_tokens": 2,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{image}")}},
            {"type": "text", "text": "What is in the picture?"},
        ]}],
    })
    .to_string();
    assert!(body.len() > 5 << 20);
    let (status, _, text) = post(&c, &url, "/v1/chat/completions", &[], &body).await;
    assert_eq!(status, 200, "{}", &text[..text.len().min(300)]);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["usage"]["completion_tokens"],
        2
    );
    // Over 8 MiB: an OpenAI-style 413 that the client reads (not a reset), twice on one
    // server, the second time while a fault is set (the faulted request is read first).
    let over = format!(
        r#"{{"model":"study","prompt":"x","max_tokens":1,"pad":"{}"}}"#,
        "p".repeat(DEFAULT_MAX_BODY_BYTES)
    );
    for fault in ["{}", r#"{"status":500}"#] {
        set_fault(&c, &url, fault).await;
        let (status, headers, text) = post(&c, &url, "/v1/completions", &[], &over).await;
        assert_eq!(status, 413, "{fault}: {text}");
        assert_eq!(headers["x-kvroute-sim-replica"], "big");
        assert_openai_error(&text, 413);
    }
}
