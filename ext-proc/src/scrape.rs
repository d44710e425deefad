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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use kvroute_core::EngineSnapshot;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::shared::Shared;

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

/// The vLLM series read (gauges, counters, histogram sums and counts), each summed over its
/// label sets (the KV usage ratio: the largest), before conversion.
#[derive(Default)]
struct Sums {
    kv_usage: Option<f64>,
    running: Option<f64>,
    waiting: Option<f64>,
    queries: Option<f64>,
    hits: Option<f64>,
    prefill_sum: Option<f64>,
    prefill_count: Option<f64>,
    tpot_sum: Option<f64>,
    tpot_count: Option<f64>,
    itl_sum: Option<f64>,
    itl_count: Option<f64>,
    queue_sum: Option<f64>,
    queue_count: Option<f64>,
    decode_sum: Option<f64>,
    decode_count: Option<f64>,
    prompt_sum: Option<f64>,
    prompt_count: Option<f64>,
    generation_sum: Option<f64>,
    generation_count: Option<f64>,
}

fn add(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.unwrap_or(0.0) + v);
}

fn largest(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.map_or(v, |s| s.max(v)));
}

/// One sample line: its metric name, its `engine` label (vLLM's engine index), and value.
struct Sample<'a> {
    name: &'a str,
    engine: Option<&'a str>,
    value: f64,
}

/// Splits one sample line into its metric name, `engine` label and value; `None` for
/// comments, blank lines and lines that do not parse. Other labels (with quoted, escaped
/// values) are skipped.
fn sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut engine = None;
    if let Some(labels) = rest.strip_prefix('{') {
        // label="value" pairs up to the closing brace outside quotes.
        let mut key_start = 0;
        let mut value_start = None;
        let mut escaped = false;
        let mut close = None;
        for (i, c) in labels.char_indices() {
            match (c, value_start) {
                (_, Some(_)) if escaped => escaped = false,
                ('\\', Some(_)) => escaped = true,
                ('"', Some(start)) => {
                    let key = labels[key_start..start].trim_start_matches([',', ' ']);
                    if key.trim_end().strip_suffix('=').map(str::trim) == Some("engine") {
                        engine = Some(&labels[start + 1..i]);
                    }
                    value_start = None;
                    key_start = i + 1;
                }
                ('"', None) => value_start = Some(i),
                ('}', None) => {
                    close = Some(i);
                    break;
                }
                _ => {}
            }
        }
        rest = &labels[close? + 1..];
    }
    let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
    value.is_finite().then_some(Sample {
        name,
        engine,
        value,
    })
}

/// Parses vLLM's Prometheus text into a snapshot: `vllm:num_requests_running`,
/// `vllm:num_requests_waiting`, `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits`, and the
/// timing histograms `vllm:request_prefill_time_seconds` and `vllm:inter_token_latency_seconds`
/// (or the older `vllm:time_per_output_token_seconds`), read as their `_sum` and `_count` series,
/// from which the core learns the pod's prefill rate and TPOT; and the per-request histograms
/// `vllm:request_queue_time_seconds`, `vllm:request_decode_time_seconds`,
/// `vllm:request_prompt_tokens` and `vllm:request_generation_tokens` (`_sum` and `_count`; token
/// sums rounded to whole tokens), which `least-latency` and `throughput` read. Each is a count or
/// a cumulative total, summed over its label sets (several models or engines behind one address);
/// counters are accepted with or without the `_total` suffix (`_created` series are ignored). The
/// KV-cache usage ratio (`vllm:kv_cache_usage_perc`, or `vllm:gpu_cache_usage_perc` from older
/// vLLM) is the largest over label sets (a ratio does not add up; the fullest engine is the one a
/// request may wait on), clamped to [0, 1]. Missing metrics stay `None` (running and waiting: 0),
/// but a text with neither running nor waiting is not an engine's:
/// [`ScrapeError::NoEngineMetrics`]. Negative values count as 0.
pub fn parse(text: &str) -> Result<EngineSnapshot, ScrapeError> {
    parse_engine(text, None)
}

/// As [`parse`], counting only the series labelled `engine="RANK"` when `rank` is given: one
/// engine of a data-parallel server ([`crate::data_parallel`]). A text with no running or
/// waiting series for that engine is [`ScrapeError::NoEngineMetrics`].
pub fn parse_engine(text: &str, rank: Option<u32>) -> Result<EngineSnapshot, ScrapeError> {
    let rank = rank.map(|r| r.to_string());
    let mut s = Sums::default();
    let samples = text
        .lines()
        .filter_map(sample)
        .filter(|x| rank.is_none() || x.engine == rank.as_deref());
    for Sample { name, value: v, .. } in samples {
        let Some(short) = name.strip_prefix("vllm:") else {
            continue;
        };
        let short = short.strip_suffix("_total").unwrap_or(short);
        match short {
            "num_requests_running" => add(&mut s.running, v),
            "num_requests_waiting" => add(&mut s.waiting, v),
            "kv_cache_usage_perc" | "gpu_cache_usage_perc" => largest(&mut s.kv_usage, v),
            "prefix_cache_queries" => add(&mut s.queries, v),
            "prefix_cache_hits" => add(&mut s.hits, v),
            "request_prefill_time_seconds_sum" => add(&mut s.prefill_sum, v),
            "request_prefill_time_seconds_count" => add(&mut s.prefill_count, v),
            "time_per_output_token_seconds_sum" => add(&mut s.tpot_sum, v),
            "time_per_output_token_seconds_count" => add(&mut s.tpot_count, v),
            "inter_token_latency_seconds_sum" => add(&mut s.itl_sum, v),
            "inter_token_latency_seconds_count" => add(&mut s.itl_count, v),
            "request_queue_time_seconds_sum" => add(&mut s.queue_sum, v),
            "request_queue_time_seconds_count" => add(&mut s.queue_count, v),
            "request_decode_time_seconds_sum" => add(&mut s.decode_sum, v),
            "request_decode_time_seconds_count" => add(&mut s.decode_count, v),
            "request_prompt_tokens_sum" => add(&mut s.prompt_sum, v),
            "request_prompt_tokens_count" => add(&mut s.prompt_count, v),
            "request_generation_tokens_sum" => add(&mut s.generation_sum, v),
            "request_generation_tokens_count" => add(&mut s.generation_count, v),
            _ => {}
        }
    }
    if s.running.is_none() && s.waiting.is_none() {
        return Err(ScrapeError::NoEngineMetrics);
    }
    // `as` saturates: negative → 0, huge → MAX; the values were checked finite.
    let count = |v: Option<f64>| v.map_or(0, |v| v.round().max(0.0) as u32);
    let total = |v: Option<f64>| v.map(|v| v.round().max(0.0) as u64);
    let seconds = |v: Option<f64>| v.map(|v| v.max(0.0));
    // vLLM renamed the inter-token histogram; when both are exported they count the same gaps.
    let (gap_sum, gaps) = match (s.itl_sum, s.itl_count) {
        (Some(sum), Some(n)) => (Some(sum), Some(n)),
        _ => (s.tpot_sum, s.tpot_count),
    };
    Ok(EngineSnapshot {
        running: count(s.running),
        waiting: count(s.waiting),
        kv_usage: s.kv_usage.map(|v| v.clamp(0.0, 1.0)),
        prefix_queries: total(s.queries),
        prefix_hits: total(s.hits),
        prefill_seconds: seconds(s.prefill_sum),
        prefills: total(s.prefill_count),
        inter_token_seconds: seconds(gap_sum),
        inter_tokens: total(gaps),
        queue_seconds: seconds(s.queue_sum),
        queue_requests: total(s.queue_count),
        decode_seconds: seconds(s.decode_sum),
        decode_requests: total(s.decode_count),
        request_prompt_tokens: total(s.prompt_sum),
        prompt_requests: total(s.prompt_count),
        request_generation_tokens: total(s.generation_sum),
        generation_requests: total(s.generation_count),
    })
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
    // Pod name → whether its last scrape failed (for log-on-change).
    let mut failing: HashMap<String, bool> = HashMap::new();
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
                round(&shared, settings.scrape_timeout, &mut failing).await;
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

/// Scrapes every live pod once (an address once, whatever its engines).
async fn round(shared: &Shared, timeout: Duration, failing: &mut HashMap<String, bool>) {
    let pods = live_pods(shared);
    let results = fetch_each(&pods, "/metrics", timeout).await;
    let now = shared.now();
    let mut good: Vec<(String, EngineSnapshot)> = Vec::with_capacity(pods.len());
    failing.retain(|name, _| pods.iter().any(|p| &p.name == name));
    for (pod, text) in pods.iter().zip(results) {
        let (name, address) = (&pod.name, &pod.address);
        report_check(shared, pod, text.is_ok());
        shared.metrics.scraped(name);
        let was_failing = failing.get(name).copied();
        let result = match text {
            Ok(text) => parse_engine(&text, pod.rank),
            Err(e) => Err(ScrapeError::Shared(e)),
        };
        match result {
            Ok(snapshot) => {
                // A pod removed by a reload since the list was taken is simply refused.
                let _ = shared.router.lock().observe_engine(pod.id, snapshot, now);
                good.push((name.clone(), snapshot));
                if was_failing == Some(true) {
                    tracing::info!(pod = %name, %address, "engine metrics scrape recovered");
                }
                failing.insert(name.clone(), false);
            }
            Err(e) => {
                shared.metrics.scrape_error(name);
                if was_failing != Some(true) {
                    tracing::warn!(pod = %name, %address, error = %e, "engine metrics scrape failed; routing on router-side counts (logged again only after a recovery)");
                }
                failing.insert(name.clone(), true);
            }
        }
    }
    // Not nested in the router lock (the metrics collector takes them one after the other).
    let mut table = shared.engines.lock();
    table.clear();
    table.extend(good);
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m, \"quoted\" }"} 4 1700000000000
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 1.5e3
vllm:prefix_cache_queries_created{model_name="m"} 1.7e9
vllm:prefix_cache_hits{model_name="m"} 600
vllm:request_success_total{model_name="m",finished_reason="stop"} 9
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{le="0.3",model_name="m"} 4
vllm:request_prefill_time_seconds_bucket{le="+Inf",model_name="m"} 9
vllm:request_prefill_time_seconds_sum{model_name="m"} 12.5
vllm:request_prefill_time_seconds_count{model_name="m"} 9
vllm:time_per_output_token_seconds_sum{model_name="m"} 31.0
vllm:time_per_output_token_seconds_count{model_name="m"} 1001
vllm:inter_token_latency_seconds_sum{model_name="m"} 30.0
vllm:inter_token_latency_seconds_count{model_name="m"} 1000
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 5.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 6.0
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 6.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 1.25
vllm:request_queue_time_seconds_bucket{engine="1",le="0.3",model_name="m"} 3.0
vllm:request_queue_time_seconds_bucket{engine="1",le="+Inf",model_name="m"} 3.0
vllm:request_queue_time_seconds_count{engine="1",model_name="m"} 3.0
vllm:request_queue_time_seconds_sum{engine="1",model_name="m"} 0.25
# HELP vllm:request_queue_time_seconds_created Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds_created gauge
vllm:request_queue_time_seconds_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:request_decode_time_seconds Histogram of time spent in DECODE phase for request.
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 6.0
vllm:request_decode_time_seconds_count{engine="0",model_name="m"} 6.0
vllm:request_decode_time_seconds_sum{engine="0",model_name="m"} 20.5
vllm:request_decode_time_seconds_count{engine="1",model_name="m"} 3.0
vllm:request_decode_time_seconds_sum{engine="1",model_name="m"} 9.5
# HELP vllm:request_prompt_tokens Number of prefill tokens processed.
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{engine="0",le="1.0",model_name="m"} 0.0
vllm:request_prompt_tokens_bucket{engine="0",le="2000.0",model_name="m"} 6.0
vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="m"} 6.0
vllm:request_prompt_tokens_count{engine="0",model_name="m"} 6.0
vllm:request_prompt_tokens_sum{engine="0",model_name="m"} 1000.0
vllm:request_prompt_tokens_count{engine="1",model_name="m"} 3.0
vllm:request_prompt_tokens_sum{engine="1",model_name="m"} 500.0
# HELP vllm:request_generation_tokens Number of generation tokens processed.
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{engine="0",le="+Inf",model_name="m"} 6.0
vllm:request_generation_tokens_count{engine="0",model_name="m"} 6.0
vllm:request_generation_tokens_sum{engine="0",model_name="m"} 600.0
vllm:request_generation_tokens_count{engine="1",model_name="m"} 3.0
vllm:request_generation_tokens_sum{engine="1",model_name="m"} 409.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 900.0
vllm:generation_tokens_total{engine="0",model_name="m"} 1009.0
python_gc_objects_collected_total{generation="0"} 77
"#;

    #[test]
    fn vllm_text_is_summed_over_label_sets() {
        let s = parse(VLLM).unwrap();
        assert_eq!(
            s,
            EngineSnapshot {
                running: 5,
                waiting: 4,
                kv_usage: Some(0.5),
                prefix_queries: Some(1500),
                prefix_hits: Some(600),
                prefill_seconds: Some(12.5),
                prefills: Some(9),
                inter_token_seconds: Some(30.0),
                inter_tokens: Some(1000),
                queue_seconds: Some(1.5),
                queue_requests: Some(9),
                decode_seconds: Some(30.0),
                decode_requests: Some(9),
                request_prompt_tokens: Some(1500),
                prompt_requests: Some(9),
                request_generation_tokens: Some(1009),
                generation_requests: Some(9),
            }
        );
    }

    #[test]
    fn one_engine_of_a_data_parallel_server_reads_its_own_series() {
        // Engine 1's series only; the unlabelled ones belong to no engine.
        let s = parse_engine(VLLM, Some(1)).unwrap();
        assert_eq!(
            (s.running, s.waiting, s.kv_usage, s.prefix_queries),
            (2, 0, Some(0.5), None)
        );
        assert_eq!(
            (s.queue_seconds, s.queue_requests, s.decode_requests),
            (Some(0.25), Some(3), Some(3))
        );
        assert_eq!(
            (s.request_prompt_tokens, s.prompt_requests),
            (Some(500), Some(3))
        );
        let s = parse_engine(VLLM, Some(0)).unwrap();
        assert_eq!(
            (s.running, s.kv_usage, s.queue_requests),
            (3, Some(0.25), Some(6))
        );
        assert!(matches!(
            parse_engine(VLLM, Some(2)),
            Err(ScrapeError::NoEngineMetrics)
        ));
        // The label is found wherever it stands, after quoted and escaped values; a label
        // merely ending in "engine" is another label.
        let text = "vllm:num_requests_running{model_name=\"a,\\\"engine=\\\"1\",engine=\"1\"} 7\n\
                    vllm:num_requests_running{my_engine=\"1\", engine = \"0\"} 5\n";
        assert_eq!(parse_engine(text, Some(1)).unwrap().running, 7);
        assert_eq!(parse_engine(text, Some(0)).unwrap().running, 5);
    }

    #[test]
    fn missing_and_odd_values_are_tolerated() {
        let s = parse("vllm:num_requests_waiting 2\nvllm:gpu_cache_usage_perc 7\n").unwrap();
        assert_eq!((s.running, s.waiting, s.kv_usage), (0, 2, Some(1.0)));
        assert_eq!((s.prefix_queries, s.prefix_hits), (None, None));
        assert_eq!(
            s,
            EngineSnapshot {
                waiting: 2,
                kv_usage: Some(1.0),
                ..EngineSnapshot::default()
            },
            "every series missing is None"
        );
        // A histogram's halves are read on their own; negative values count as 0.
        let s = parse(
            "vllm:num_requests_running 1\nvllm:request_queue_time_seconds_sum -2\nvllm:request_decode_time_seconds_count 4\nvllm:request_prompt_tokens_sum 7.6\n",
        )
        .unwrap();
        assert_eq!(
            (
                s.queue_seconds,
                s.queue_requests,
                s.decode_seconds,
                s.decode_requests
            ),
            (Some(0.0), None, None, Some(4))
        );
        assert_eq!(
            (s.request_prompt_tokens, s.prompt_requests),
            (Some(8), None)
        );
        let s = parse("vllm:num_requests_running -3\nvllm:num_requests_waiting NaN\nvllm:num_requests_waiting{a=\"x\"} 1e12\ngarbage line\n{}\nvllm:num_requests_running{unclosed=\"} 4\n").unwrap();
        assert_eq!((s.running, s.waiting), (0, u32::MAX));
        for text in ["", "# only comments\n", "up 1\n", "\u{0}\u{1}"] {
            assert!(
                matches!(parse(text), Err(ScrapeError::NoEngineMetrics)),
                "{text:?}"
            );
        }
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
        sh.engines.lock().insert("a".into(), parse(VLLM).unwrap());
        sh.metrics.scrape_error("a");
        let out = crate::metrics::render(&registry);
        for line in [
            "kvroute_engine_prefix_cache_hits_total{pod=\"a\"} 600",
            "kvroute_engine_prefix_cache_queries_total{pod=\"a\"} 1500",
            "kvroute_engine_requests_running{pod=\"a\"} 5",
            "kvroute_engine_requests_waiting{pod=\"a\"} 4",
            "kvroute_prefix_predicted_hit_tokens_total{pod=\"a\"} 0",
            "kvroute_engine_scrape_errors_total{pod=\"a\"} 1",
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
