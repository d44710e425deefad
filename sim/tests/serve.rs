//! The fake vLLM server and the load client, over real HTTP on 127.0.0.1 with ports chosen at
//! run time. Bounded: every request has a timeout; the engine runs 50–200× faster than real time.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kvroute_sim::engine::EngineConfig;
use kvroute_sim::replay::{self, ReplayConfig};
use kvroute_sim::serve::{BoundServer, ServeConfig};
use kvroute_sim::workload::{ArrivalProcess, Scenario};
use serde_json::Value;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn start(name: &str, speedup: f64) -> (String, tokio::sync::oneshot::Sender<()>) {
    let cfg = ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        name: name.into(),
        model: "study".into(),
        speedup,
        engine: EngineConfig::default(),
    };
    let server = BoundServer::bind(cfg).await.expect("bind");
    let url = format!("http://{}", server.local_addr());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.serve(async move {
        let _ = rx.await;
    }));
    (url, tx)
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn post(
    c: &HttpClient,
    url: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, hyper::HeaderMap, String) {
    let mut b =
        hyper::Request::post(format!("{url}{path}")).header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), c.request(req))
        .await
        .expect("timely")
        .expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect())
        .await
        .expect("timely")
        .expect("body");
    (
        status,
        headers,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    )
}

async fn get(c: &HttpClient, url: &str, path: &str) -> (u16, String) {
    let req = hyper::Request::get(format!("{url}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("timely")
        .expect("response");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
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

#[test]
fn the_binary_prints_its_port_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--name",
            "bin-a",
            "--speedup",
            "10",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kvroute-sim serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line was {line:?}"))
        .to_owned();
    assert!(
        addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
        "{addr}"
    );
    // It answers.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (status, _) =
        rt.block_on(async { get(&client(), &format!("http://{addr}"), "/health").await });
    assert_eq!(status, 200);
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "exit status {st:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
