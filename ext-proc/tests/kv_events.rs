//! The KV-event subscriber against real ZMQ publishers on loopback (kvroute-kv-events'
//! `Publisher`, which speaks vLLM's wire and replay protocol): views built from the events,
//! gaps repaired by replay or left stale, silence suspending a view, a dead publisher dropping
//! it, and all of it in `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use kvroute_core::{
    BlockExtras, Completion, MatchView, Outcome, PodId, PromptTokens, RouteRequest, Strategy,
    StrategySpec,
};
use kvroute_ext_proc::config::{build, parse_toml, Overrides};
use kvroute_ext_proc::env::EnvSnapshot;
use kvroute_ext_proc::kv_events::{self, KvEventsStatus};
use kvroute_ext_proc::shared::Shared;
use kvroute_kv_events::wire::{BlockHash, BlockStored, EventBatch, KvEvent, Layout};
use kvroute_kv_events::{encode, Publisher, PublisherConfig};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

const BS: u32 = 16;

async fn publisher(replay: bool) -> Publisher {
    let mut c = PublisherConfig::new("tcp://127.0.0.1:0");
    if replay {
        c.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    }
    Publisher::bind(c).await.unwrap()
}

fn pod_line(name: &str, p: &Publisher) -> String {
    let replay = p
        .replay_endpoint()
        .map(|r| format!(", kv_events_replay_endpoint = \"{r}\""))
        .unwrap_or_default();
    format!(
        "{{ name = \"{name}\", address = \"127.0.0.1:1\", kv_events_endpoint = \"{}\"{replay} }}",
        p.endpoint()
    )
}

struct Fixture {
    shared: Arc<Shared>,
    registry: Registry,
    _stop: watch::Sender<bool>,
}

fn start(pods: &[String], silence_ms: u64) -> Fixture {
    let tokenizer = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tokenizer");
    let text = format!(
        "[routing]\ndefault_strategy = \"prefix-cache\"\n\
         [models.m]\npods = [{}]\n\
         [tokenizers.m]\npath = {:?}\n\
         [kv_events.m]\nendpoint = \"tcp://{{host}}:5557\"\nsilence_ms = {silence_ms}\nconnect_timeout_ms = 500\nreplay_timeout_ms = 1000\n",
        pods.join(", "),
        tokenizer
    );
    let config = build(
        parse_toml(&text, std::path::Path::new("t.toml")).unwrap(),
        &EnvSnapshot::default(),
        &Overrides::default(),
        7,
    )
    .unwrap();
    let mut registry = Registry::default();
    let shared = Shared::new(&config, &mut registry).unwrap();
    let status = KvEventsStatus::default();
    status.register(&mut registry, shared.router.clone());
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(kv_events::run(shared.clone(), status, stop_rx));
    Fixture {
        shared,
        registry,
        _stop: stop,
    }
}

impl Fixture {
    fn pod(&self, name: &str) -> PodId {
        let r = self.shared.router.lock();
        r.pods().iter().find(|p| &*p.name == name).unwrap().id
    }

    fn metrics(&self) -> String {
        kvroute_ext_proc::metrics::render(&self.registry)
    }

    fn has(&self, line: &str) -> bool {
        self.metrics().lines().any(|l| l == line)
    }

    /// Waits (bounded) until `cond` holds.
    async fn until(&self, what: &str, cond: impl Fn(&Fixture) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !cond(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}\n{}",
                self.metrics()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The value of the series `series` (name and labels), 0 when absent.
    fn value(&self, series: &str) -> u64 {
        let prefix = format!("{series} ");
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    }

    fn blocks(&self, pod: &str) -> Option<u64> {
        let id = self.pod(pod);
        self.shared.router.lock().kv_view(id).map(|v| v.blocks)
    }

    /// Routes a token prompt; the pod's name and the view its match came from.
    fn route(&self, tokens: &[u32]) -> (String, MatchView) {
        let mut r = self.shared.router.lock();
        let keys = r
            .token_key_config(BS)
            .unwrap()
            .keys(tokens, BlockExtras::default());
        let size = PromptTokens {
            prompt_tokens: tokens.len() as u32,
            block_tokens: BS,
        };
        let now = self.shared.now();
        let strategy = StrategySpec::from(Strategy::PrefixCache);
        let d = r
            .route(
                RouteRequest::new("m", &keys)
                    .with_tokens(size)
                    .with_strategy(&strategy),
                now,
            )
            .unwrap();
        r.complete(d.ticket, Completion::new(Outcome::Success), now)
            .unwrap();
        (d.pod_name.to_string(), d.view)
    }
}

fn prompt(family: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * BS).map(|i| family * 1000 + i).collect()
}

/// `BlockStored` of `tokens`' blocks, hashes `base..`, chained after `parent`.
fn stored(tokens: &[u32], base: u64, parent: Option<u64>) -> KvEvent {
    let n = tokens.len() as u64 / u64::from(BS);
    KvEvent::BlockStored(BlockStored {
        block_hashes: (base..base + n).map(BlockHash::from).collect(),
        parent_block_hash: parent.map(BlockHash::from),
        token_ids: tokens.to_vec(),
        block_size: BS,
        medium: Some("GPU".into()),
        ..Default::default()
    })
}

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch::new(1.0, events)
}

/// Publishes empty batches until the subscriber has received one (ZMQ's slow joiner: what is
/// sent before the subscription reaches the publisher is lost; the replay covers it).
async fn join(f: &Fixture, p: &mut Publisher, pod: &str) {
    let line = format!("kvroute_kv_events_batches_total{{pod=\"{pod}\"}} 0");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        p.publish_batch(&batch(vec![]), Layout::Map).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let m = f.metrics();
        if m.contains(&format!("kvroute_kv_events_batches_total{{pod=\"{pod}\"}}"))
            && !m.contains(&line)
        {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "never joined\n{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_follow_the_events_and_gaps_are_replayed_or_made_stale() {
    let mut a = publisher(true).await;
    let mut b = publisher(false).await;
    let f = start(&[pod_line("a", &a), pod_line("b", &b)], 60_000);
    join(&f, &mut a, "a").await;
    f.until("a's view complete", |f| {
        f.has("kvroute_kv_view_state{pod=\"a\",state=\"engine\"} 1")
    })
    .await;

    // a's engine holds family 1: prefix-cache follows the engine, and says so.
    let p1 = prompt(1, 4);
    a.publish_batch(&batch(vec![stored(&p1, 100, None)]), Layout::Positional)
        .await
        .unwrap();
    f.until("a's 4 blocks", |f| f.blocks("a") == Some(4)).await;
    assert_eq!(f.route(&p1), ("a".to_owned(), MatchView::Engine));

    // A lost batch (family 2's first half), then the next: replayed, nothing missing.
    let p2 = prompt(2, 4);
    let seen = "kvroute_kv_events_gaps_total{pod=\"a\",what=\"seen\"}";
    let replayed = "kvroute_kv_events_gaps_total{pod=\"a\",what=\"replayed\"}";
    let (seen0, replayed0) = (f.value(seen), f.value(replayed));
    a.record_only(encode(
        &batch(vec![stored(&p2[..32], 200, None)]),
        Layout::Map,
    ));
    a.publish_batch(
        &batch(vec![stored(&p2[32..], 202, Some(201))]),
        Layout::MapBatch,
    )
    .await
    .unwrap();
    f.until("the gap replayed", |f| f.blocks("a") == Some(8))
        .await;
    assert_eq!(
        (f.value(seen), f.value(replayed)),
        (seen0 + 1, replayed0 + 1)
    );
    assert_eq!(
        f.value("kvroute_kv_events_gaps_total{pod=\"a\",what=\"accepted\"}"),
        0
    );
    assert_eq!(f.route(&p2), ("a".to_owned(), MatchView::Engine));
    assert!(f.has("kvroute_kv_view_state{pod=\"a\",state=\"engine\"} 1"));

    // b has no replay endpoint: joining late (or any gap) leaves a stale view, not used.
    b.record_only(encode(&batch(vec![]), Layout::Map));
    join(&f, &mut b, "b").await;
    f.until("b stale", |f| {
        f.has("kvroute_kv_view_state{pod=\"b\",state=\"stale\"} 1")
    })
    .await;
    assert!(f.has("kvroute_kv_events_gaps_total{pod=\"b\",what=\"accepted\"} 1"));
    // ... until its engine clears its cache.
    b.publish_batch(&batch(vec![KvEvent::AllBlocksCleared]), Layout::Map)
        .await
        .unwrap();
    f.until("b complete again", |f| {
        f.has("kvroute_kv_view_state{pod=\"b\",state=\"engine\"} 1")
    })
    .await;
    assert!(f.has("kvroute_kv_events_connected{pod=\"a\"} 1"));
    assert!(f.has("kvroute_kv_view_blocks{pod=\"a\"} 8"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_suspends_a_view_and_a_dead_publisher_loses_it() {
    let mut a = publisher(true).await;
    let f = start(&[pod_line("a", &a)], 400);
    join(&f, &mut a, "a").await;
    let p1 = prompt(1, 2);
    a.publish_batch(&batch(vec![stored(&p1, 1, None)]), Layout::Map)
        .await
        .unwrap();
    f.until("a's blocks", |f| f.blocks("a") == Some(2)).await;

    // A request whose prompt the engine holds makes it store nothing: no suspicion.
    assert_eq!(f.route(&p1).1, MatchView::Engine);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(f.has("kvroute_kv_view_state{pod=\"a\",state=\"engine\"} 1"));
    // One with new blocks and nothing comes back: suspended (kept), the index answers.
    f.route(&prompt(2, 2));
    f.until("suspended", |f| {
        f.has("kvroute_kv_view_state{pod=\"a\",state=\"suspended\"} 1")
    })
    .await;
    assert_eq!(f.route(&p1).1, MatchView::Index);
    // The next batch resumes it, with what it held.
    a.publish_batch(&batch(vec![]), Layout::Map).await.unwrap();
    f.until("resumed", |f| {
        f.has("kvroute_kv_view_state{pod=\"a\",state=\"engine\"} 1")
    })
    .await;
    assert_eq!(f.blocks("a"), Some(2));

    // The publisher goes away: after silence_ms the view is dropped.
    drop(a);
    f.until("dropped", |f| {
        f.has("kvroute_kv_view_state{pod=\"a\",state=\"none\"} 1")
    })
    .await;
    f.until("disconnected", |f| {
        f.has("kvroute_kv_events_connected{pod=\"a\"} 0")
    })
    .await;
}

#[test]
fn bad_sections_are_config_errors() {
    let tokenizer = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tokenizer");
    let load = |extra: &str, pod: &str| {
        let text = format!(
            "[models.m]\npods = [{{ name = \"a\", address = \"127.0.0.1:1\"{pod} }}]\n{extra}"
        );
        build(
            parse_toml(&text, std::path::Path::new("t.toml")).unwrap(),
            &EnvSnapshot::default(),
            &Overrides::default(),
            7,
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    let tok = format!("[tokenizers.m]\npath = {tokenizer:?}\n");
    let ok = format!("{tok}[kv_events.m]\nendpoint = \"tcp://{{host}}:5557\"\n");
    assert_eq!(load(&ok, ""), Ok(()));
    for (extra, pod, want) in [
        (
            "[kv_events.m]\nendpoint = \"tcp://{host}:5557\"\n".to_owned(),
            "",
            "needs [tokenizers.\"m\"]",
        ),
        (
            format!("{tok}[kv_events.x]\nendpoint = \"tcp://{{host}}:5557\"\n"),
            "",
            "not a configured model",
        ),
        (
            format!("{tok}[kv_events.m]\nendpoint = \"ipc:///tmp/x\"\n"),
            "",
            "must start with tcp://",
        ),
        (
            tok.clone(),
            ", kv_events_endpoint = \"tcp://127.0.0.1:9\"",
            "has no [kv_events.\"m\"] section",
        ),
        (
            ok.clone(),
            ", kv_events_replay_endpoint = \"tcp://127.0.0.1:9\"",
            "without kv_events_endpoint",
        ),
    ] {
        let e = load(&extra, pod).unwrap_err();
        assert!(e.contains(want), "{e} (wanted {want})");
    }
}
