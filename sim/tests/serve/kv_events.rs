//! `kvroute-sim serve` publishing vLLM-format KV-cache events over ZMQ (`--kv-events-*`): a
//! real subscriber and replay client from `kvroute-kv-events` against servers on 127.0.0.1
//! with ports chosen at run time. Bounded: every test runs under a timeout and the engines run
//! 100× faster than real time.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvroute_kv_events::wire::{decode, encode, BlockHash, EventBatch, KvEvent, Layout};
use kvroute_kv_events::{replay, Subscriber};
use kvroute_sim::engine::EngineConfig;
use kvroute_sim::prompt_tokens::PromptReader;
use kvroute_sim::serve::{
    BoundServer, Driver, FaultSpec, KvEventsConfig, ServeConfig, DEFAULT_MAX_BODY_BYTES,
};
use serde_json::json;

use crate::support::{client, lines, serve_in_background, stop, HttpClient};

/// Every test's time limit.
const LIMIT: Duration = Duration::from_secs(30);
/// How long to wait for one batch that must come.
const BATCH: Duration = Duration::from_secs(5);

const BLOCK: u32 = 16;

/// A small engine: 16-token blocks, `kv_blocks` of them.
fn engine(kv_blocks: u32) -> EngineConfig {
    EngineConfig {
        block_size: BLOCK,
        kv_capacity_blocks: kv_blocks,
        max_model_len: kv_blocks * BLOCK,
        ..EngineConfig::default()
    }
}

struct Server {
    url: String,
    endpoint: String,
    replay_endpoint: Option<String>,
    driver: std::sync::Arc<Driver>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(engine: EngineConfig, kv: KvEventsConfig) -> Server {
    let cfg = ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        name: "kv".into(),
        model: "study".into(),
        speedup: 100.0,
        engine,
        fault: FaultSpec::default(),
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        prompts: PromptReader::built_in(),
        ..ServeConfig::default()
    };
    let server = BoundServer::bind_with_kv_events(cfg, Some(kv))
        .await
        .expect("bind");
    let endpoint = server.kv_events_endpoint().expect("publishing").to_owned();
    let replay_endpoint = server.kv_events_replay_endpoint().map(str::to_owned);
    assert!(
        endpoint.starts_with("tcp://127.0.0.1:") && !endpoint.ends_with(":0"),
        "{endpoint}"
    );
    let driver = server.driver();
    let (url, tx) = serve_in_background(server);
    Server {
        url,
        endpoint,
        replay_endpoint,
        driver,
        _stop: tx,
    }
}

async fn post(c: &HttpClient, url: &str, path: &str, body: &str) -> (u16, String) {
    let (status, _, body) = crate::support::post(c, url, path, &[], body).await;
    (status, body)
}

/// A completion of `prompt` with 2 output tokens, to the end.
async fn complete(c: &HttpClient, url: &str, prompt: &str) {
    let body = json!({"model": "study", "prompt": prompt, "max_tokens": 2}).to_string();
    let (status, body) = post(c, url, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{body}");
}

/// The ids the server gives `prompt` (the built-in prompt reader, as `serve` without
/// `--tokenizer`).
fn tokens(prompt: &str) -> Vec<u32> {
    PromptReader::built_in().completion(prompt).unwrap()
}

/// A prompt of `blocks` full blocks and a few tokens more; `salt` makes it differ from the
/// others from its first block on.
fn prompt(salt: &str, blocks: usize) -> String {
    let mut p = format!("{salt} ");
    let mut i = 0;
    while tokens(&p).len() < blocks * BLOCK as usize + 5 {
        p.push_str(&format!("item {i}, "));
        i += 1;
    }
    let t = tokens(&p);
    assert_eq!(
        t.len() / BLOCK as usize,
        blocks,
        "{p:?}: {} tokens",
        t.len()
    );
    p
}

/// A subscriber that checks every message's topic and that seqs are consecutive from the
/// first one seen; keeps every payload.
struct Sub {
    sub: Subscriber,
    topic: String,
    last_seq: Option<u64>,
    payloads: Vec<(u64, Bytes)>,
}

impl Sub {
    async fn connect(endpoint: &str, topic: &str) -> Sub {
        let sub = Subscriber::connect(endpoint, topic, Duration::from_secs(5))
            .await
            .expect("subscribe");
        Sub {
            sub,
            topic: topic.to_owned(),
            last_seq: None,
            payloads: Vec::new(),
        }
    }

    /// The next batch within `timeout`, decoded.
    async fn next(&mut self, timeout: Duration) -> Option<(u64, EventBatch)> {
        let m = self
            .sub
            .recv_timeout(timeout)
            .await
            .expect("a valid message")?;
        assert_eq!(m.topic, self.topic.as_bytes());
        if let Some(last) = self.last_seq {
            assert_eq!(m.seq, last + 1, "seqs must be consecutive");
        }
        self.last_seq = Some(m.seq);
        self.payloads.push((m.seq, m.payload.clone()));
        Some((m.seq, decode(&m.payload).expect("decodes")))
    }

    async fn must_next(&mut self) -> (u64, EventBatch) {
        self.next(BATCH).await.expect("a batch in time")
    }

    /// Beats ZMQ's slow joiner: resets the (idle) prefix cache until this subscriber sees the
    /// `AllBlocksCleared` that publishes. Returns its seq.
    async fn sync(&mut self, c: &HttpClient, url: &str) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < deadline, "the subscription never took");
            let (status, body) = post(c, url, "/reset_prefix_cache", "").await;
            assert_eq!(status, 200, "{body}");
            if let Some((seq, batch)) = self.next(Duration::from_millis(300)).await {
                assert_eq!(batch.events, [KvEvent::AllBlocksCleared]);
                // A reset published before the subscription was complete may still trickle in.
                while let Some((seq, batch)) = self.next(Duration::from_millis(100)).await {
                    assert_eq!(batch.events, [KvEvent::AllBlocksCleared]);
                    let _ = seq;
                }
                return self.last_seq.unwrap_or(seq);
            }
        }
    }
}

fn stored(ev: &KvEvent) -> &kvroute_kv_events::wire::BlockStored {
    match ev {
        KvEvent::BlockStored(s) => s,
        other => panic!("expected BlockStored, got {other:?}"),
    }
}

fn removed(ev: &KvEvent) -> &kvroute_kv_events::wire::BlockRemoved {
    match ev {
        KvEvent::BlockRemoved(r) => r,
        other => panic!("expected BlockRemoved, got {other:?}"),
    }
}

/// Checks the one `BlockStored` of `batch` against `prompt_tokens`: every full block's tokens,
/// one hash per block, no parent (a prompt's first block), the engine's block size, GPU.
fn assert_prompt_stored(batch: &EventBatch, prompt_tokens: &[u32]) -> Vec<BlockHash> {
    assert_eq!(batch.events.len(), 1, "{batch:?}");
    let s = stored(&batch.events[0]);
    let full = prompt_tokens.len() / BLOCK as usize;
    assert_eq!(s.token_ids, prompt_tokens[..full * BLOCK as usize]);
    assert_eq!(s.block_hashes.len(), full);
    assert_eq!(s.parent_block_hash, None);
    assert_eq!(s.block_size, BLOCK);
    assert_eq!(s.medium.as_deref(), Some("GPU"));
    assert_eq!(batch.data_parallel_rank, Some(0));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - batch.ts).abs() < 60.0,
        "ts {} vs now {now}",
        batch.ts
    );
    s.block_hashes.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_stored_blocks_resets_and_replays_from_zero() {
    tokio::time::timeout(LIMIT, async {
        let mut kv = KvEventsConfig::new("tcp://127.0.0.1:0");
        kv.replay_endpoint = Some("tcp://127.0.0.1:0".into());
        let s = start(engine(160), kv).await;
        let replay_ep = s.replay_endpoint.clone().expect("replay bound");
        assert!(!replay_ep.ends_with(":0"), "{replay_ep}");

        // Before anyone subscribes (the slow joiner's loss): a prime publishes seq 0.
        let primed = prompt("primed", 2);
        s.driver.prime(&tokens(&primed));

        let c = client();
        let mut sub = Sub::connect(&s.endpoint, "").await;
        let synced = sub.sync(&c, &s.url).await;
        assert!(synced >= 1, "seq 0 was the prime's");

        let p = prompt("live", 4);
        complete(&c, &s.url, &p).await;
        let (_, batch) = sub.must_next().await;
        let hashes = assert_prompt_stored(&batch, &tokens(&p));
        // Decoding steps cache nothing: no batch.
        assert!(sub.next(Duration::from_millis(200)).await.is_none());

        // The same prompt again: a cache hit, nothing new stored.
        complete(&c, &s.url, &p).await;
        assert!(sub.next(Duration::from_millis(200)).await.is_none());

        let (status, body) = post(&c, &s.url, "/reset_prefix_cache", "").await;
        assert_eq!((status, body.as_str()), (200, r#"{"reset":true}"#));
        let (last, batch) = sub.must_next().await;
        assert_eq!(batch.events, [KvEvent::AllBlocksCleared]);

        // Replay from 0: every batch, the prime's first, the live ones byte for byte.
        let items = replay(&replay_ep, 0, Duration::from_secs(5))
            .await
            .expect("replay");
        let seqs: Vec<u64> = items.iter().map(|i| i.seq).collect();
        assert_eq!(seqs, (0..=last).collect::<Vec<_>>());
        assert!(items.iter().all(|i| i.topic.as_deref() == Some(&b""[..])));
        let first = decode(&items[0].payload).unwrap();
        assert_prompt_stored(&first, &tokens(&primed));
        for (seq, payload) in &sub.payloads {
            assert_eq!(&items[*seq as usize].payload, payload, "seq {seq}");
        }
        let live_stored = items.iter().any(|i| {
            matches!(&decode(&i.payload).unwrap().events[..],
                     [KvEvent::BlockStored(b)] if b.block_hashes == hashes)
        });
        assert!(live_stored, "the live prompt's blocks are in the replay");
        // From a later seq: only the rest.
        let tail = replay(&replay_ep, last, Duration::from_secs(5))
            .await
            .expect("replay");
        assert_eq!(tail.iter().map(|i| i.seq).collect::<Vec<_>>(), [last]);
    })
    .await
    .expect("within the time limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_are_published_before_the_blocks_that_replace_them() {
    tokio::time::timeout(LIMIT, async {
        // 8 blocks: a 5-block prompt (6 blocks with its tail) leaves 2 free.
        let s = start(engine(8), KvEventsConfig::new("tcp://127.0.0.1:0")).await;
        let c = client();
        let mut sub = Sub::connect(&s.endpoint, "").await;
        sub.sync(&c, &s.url).await;

        let a = prompt("first", 5);
        complete(&c, &s.url, &a).await;
        let (_, batch) = sub.must_next().await;
        let a_hashes = assert_prompt_stored(&batch, &tokens(&a));

        // Another prompt needs 6 blocks: 3 of the first's cached blocks are evicted, its tail
        // first (vLLM frees a request's blocks in reverse order).
        let b = prompt("second", 5);
        complete(&c, &s.url, &b).await;
        let (_, batch) = sub.must_next().await;
        assert_eq!(batch.events.len(), 2, "{batch:?}");
        let r = removed(&batch.events[0]);
        assert_eq!(r.medium.as_deref(), Some("GPU"));
        assert_eq!(
            r.block_hashes,
            [
                a_hashes[4].clone(),
                a_hashes[3].clone(),
                a_hashes[2].clone()
            ]
        );
        let s2 = stored(&batch.events[1]);
        let b_tokens = tokens(&b);
        assert_eq!(s2.token_ids, b_tokens[..5 * BLOCK as usize]);
        assert_eq!(s2.parent_block_hash, None);
        assert!(s2.block_hashes.iter().all(|h| !a_hashes.contains(h)));
    })
    .await
    .expect("within the time limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layout_is_published_as_chosen_with_the_topic() {
    tokio::time::timeout(LIMIT, async {
        let layouts = [Layout::Positional, Layout::Map, Layout::MapBatch];
        for layout in layouts {
            let mut kv = KvEventsConfig::new("tcp://127.0.0.1:0");
            kv.layout = layout;
            kv.topic = "kv@sim".into();
            let s = start(engine(160), kv).await;
            let c = client();
            let mut sub = Sub::connect(&s.endpoint, "kv@sim").await;
            sub.sync(&c, &s.url).await;
            let p = prompt("layout", 3);
            complete(&c, &s.url, &p).await;
            let (seq, batch) = sub.must_next().await;
            assert_prompt_stored(&batch, &tokens(&p));
            // The payload is exactly that batch in `layout`, and in no other.
            let payload = &sub.payloads.last().unwrap().1;
            assert_eq!(sub.payloads.last().unwrap().0, seq);
            assert_eq!(&encode(&batch, layout)[..], &payload[..], "{layout}");
            for other in layouts.iter().filter(|&&l| l != layout) {
                assert_ne!(
                    &encode(&batch, *other)[..],
                    &payload[..],
                    "{layout} vs {other}"
                );
            }
        }
    })
    .await
    .expect("within the time limit");
}

// ---------------------------------------------------------------------------------------------
// The binary.

/// `serve ... ARGS`: its first two stdout lines (waiting at most 10 s for them), and the child.
fn spawn_serve(args: &[&str]) -> (Child, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--name",
            "kv",
        ])
        .args(["--speedup", "100"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kvroute-sim serve");
    let rx = lines(&mut child);
    let mut next = || match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(l) => l,
        Err(e) => {
            let _ = child.kill();
            panic!("no line from serve: {e}");
        }
    };
    let (first, second) = (next(), next());
    (child, first, second)
}

#[test]
fn the_binary_prints_the_bound_endpoints_on_a_second_line_and_publishes() {
    let (child, first, second) = spawn_serve(&[
        "--kv-events-endpoint",
        "tcp://127.0.0.1:0",
        "--kv-events-replay-endpoint",
        "tcp://127.0.0.1:0",
    ]);
    let addr = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line {first:?}"));
    assert!(
        addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
        "{addr}"
    );
    let rest = second
        .strip_prefix("kv-events on ")
        .unwrap_or_else(|| panic!("second line {second:?}"));
    let (endpoint, replay_ep) = rest.split_once(" replay ").expect("a replay endpoint");
    for ep in [endpoint, replay_ep] {
        assert!(
            ep.starts_with("tcp://127.0.0.1:") && !ep.ends_with(":0"),
            "{second}"
        );
    }
    assert_ne!(endpoint, replay_ep);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        tokio::time::timeout(LIMIT, async {
            let c = client();
            let url = format!("http://{addr}");
            let mut sub = Sub::connect(endpoint, "").await;
            let seq = sub.sync(&c, &url).await;
            let items = replay(replay_ep, seq, Duration::from_secs(5))
                .await
                .expect("replay");
            assert_eq!(items.len(), 1);
            assert_eq!(
                decode(&items[0].payload).unwrap().events,
                [KvEvent::AllBlocksCleared]
            );
            // The default layout is map.
            let batch = decode(&items[0].payload).unwrap();
            assert_eq!(&encode(&batch, Layout::Map)[..], &items[0].payload[..]);
        })
        .await
        .expect("within the time limit");
    });
    stop(child);

    // Without a replay socket: the endpoint alone.
    let (child, first, second) = spawn_serve(&["--kv-events-endpoint", "tcp://127.0.0.1:0"]);
    assert!(first.starts_with("listening on 127.0.0.1:"), "{first}");
    let endpoint = second
        .strip_prefix("kv-events on ")
        .unwrap_or_else(|| panic!("second line {second:?}"));
    assert!(
        endpoint.starts_with("tcp://127.0.0.1:") && !endpoint.contains(' '),
        "{second}"
    );
    stop(child);
}

#[test]
fn kv_event_flags_without_an_endpoint_or_a_bad_endpoint_fail_clearly() {
    for (flags, code, why) in [
        (
            &["--kv-events-layout", "map"][..],
            2,
            "--kv-events-layout needs --kv-events-endpoint",
        ),
        (
            &["--kv-events-replay-endpoint", "tcp://127.0.0.1:0"][..],
            2,
            "--kv-events-replay-endpoint needs --kv-events-endpoint",
        ),
        (
            &["--kv-events-topic", "kv"][..],
            2,
            "--kv-events-topic needs --kv-events-endpoint",
        ),
        (
            &[
                "--kv-events-endpoint",
                "tcp://127.0.0.1:0",
                "--kv-events-layout",
                "json",
            ][..],
            2,
            "json",
        ),
        (
            &["--kv-events-endpoint", "not-an-endpoint"][..],
            1,
            "cannot publish KV events on not-an-endpoint",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
            .args(["serve", "--port", "0", "--name", "bad"])
            .args(flags)
            .output()
            .expect("run kvroute-sim serve");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{flags:?}: {err}");
        assert!(err.contains(why), "{flags:?}: {err}");
        assert!(out.stdout.is_empty(), "{flags:?} must not start serving");
    }
}
