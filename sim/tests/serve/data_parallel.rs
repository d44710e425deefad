//! `kvroute-sim serve --data-parallel-size N`: N engines ("ranks") behind one port, as a vLLM
//! with data parallelism behind one API server. Real HTTP and ZMQ on 127.0.0.1 with ports
//! chosen at run time. Bounded: every test runs under a time limit, the engines 10–100× faster
//! than real time; waits poll against deadlines and never stand in for an assertion.

use std::process::{Child, Command, Stdio};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use kvroute_kv_events::wire::{decode, EventBatch, KvEvent};
use kvroute_kv_events::{replay, Subscriber};
use kvroute_sim::engine::EngineConfig;
use kvroute_sim::serve::{BoundServer, KvEventsConfig, ServeConfig, RANK_HEADER, REPLICA_HEADER};
use serde_json::{json, Value};

use crate::support::{client, get, lines, open, post, request, serve_in_background, HttpClient};

/// Every test's time limit.
const LIMIT: Duration = Duration::from_secs(60);
/// How long a batch or a line that must come may take.
const WAIT: Duration = Duration::from_secs(10);
const BLOCK: u32 = 16;
/// Output tokens of a request that must still be running when the test looks (about 5 s at
/// 10×; the tests drop it long before).
const LONG: u32 = 1500;

/// 16-token blocks, room for a long request on every rank.
fn engine() -> EngineConfig {
    EngineConfig {
        block_size: BLOCK,
        kv_capacity_blocks: 128,
        max_model_len: 128 * BLOCK,
        ..EngineConfig::default()
    }
}

struct Server {
    url: String,
    /// Each rank's (PUB, replay) endpoints as bound, in rank order.
    kv: Vec<(String, Option<String>)>,
    /// What `serve` prints after `listening on ...`.
    lines: Vec<String>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(size: u32, speedup: f64, kv: Option<KvEventsConfig>) -> Server {
    let cfg = ServeConfig {
        name: "dp".into(),
        speedup,
        engine: engine(),
        data_parallel_size: size,
        ..ServeConfig::default()
    };
    let server = BoundServer::bind_with_kv_events(cfg, kv)
        .await
        .expect("bind");
    assert_eq!(server.drivers().len(), size as usize);
    let kv = server
        .kv_events_publishers()
        .iter()
        .enumerate()
        .map(|(r, p)| {
            assert_eq!(p.rank(), r as u32);
            (
                p.endpoint().to_owned(),
                p.replay_endpoint().map(str::to_owned),
            )
        })
        .collect();
    let lines = server.kv_events_lines();
    let (url, _stop) = serve_in_background(server);
    Server {
        url,
        kv,
        lines,
        _stop,
    }
}

/// A completion of these token ids.
fn completion(prompt: &[u32], max_tokens: u32, stream: bool) -> String {
    json!({"model": "study", "prompt": prompt, "max_tokens": max_tokens, "stream": stream})
        .to_string()
}

/// `salt`, `salt + 1`, ...: 40 tokens (2 full blocks and 8 tokens).
fn prompt(salt: u32) -> Vec<u32> {
    (salt..salt + 40).collect()
}

/// The rank that served a response.
fn rank_of(headers: &hyper::HeaderMap) -> Option<u32> {
    headers.get(RANK_HEADER)?.to_str().ok()?.parse().ok()
}

/// A completion of `prompt` (2 tokens) with these headers: (status, headers, body).
async fn try_complete(
    c: &HttpClient,
    url: &str,
    headers: &[(&str, &str)],
    prompt: &[u32],
    stream: bool,
) -> (u16, hyper::HeaderMap, String) {
    let body = completion(prompt, 2, stream);
    post(c, url, "/v1/completions", headers, &body).await
}

/// A whole completion of `prompt` (2 tokens) with these headers; (rank, usage).
async fn complete(
    c: &HttpClient,
    url: &str,
    headers: &[(&str, &str)],
    prompt: &[u32],
) -> (u32, Value) {
    let (status, h, body) = try_complete(c, url, headers, prompt, false).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    (rank_of(&h).expect("a rank header"), v["usage"].clone())
}

/// Starts a long streamed completion and reads until its first token: the request is then
/// running on its rank. Returns the rank and the body (dropping it aborts the request).
async fn running(
    c: &HttpClient,
    url: &str,
    headers: &[(&str, &str)],
    salt: u32,
) -> (u32, Incoming) {
    let body = completion(&prompt(salt), LONG, true);
    let resp = open(c, request("POST", url, "/v1/completions", headers, body)).await;
    assert_eq!(resp.status(), 200);
    let rank = rank_of(resp.headers()).expect("a rank header");
    let mut body = resp.into_body();
    loop {
        let frame = tokio::time::timeout(WAIT, body.frame())
            .await
            .expect("a first token in time")
            .expect("not the end")
            .expect("a frame");
        if frame.data_ref().is_some_and(|d| d.starts_with(b"data: {")) {
            return (rank, body);
        }
    }
}

async fn reset(c: &HttpClient, url: &str) -> (u16, String) {
    let (status, _, body) = post(c, url, "/reset_prefix_cache", &[], "").await;
    (status, body)
}

async fn metrics(c: &HttpClient, url: &str) -> String {
    let (status, m) = get(c, url, "/metrics").await;
    assert_eq!(status, 200, "{m}");
    m
}

/// The value of one sample: the line must start with exactly `series` and a space.
fn sample(m: &str, series: &str) -> f64 {
    m.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in\n{m}"))
}

/// `name{engine="R",model_name="study"}`.
fn of(name: &str, rank: u32) -> String {
    format!("{name}{{engine=\"{rank}\",model_name=\"study\"}}")
}

/// A chat of one message, streamed with a usage chunk.
fn chat() -> String {
    json!({
        "model": "study",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

/// The usage chunk's `prompt_tokens` in an SSE body.
fn streamed_prompt_tokens(body: &str) -> f64 {
    body.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.strip_prefix("data: ")?).ok())
        .find_map(|v| v["usage"]["prompt_tokens"].as_f64())
        .unwrap_or_else(|| panic!("no usage chunk in {body}"))
}

/// An OpenAI-style 400 whose message names the ranks `[0, size)`, with no rank header.
fn assert_not_a_rank(status: u16, h: &hyper::HeaderMap, body: &str, size: u32) {
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(body).expect("an OpenAI-style body");
    assert_eq!(v["error"]["type"], "BadRequestError");
    assert_eq!(v["error"]["code"], 400);
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("[0, {size})")), "{body}");
    assert_eq!(h.get(RANK_HEADER), None);
    assert_eq!(h[REPLICA_HEADER], "dp");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_requests_are_served_and_counted_by_their_rank_only() {
    tokio::time::timeout(LIMIT, async {
        let s = start(2, 100.0, None).await;
        let c = client();
        let pin = |r| [("x-data-parallel-rank", r)];
        // Rank 1 twice (the header in any case): the second reuses rank 1's 2 cached blocks.
        for (name, cached) in [("X-data-parallel-rank", 0), ("x-DATA-parallel-RANK", 32)] {
            let (rank, usage) = complete(&c, &s.url, &[(name, "1")], &prompt(1)).await;
            assert_eq!(rank, 1);
            assert_eq!(usage["prompt_tokens"], 40);
            assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], cached);
        }
        // The same prompt on rank 0: its own cache has none of it.
        let (rank, usage) = complete(&c, &s.url, &pin("0"), &prompt(1)).await;
        assert_eq!(rank, 0);
        assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
        // A streamed chat pinned to rank 0; ids name the rank.
        let (status, h, body) = post(&c, &s.url, "/v1/chat/completions", &pin("0"), &chat()).await;
        assert_eq!((status, rank_of(&h)), (200, Some(0)), "{body}");
        assert!(body.contains("\"id\":\"chatcmpl-dp-r0-"), "{body}");
        let chat_tokens = streamed_prompt_tokens(&body);

        // Not a rank: a 400 before any engine is touched, streamed or not.
        for bad in ["2", "x", "-1", "1.5", ""] {
            for stream in [false, true] {
                let (status, h, body) =
                    try_complete(&c, &s.url, &pin(bad), &prompt(9), stream).await;
                assert_not_a_rank(status, &h, &body, 2);
            }
        }
        // An injected fault never reaches a rank, and counts server-wide.
        let headers = [("x-sim-status", "503"), ("x-data-parallel-rank", "1")];
        let (status, h, _) = try_complete(&c, &s.url, &headers, &prompt(1), false).await;
        assert_eq!((status, h.get(RANK_HEADER)), (503, None));

        let m = metrics(&c, &s.url).await;
        let rank = |name: &str, r: u32| sample(&m, &of(name, r));
        for r in [0, 1] {
            assert_eq!(rank("vllm:num_requests_running", r), 0.0);
            assert_eq!(rank("vllm:num_requests_waiting", r), 0.0);
            assert_eq!(rank("vllm:request_success_total", r), 2.0);
            assert_eq!(rank("kvroute_sim:requests_received_total", r), 2.0);
            assert_eq!(rank("vllm:time_to_first_token_seconds_count", r), 2.0);
        }
        assert_eq!(rank("vllm:prefix_cache_queries_total", 1), 80.0);
        assert_eq!(rank("vllm:prefix_cache_hits_total", 1), 32.0);
        assert_eq!(rank("vllm:prompt_tokens_total", 1), 48.0);
        assert_eq!(rank("vllm:request_prompt_tokens_sum", 1), 80.0);
        assert_eq!(
            rank("vllm:prefix_cache_queries_total", 0),
            40.0 + chat_tokens
        );
        assert_eq!(rank("vllm:prefix_cache_hits_total", 0), 0.0);
        assert_eq!(rank("vllm:prompt_tokens_total", 0), 40.0 + chat_tokens);
        assert_eq!(rank("vllm:generation_tokens_total", 0), 4.0);
        let inf =
            "vllm:request_generation_tokens_bucket{engine=\"1\",le=\"+Inf\",model_name=\"study\"}";
        assert_eq!(sample(&m, inf), 2.0);
        // Every engine sample is one rank's; the faults are the server's.
        let engine = m
            .lines()
            .filter(|l| l.starts_with("vllm:") || l.starts_with("kvroute_sim:"));
        for l in engine {
            let labels = &l[l.find('{').unwrap_or(l.len())..];
            assert!(
                labels.contains("engine=\"0\",") || labels.contains("engine=\"1\","),
                "{l}"
            );
        }
        assert_eq!(sample(&m, "kvroute_sim_faults_total{kind=\"status\"}"), 1.0);
    })
    .await
    .expect("within the time limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_engine_is_rank_0_unlabelled_and_checks_the_header_too() {
    tokio::time::timeout(LIMIT, async {
        let s = start(1, 100.0, None).await;
        let c = client();
        let (rank, _) = complete(&c, &s.url, &[], &prompt(1)).await;
        assert_eq!(rank, 0);
        let pin = |r| [("x-data-parallel-rank", r)];
        let (status, h, body) = try_complete(&c, &s.url, &pin("0"), &prompt(1), false).await;
        assert_eq!((status, rank_of(&h)), (200, Some(0)));
        assert!(body.contains("\"id\":\"cmpl-dp-2\""), "{body}");
        let (status, h, body) = try_complete(&c, &s.url, &pin("1"), &prompt(1), false).await;
        assert_not_a_rank(status, &h, &body, 1);
        let m = metrics(&c, &s.url).await;
        assert!(!m.contains("engine="), "{m}");
        let success = "vllm:request_success_total{model_name=\"study\"}";
        assert_eq!(sample(&m, success), 2.0);
        assert!(s.lines.is_empty());
    })
    .await
    .expect("within the time limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpinned_requests_go_to_the_least_loaded_rank() {
    tokio::time::timeout(LIMIT, async {
        let s = start(2, 10.0, None).await;
        let c = client();
        // Both idle: rank 0. Rank 0 busy: rank 1.
        let (a, _a) = running(&c, &s.url, &[], 100).await;
        let (b, _b) = running(&c, &s.url, &[], 200).await;
        assert_eq!((a, b), (0, 1));
        let m = metrics(&c, &s.url).await;
        for r in [0, 1] {
            assert_eq!(sample(&m, &of("vllm:num_requests_running", r)), 1.0, "{m}");
            assert_eq!(sample(&m, &of("vllm:num_requests_waiting", r)), 0.0, "{m}");
        }
        // One running on each (a tie): the lower rank.
        assert_eq!(complete(&c, &s.url, &[], &prompt(300)).await.0, 0);
        // Two on rank 0, one on rank 1: rank 1, whatever came before.
        let (d, _d) = running(&c, &s.url, &[("x-data-parallel-rank", "0")], 400).await;
        assert_eq!(d, 0);
        assert_eq!(complete(&c, &s.url, &[], &prompt(500)).await.0, 1);
        assert_eq!(complete(&c, &s.url, &[], &prompt(600)).await.0, 1);
        // (The weighting of waiting requests is checked in ranks.rs' unit tests.)

        // Two sent together to idle ranks: the first one chosen counts at once (waiting), so
        // the other goes to the other rank.
        let s = start(2, 10.0, None).await;
        let (x, y) = tokio::join!(running(&c, &s.url, &[], 700), running(&c, &s.url, &[], 800));
        let mut ranks = [x.0, y.0];
        ranks.sort();
        assert_eq!(ranks, [0, 1]);
    })
    .await
    .expect("within the time limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resetting_the_prefix_cache_resets_every_rank_or_none() {
    tokio::time::timeout(LIMIT, async {
        let s = start(2, 10.0, None).await;
        let c = client();
        let pin0 = [("x-data-parallel-rank", "0")];
        complete(&c, &s.url, &pin0, &prompt(1)).await;
        // A request running on rank 1 holds its cached blocks: no rank is reset.
        let (rank, stream) = running(&c, &s.url, &[("x-data-parallel-rank", "1")], 100).await;
        assert_eq!(rank, 1);
        let (status, body) = reset(&c, &s.url).await;
        assert_eq!(status, 409, "{body}");
        let (_, usage) = complete(&c, &s.url, &pin0, &prompt(1)).await;
        assert_eq!(
            usage["prompt_tokens_details"]["cached_tokens"], 32,
            "rank 0 kept its cache"
        );
        // The client goes away: rank 1's request is aborted, and the reset then succeeds.
        drop(stream);
        let deadline = Instant::now() + WAIT;
        loop {
            let (status, body) = reset(&c, &s.url).await;
            if status == 200 {
                assert_eq!(body, r#"{"reset":true}"#);
                break;
            }
            assert_eq!(status, 409, "{body}");
            assert!(
                Instant::now() < deadline,
                "rank 1 never let go of its blocks"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for (r, salt) in [("0", 1), ("1", 100)] {
            let (_, usage) =
                complete(&c, &s.url, &[("x-data-parallel-rank", r)], &prompt(salt)).await;
            assert_eq!(
                usage["prompt_tokens_details"]["cached_tokens"], 0,
                "rank {r}"
            );
        }
    })
    .await
    .expect("within the time limit");
}

// ---------------------------------------------------------------------------------------------
// KV events.

/// One subscriber per rank (index = rank), each seeing its rank's first `AllBlocksCleared`:
/// resets (idle) until every subscription has taken (ZMQ's slow joiner). Returns the
/// subscribers and how many resets were made.
async fn subscribe_all(c: &HttpClient, url: &str, endpoints: &[&str]) -> (Vec<Subscriber>, u64) {
    let mut subs = Vec::new();
    for ep in endpoints {
        subs.push(Subscriber::connect(ep, "", WAIT).await.expect("subscribe"));
    }
    let mut synced = vec![false; subs.len()];
    let mut resets = 0;
    let deadline = Instant::now() + WAIT;
    while !synced.iter().all(|s| *s) {
        assert!(Instant::now() < deadline, "the subscriptions never took");
        let (status, body) = reset(c, url).await;
        assert_eq!(status, 200, "{body}");
        resets += 1;
        for (sub, synced) in subs.iter_mut().zip(&mut synced) {
            if !*synced {
                *synced = sub
                    .recv_timeout(Duration::from_millis(300))
                    .await
                    .expect("valid")
                    .is_some();
            }
        }
    }
    (subs, resets)
}

/// The next batch on `sub`, which must come in time: (seq, batch).
async fn next_batch(sub: &mut Subscriber) -> (u64, EventBatch) {
    let m = sub
        .recv_timeout(WAIT)
        .await
        .expect("valid")
        .expect("a batch in time");
    (m.seq, decode(&m.payload).expect("decodes"))
}

/// Everything `endpoint` replays from seq 0, decoded, checking the seqs are 0, 1, 2, ...
async fn replayed(endpoint: &str) -> Vec<EventBatch> {
    let items = replay(endpoint, 0, WAIT).await.expect("replay");
    let seqs: Vec<u64> = items.iter().map(|i| i.seq).collect();
    assert_eq!(seqs, (0..items.len() as u64).collect::<Vec<_>>());
    items
        .iter()
        .map(|i| decode(&i.payload).expect("decodes"))
        .collect()
}

/// A request pinned to rank 1 caches its blocks there: one `BlockStored` on rank 1's socket
/// (stamped rank 1, at the seq after the resets), none on rank 0's.
async fn pinned_blocks_are_published_by_rank_1_only(
    c: &HttpClient,
    url: &str,
    kv: &[(String, Option<String>)],
) {
    let eps: Vec<&str> = kv.iter().map(|(e, _)| e.as_str()).collect();
    let (mut subs, resets) = subscribe_all(c, url, &eps).await;
    let p = prompt(7);
    complete(c, url, &[("x-data-parallel-rank", "1")], &p).await;
    // Rank 1: the resets' clears (those the subscription saw), then the blocks, at seq `resets`.
    let (seq, blocks) = loop {
        let (seq, batch) = next_batch(&mut subs[1]).await;
        assert_eq!(batch.data_parallel_rank, Some(1));
        if batch.events != [KvEvent::AllBlocksCleared] {
            break (seq, batch);
        }
    };
    assert_eq!(seq, resets);
    let [KvEvent::BlockStored(stored)] = &blocks.events[..] else {
        panic!("{blocks:?}")
    };
    assert_eq!(stored.token_ids, p[..2 * BLOCK as usize]);
    assert_eq!((stored.block_hashes.len(), stored.block_size), (2, BLOCK));
    // One more reset: rank 0's socket has published nothing but clears up to its clear.
    let (status, _) = reset(c, url).await;
    assert_eq!(status, 200);
    loop {
        let (seq, batch) = next_batch(&mut subs[0]).await;
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert_eq!(
            batch.events,
            [KvEvent::AllBlocksCleared],
            "rank 0 seq {seq}"
        );
        if seq == resets {
            break;
        }
    }
    let (seq, batch) = next_batch(&mut subs[1]).await;
    assert_eq!(
        (seq, &batch.events[..]),
        (resets + 1, &[KvEvent::AllBlocksCleared][..])
    );
    // The replay sockets hold the same: rank 0 clears only, rank 1 one stored batch; seqs from
    // 0 on each.
    if let [(_, Some(r0)), (_, Some(r1))] = kv {
        let rank0 = replayed(r0).await;
        assert_eq!(rank0.len() as u64, resets + 1);
        assert!(rank0
            .iter()
            .all(|b| b.events == [KvEvent::AllBlocksCleared] && b.data_parallel_rank == Some(0)));
        let rank1 = replayed(r1).await;
        assert_eq!(rank1.len() as u64, resets + 2);
        assert_eq!(rank1[resets as usize].events, blocks.events);
        assert!(rank1.iter().all(|b| b.data_parallel_rank == Some(1)));
        let stored = rank1
            .iter()
            .filter(|b| b.events != [KvEvent::AllBlocksCleared])
            .count();
        assert_eq!(stored, 1);
    } else {
        panic!("both ranks have a replay socket: {kv:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rank_publishes_its_own_events_on_its_own_free_ports() {
    tokio::time::timeout(LIMIT, async {
        let mut kv = KvEventsConfig::new("tcp://127.0.0.1:0");
        kv.replay_endpoint = Some("tcp://127.0.0.1:0".into());
        let s = start(2, 100.0, Some(kv)).await;
        let mut bound: Vec<&str> = Vec::new();
        for (r, (ep, replay)) in s.kv.iter().enumerate() {
            let replay = replay.as_deref().expect("a replay socket");
            assert_eq!(
                s.lines[r],
                format!("kv-events on {ep} replay {replay} rank {r}")
            );
            bound.extend([ep.as_str(), replay]);
        }
        assert_eq!(s.lines.len(), 2);
        for ep in &bound {
            assert!(
                ep.starts_with("tcp://127.0.0.1:") && !ep.ends_with(":0"),
                "{ep}"
            );
        }
        let mut distinct = bound.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "{bound:?}");
        pinned_blocks_are_published_by_rank_1_only(&client(), &s.url, &s.kv).await;
    })
    .await
    .expect("within the time limit");
}

// ---------------------------------------------------------------------------------------------
// The binary.

/// A running `kvroute-sim serve`, killed when dropped (a test that passes stops it itself).
struct Serve {
    child: Child,
    /// Its stdout lines: `listening on ...`, then the `kv-events` ones.
    lines: Vec<String>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// `serve --host 127.0.0.1 --port 0 --speedup 100 ARGS` and its first `count` lines, or
    /// `None` if it exits first (a port taken meanwhile).
    fn spawn(args: &[&str], count: usize) -> Option<Serve> {
        let common = "serve --host 127.0.0.1 --port 0 --name dp --speedup 100 \
                      --block-size 16 --kv-blocks 2048";
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
            .args(common.split_whitespace())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kvroute-sim serve");
        let rx = lines(&mut child);
        let mut serve = Serve {
            child,
            lines: Vec::new(),
        };
        while serve.lines.len() < count {
            match rx.recv_timeout(WAIT) {
                Ok(l) => serve.lines.push(l),
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return None,
                Err(e) => panic!("no line from serve after {:?}: {e}", serve.lines),
            }
        }
        Some(serve)
    }

    fn url(&self) -> String {
        let addr = self.lines[0]
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("first line {:?}", self.lines[0]));
        format!("http://{addr}")
    }

    /// SIGTERM: it must exit with success within 10 s.
    fn stop(mut self) {
        let kill = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "exit status {st:?}");
                return;
            }
            assert!(Instant::now() < deadline, "did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A port P with P..P+n free on 127.0.0.1 just now (retried until one is found).
fn free_ports(n: u16) -> u16 {
    for _ in 0..100 {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = first.local_addr().unwrap().port();
        if p.checked_add(n).is_none() {
            continue;
        }
        let rest: Result<Vec<_>, _> = (1..n)
            .map(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)))
            .collect();
        if rest.is_ok() {
            return p;
        }
    }
    panic!("no {n} consecutive free ports");
}

#[test]
fn an_explicit_port_is_offset_by_the_rank_and_printed_per_rank() {
    // PUB at P (rank 1: P + 1), replay at P + 2 (rank 1: P + 3). Another process may take a
    // port between the probe and the bind: then `serve` exits with 1 and we try again.
    let (serve, p) = (0..5)
        .find_map(|_| {
            let p = free_ports(4);
            let pub_ep = format!("tcp://127.0.0.1:{p}");
            let replay_ep = format!("tcp://127.0.0.1:{}", p + 2);
            let args = [
                "--data-parallel-size",
                "2",
                "--kv-events-endpoint",
                &pub_ep,
                "--kv-events-replay-endpoint",
                &replay_ep,
            ];
            Serve::spawn(&args, 3).map(|s| (s, p))
        })
        .expect("serve started on free ports");
    let ep = |port: u16| format!("tcp://127.0.0.1:{port}");
    assert_eq!(
        serve.lines[1..],
        [
            format!("kv-events on {} replay {} rank 0", ep(p), ep(p + 2)),
            format!("kv-events on {} replay {} rank 1", ep(p + 1), ep(p + 3)),
        ]
    );
    let url = serve.url();
    let kv = [(ep(p), Some(ep(p + 2))), (ep(p + 1), Some(ep(p + 3)))];
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        tokio::time::timeout(
            LIMIT,
            pinned_blocks_are_published_by_rank_1_only(&client(), &url, &kv),
        )
        .await
        .expect("within the time limit");
        let m = metrics(&client(), &url).await;
        assert_eq!(
            sample(&m, &of("kvroute_sim:requests_received_total", 1)),
            1.0
        );
        assert_eq!(
            sample(&m, &of("kvroute_sim:requests_received_total", 0)),
            0.0
        );
    });
    serve.stop();
}

#[test]
fn port_0_gives_every_rank_a_free_port_of_its_own() {
    let serve = Serve::spawn(
        &[
            "--data-parallel-size",
            "3",
            "--kv-events-endpoint",
            "tcp://127.0.0.1:0",
        ],
        4,
    )
    .expect("serve starts");
    let mut ports = Vec::new();
    for (r, line) in serve.lines[1..].iter().enumerate() {
        let words: Vec<&str> = line.split(' ').collect();
        let ["kv-events", "on", ep, "rank", rank] = words[..] else {
            panic!("line {line:?}")
        };
        assert_eq!(rank, r.to_string());
        let port = ep
            .strip_prefix("tcp://127.0.0.1:")
            .unwrap_or_else(|| panic!("{line}"));
        ports.push(port.parse::<u16>().expect("a port"));
    }
    assert!(ports.iter().all(|&p| p != 0), "{ports:?}");
    let mut distinct = ports.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{ports:?}");
    serve.stop();
}

#[test]
fn a_bad_data_parallel_size_exits_2() {
    for size in ["0", "65", "two", "-1"] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
            .args(["serve", "--port", "0", "--name", "bad"])
            .arg(format!("--data-parallel-size={size}"))
            .output()
            .expect("run kvroute-sim serve");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{size}: {err}");
        assert!(err.contains("--data-parallel-size"), "{size}: {err}");
        assert!(out.stdout.is_empty(), "{size} must not start serving");
    }
}
