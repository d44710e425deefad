//! Engine metrics scraping: every `scrape_interval` each pod's `http://<address>/metrics` is
//! fetched (HTTP/1.1 over one fresh connection, the whole exchange bounded by
//! `scrape_timeout`), parsed as vLLM's Prometheus text ([`parse`]) and handed to the core with
//! [`kvroute_core::Router::observe_engine`], so that `least-ttft` sees the engines' own queues.
//!
//! Each scrape is also the pod's active health check
//! ([`kvroute_core::Router::report_health_check`]): a 2xx answer passes (whatever the page
//! holds), no answer or any other status fails. With scraping off, `[health] check_interval_ms`
//! and `check_path` (default every second, `GET /health`) do the checking alone.
//!
//! Contract:
//! - Each address is fetched once per round: the engines of a data-parallel server
//!   ([`crate::data_parallel`]) share it, and each reads its own `engine="R"` series
//!   ([`parse_engine`]); the fetch's outcome is every one of its engines' active check.
//! - A pod whose scrape fails gets no snapshot; the core drops the last one after
//!   `ttft.snapshot_max_age_ms` and the pod keeps routing on the router's own counts.
//! - Every failure counts in `kvroute_engine_scrape_errors_total{pod}`; a warning is logged
//!   when a pod goes from healthy (or unknown) to failing, an info line when it recovers.
//! - The latest good snapshot of each pod is kept in [`crate::engines::EngineTable`] for the metrics export
//!   (`kvroute_engine_*`); removed pods are dropped from it.
//! - Interval and timeout are read from the current settings each round (reloads apply);
//!   interval 0 (`None`) turns scraping off and clears the table.
//! - The KV block size each engine reports ([`engine_block_tokens`]) is kept with its snapshot;
//!   while `[ttft] engine_block_tokens` is unset, the one size every reporting engine agrees
//!   on becomes it ([`Shared::adopt_engine_block`]); otherwise a size that differs is
//!   warned about, once per pod and value (or per set of differing sizes).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::engines::ScrapedEngine;
use crate::shared::Shared;

mod vllm_text;

pub use vllm_text::{engine_block_tokens, parse, parse_engine};

/// Largest `/metrics` body read.
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// How often the settings are re-read while scraping is off.
pub const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Why one scrape failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScrapeError {
    /// No answer within the timeout.
    #[error("timed out")]
    Timeout,
    /// The TCP connection failed.
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// The HTTP exchange failed.
    #[error("http: {0}")]
    Http(String),
    /// The answer was not 2xx.
    #[error("status {0}")]
    Status(u16),
    /// The body was not UTF-8 text.
    #[error("body is not UTF-8")]
    NotText,
    /// The text has neither `vllm:num_requests_running` nor `vllm:num_requests_waiting` (for
    /// the engine asked for).
    #[error("no vLLM engine metrics in the body")]
    NoEngineMetrics,
    /// The fetch, shared by the engines of one address, failed.
    #[error("{0}")]
    Shared(Arc<ScrapeError>),
}

/// GETs `http://<address>/metrics` and returns the body text, all within `timeout`.
pub async fn fetch(address: &str, timeout: Duration) -> Result<String, ScrapeError> {
    fetch_path(address, "/metrics", timeout).await
}

/// GETs `http://<address><path>` and returns the body text, all within `timeout`.
pub async fn fetch_path(
    address: &str,
    path: &str,
    timeout: Duration,
) -> Result<String, ScrapeError> {
    match tokio::time::timeout(timeout, fetch_inner(address, path)).await {
        Ok(r) => r,
        Err(_) => Err(ScrapeError::Timeout),
    }
}

async fn fetch_inner(address: &str, path: &str) -> Result<String, ScrapeError> {
    let http = |e: hyper::Error| ScrapeError::Http(e.to_string());
    let tcp = TcpStream::connect(address)
        .await
        .map_err(ScrapeError::Connect)?;
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(http)?;
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, address)
        .header(hyper::header::ACCEPT, "text/plain")
        .body(Empty::<Bytes>::new())
        .map_err(|e| ScrapeError::Http(e.to_string()))?;
    let work = async move {
        let resp = sender.send_request(request).await.map_err(http)?;
        if !resp.status().is_success() {
            return Err(ScrapeError::Status(resp.status().as_u16()));
        }
        let body = Limited::new(resp.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| ScrapeError::Http(e.to_string()))?
            .to_bytes();
        String::from_utf8(body.to_vec()).map_err(|_| ScrapeError::NotText)
    };
    // The connection is driven here, not in a task: when `work` finishes (or the timeout
    // drops this future) the connection is closed with it.
    tokio::pin!(work, conn);
    tokio::select! {
        biased;
        r = &mut work => r,
        c = &mut conn => match c {
            Err(e) => Err(http(e)),
            Ok(()) => work.await,
        },
    }
}

/// Scrapes until `stop` changes (see the module docs).
pub async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut memory = Memory::default();
    loop {
        let settings = shared.settings();
        let wait = match (settings.scrape_interval, &settings.health_check) {
            (None, None) => {
                shared.engines.lock().clear();
                IDLE_CHECK
            }
            (None, Some((interval, path))) => {
                shared.engines.lock().clear();
                check_round(&shared, path, settings.scrape_timeout).await;
                *interval
            }
            (Some(interval), _) => {
                round(&shared, settings.scrape_timeout, &mut memory).await;
                interval
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

/// A live pod as scraped.
struct LivePod {
    id: kvroute_core::PodId,
    name: String,
    address: String,
    /// Its engine rank behind a data-parallel server's address.
    rank: Option<u32>,
}

/// Every live pod.
fn live_pods(shared: &Shared) -> Vec<LivePod> {
    shared
        .router
        .lock()
        .pods()
        .into_iter()
        .map(|p| LivePod {
            id: p.id,
            name: p.name.to_string(),
            address: p.address.to_string(),
            rank: p.data_parallel_rank,
        })
        .collect()
}

/// `GET path` on each of the pods' addresses once, concurrently (the engines of a
/// data-parallel server share one); the results in the order of `pods`.
async fn fetch_each(
    pods: &[LivePod],
    path: &str,
    timeout: Duration,
) -> Vec<Result<Arc<str>, Arc<ScrapeError>>> {
    let mut addresses: Vec<&str> = pods.iter().map(|p| p.address.as_str()).collect();
    addresses.sort_unstable();
    addresses.dedup();
    let fetched = futures_util::future::join_all(addresses.iter().map(|addr| async move {
        fetch_path(addr, path, timeout)
            .await
            .map(Arc::from)
            .map_err(Arc::new)
    }))
    .await;
    let by_address: HashMap<&str, _> = addresses.into_iter().zip(fetched).collect();
    pods.iter()
        .map(|p| by_address[p.address.as_str()].clone())
        .collect()
}

/// Reports one active check of `pod` to the core and logs what it changed.
fn report_check(shared: &Shared, pod: &LivePod, passed: bool) {
    let now = shared.now();
    // A pod removed by a reload since the list was taken is simply refused.
    let event = shared
        .router
        .lock()
        .report_health_check(pod.id, passed, now);
    if let Ok(Some(event)) = event {
        crate::health::log_event(&pod.name, &pod.address, event, now.as_millis());
    }
}

/// `GET path` on every live pod once: the active checks when scraping is off.
async fn check_round(shared: &Shared, path: &str, timeout: Duration) {
    let pods = live_pods(shared);
    let results = fetch_each(&pods, path, timeout).await;
    for (pod, result) in pods.iter().zip(results) {
        report_check(shared, pod, result.is_ok());
    }
}

/// What the scraper remembers between rounds, for logging on change.
#[derive(Default)]
struct Memory {
    /// By pod name.
    pods: HashMap<String, Remembered>,
    /// The differing block sizes the engines reported, already warned about.
    disagreement: Option<BTreeSet<u32>>,
}

/// What the scraper remembers of one pod.
#[derive(Default)]
struct Remembered {
    /// Whether its last scrape failed.
    failing: bool,
    /// The block size it reported that differs from the router's, already warned about.
    warned_block: Option<u32>,
}

/// Scrapes every live pod once (an address once, whatever its engines).
async fn round(shared: &Shared, timeout: Duration, memory: &mut Memory) {
    let pods = live_pods(shared);
    let results = fetch_each(&pods, "/metrics", timeout).await;
    let now = shared.now();
    let mut good: Vec<(String, ScrapedEngine)> = Vec::with_capacity(pods.len());
    let seen = &mut memory.pods;
    seen.retain(|name, _| pods.iter().any(|p| &p.name == name));
    for (pod, text) in pods.iter().zip(results) {
        let (name, address) = (&pod.name, &pod.address);
        report_check(shared, pod, text.is_ok());
        shared.metrics.scraped(name);
        let remembered = seen.entry(name.clone()).or_default();
        let result = match text {
            Ok(text) => parse_engine(&text, pod.rank).map(|snapshot| ScrapedEngine {
                snapshot,
                block_tokens: engine_block_tokens(&text, pod.rank),
            }),
            Err(e) => Err(ScrapeError::Shared(e)),
        };
        match result {
            Ok(scraped) => {
                // A pod removed by a reload since the list was taken is simply refused.
                let _ = shared
                    .router
                    .lock()
                    .observe_engine(pod.id, scraped.snapshot, now);
                if remembered.failing {
                    tracing::info!(pod = %name, %address, "engine metrics scrape recovered");
                }
                remembered.failing = false;
                good.push((name.clone(), scraped));
            }
            Err(e) => {
                shared.metrics.scrape_error(name);
                if !remembered.failing {
                    tracing::warn!(pod = %name, %address, error = %e, "engine metrics scrape failed; routing on router-side counts (logged again only after a recovery)");
                }
                remembered.failing = true;
            }
        }
    }
    engine_blocks(shared, &good, memory);
    // Not nested in the router lock (the metrics collector takes them one after the other).
    let mut table = shared.engines.lock();
    table.clear();
    table.extend(good);
}

/// What the engines' reported block sizes change: while the configuration leaves
/// `[ttft] engine_block_tokens` unset, the size they all report is taken
/// ([`Shared::adopt_engine_block`]), and sizes that differ are warned about (the value in force
/// stays); when it is set, each pod reporting another size is warned about.
fn engine_blocks(shared: &Shared, scraped: &[(String, ScrapedEngine)], memory: &mut Memory) {
    let config = shared.config();
    let in_force = config.router.ttft.engine_block_tokens;
    if !config.engine_block_from_engines {
        for (name, s) in scraped {
            if let Some(pod) = memory.pods.get_mut(name) {
                warn_block_mismatch(name, s.block_tokens, in_force, pod);
            }
        }
        return;
    }
    let reported: BTreeSet<u32> = scraped.iter().filter_map(|(_, s)| s.block_tokens).collect();
    if reported.len() > 1 {
        if memory.disagreement.as_ref() != Some(&reported) {
            tracing::warn!(
                reported = ?reported,
                engine_block_tokens = in_force,
                "the engines report different KV block sizes (vllm:cache_config_info block_size); least-ttft keeps engine_block_tokens: set [ttft] engine_block_tokens"
            );
        }
        memory.disagreement = Some(reported);
        return;
    }
    memory.disagreement = None;
    let Some(&block) = reported.first() else {
        return;
    };
    match shared.adopt_engine_block(block) {
        Ok(true) => tracing::info!(
            engine_block_tokens = block,
            was = in_force,
            "least-ttft takes the engines' KV block size (vllm:cache_config_info block_size) as engine_block_tokens"
        ),
        Ok(false) => {}
        Err(e) => tracing::warn!(engine_block_tokens = block, error = %e, "the engines' KV block size was not taken"),
    }
}

/// Warns once per pod and reported value when the engine's KV block size differs from the
/// router's `[ttft] engine_block_tokens` (least-ttft then counts reuse in blocks the engine
/// does not have: a value too small credits partial blocks the engine recomputes).
fn warn_block_mismatch(name: &str, reported: Option<u32>, router: u32, pod: &mut Remembered) {
    let mismatch = reported.filter(|&b| b != router);
    if mismatch.is_some() && mismatch != pod.warned_block {
        tracing::warn!(
            pod = %name,
            engine_block_tokens = mismatch,
            router_engine_block_tokens = router,
            "the engine reports a KV block size (vllm:cache_config_info block_size) other than [ttft] engine_block_tokens; set engine_block_tokens to the engine's"
        );
    }
    pod.warned_block = mismatch;
}

#[cfg(test)]
mod tests {
    use kvroute_core::EngineSnapshot;

    use super::vllm_text::VLLM;
    use super::*;

    #[test]
    fn a_block_size_mismatch_is_warned_once_per_value() {
        let mut memory = Remembered::default();
        warn_block_mismatch("a", Some(16), 16, &mut memory);
        assert_eq!(memory.warned_block, None, "agrees: nothing to warn");
        warn_block_mismatch("a", Some(1568), 16, &mut memory);
        assert_eq!(memory.warned_block, Some(1568));
        warn_block_mismatch("a", None, 16, &mut memory);
        assert_eq!(memory.warned_block, None, "no longer reported: forgotten");
    }

    #[test]
    fn the_engines_block_size_is_taken_when_they_agree() {
        let toml = "[models.m]\npods = [{ name = \"a\", address = \"127.0.0.1:1\" }, { name = \"b\", address = \"127.0.0.1:2\" }]";
        let shared = Shared::new(
            &crate::config::from_toml(toml),
            &mut prometheus_client::registry::Registry::default(),
        )
        .unwrap();
        let in_force = || shared.router.lock().config().ttft.engine_block_tokens;
        let scraped = |a: Option<u32>, b: Option<u32>| {
            [("a", a), ("b", b)].map(|(name, block_tokens)| {
                let s = ScrapedEngine {
                    snapshot: EngineSnapshot::default(),
                    block_tokens,
                };
                (name.to_owned(), s)
            })
        };
        let mut memory = Memory::default();
        engine_blocks(&shared, &scraped(None, None), &mut memory);
        assert_eq!(in_force(), 16, "nothing reported");
        engine_blocks(&shared, &scraped(Some(1568), Some(32)), &mut memory);
        assert_eq!(in_force(), 16, "disagreeing engines change nothing");
        assert_eq!(memory.disagreement, Some(BTreeSet::from([32, 1568])));
        engine_blocks(&shared, &scraped(Some(1568), None), &mut memory);
        assert_eq!(in_force(), 1568, "the one size reported");
        assert_eq!(memory.disagreement, None);
    }

    #[test]
    fn snapshots_and_errors_are_exported_per_pod() {
        use crate::config::{build, parse_toml, Overrides};
        use crate::env::EnvSnapshot;
        let text = "[models.m]\npods = [{ name = \"a\", address = \"127.0.0.1:1\" }]";
        let c = build(
            parse_toml(text, std::path::Path::new("t")).unwrap(),
            &EnvSnapshot::default(),
            &Overrides::default(),
            0,
        )
        .unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        let sh = Shared::new(&c, &mut registry).unwrap();
        let scraped = ScrapedEngine {
            snapshot: parse(VLLM).unwrap(),
            block_tokens: engine_block_tokens(VLLM, None),
        };
        sh.engines.lock().insert("a".into(), scraped);
        sh.metrics.scrape_error("a");
        let out = crate::metrics::render(&registry);
        for line in [
            "kvroute_engine_prefix_cache_hits_total{pod=\"a\"} 600",
            "kvroute_engine_prefix_cache_queries_total{pod=\"a\"} 1500",
            "kvroute_engine_requests_running{pod=\"a\"} 5",
            "kvroute_engine_requests_waiting{pod=\"a\"} 4",
            "kvroute_prefix_predicted_hit_tokens_total{pod=\"a\"} 0",
            "kvroute_engine_scrape_errors_total{pod=\"a\"} 1",
            "kvroute_engine_block_tokens{pod=\"a\"} 1568",
            "kvroute_ttft_engine_block_tokens 16",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in\n{out}");
        }
    }

    #[test]
    fn fetch_reads_a_metrics_page_and_fails_cleanly() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap().to_string();
            let server = tokio::spawn(async move {
                // 1st connection: a page; 2nd: 500; 3rd: accepted but never answered.
                let mut held = Vec::new();
                for reply in [
                    "HTTP/1.1 200 OK\r\ncontent-length: 27\r\n\r\nvllm:num_requests_running 1",
                    "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n",
                    "",
                ] {
                    let (mut s, _) = l.accept().await.unwrap();
                    let mut buf = [0u8; 1024];
                    let _ = s.read(&mut buf).await;
                    if reply.is_empty() {
                        held.push(s);
                    } else {
                        s.write_all(reply.as_bytes()).await.unwrap();
                    }
                }
                held
            });
            let t = Duration::from_millis(300);
            let text = fetch(&addr, t).await.unwrap();
            assert_eq!(parse(&text).unwrap().running, 1);
            assert!(matches!(
                fetch(&addr, t).await,
                Err(ScrapeError::Status(500))
            ));
            assert!(matches!(fetch(&addr, t).await, Err(ScrapeError::Timeout)));
            drop(server.await.unwrap());
            assert!(matches!(
                fetch(&addr, t).await,
                Err(ScrapeError::Connect(_))
            ));
        });
    }
}
