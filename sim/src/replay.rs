//! The study-shaped load client for a live endpoint (a gateway or one fake server).
//!
//! ## Contract
//! - Sends the scenario's planned arrivals as streaming `/v1/completions` requests (model
//!   `study` by default, `stream: true`, `stream_options.include_usage: true`, `max_tokens`,
//!   `ignore_eos: true`, `temperature: 0`) at `rate / speedup` requests per real second, with
//!   at most 48 in flight (a request waiting for a slot is sent late; TTFT counts from its
//!   actual send, as the study's client did). Each strategy given is one phase, sent as the
//!   `routing-strategy` header, with fresh salts.
//! - Measures TTFT, TPOT and E2E per request and multiplies them by `speedup`, so the numbers
//!   are in the engine model's seconds. Reads `target-pod`, `x-kvroute-decision` and
//!   `x-kvroute-sim-replica`. Every request has a timeout; the run is bounded.
//! - Priming (warm, hot50, hot90): before each phase, every URL given with `--direct` gets
//!   `POST /reset_prefix_cache`. warm then sends every family's prompt (`max_tokens: 1`) to each
//!   `--direct` URL, so every engine holds every family. Then, for warm and hot*, the eight
//!   families are sent at once through `--url` with `routing-strategy: least-request` and
//!   `max_tokens: 1`: least-request alternates between two idle pods, so the gateway's index
//!   and the engines hold four families each. The pods the families landed on are reported;
//!   a live run cannot force the hot family's home to be a given pod (the simulator does), nor
//!   build warm's 6/2 index split.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::report::{decision_field, PhaseSummary, RequestRecord, Slo};
use crate::workload::{mix, ArrivalProcess, Scenario, StudyPhase, STUDY_FAMILIES};

/// The client's in-flight cap.
pub const CLIENT_CAP: usize = 48;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// What to replay.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// Base URL, `http://host:port`.
    pub url: String,
    /// The scenario.
    pub scenario: Scenario,
    /// One phase per strategy (sent as `routing-strategy`); empty = one phase without header.
    pub strategies: Vec<String>,
    /// Planned arrivals per phase.
    pub requests: usize,
    /// Arrival rate in the model's requests per second.
    pub rate: f64,
    /// The servers' speed-up: inter-arrival times are divided by it, measurements multiplied.
    pub speedup: f64,
    /// The round seed (family order).
    pub seed: u64,
    /// Output tokens per request.
    pub max_tokens: u32,
    /// Where to write per-request JSONL records.
    pub records: Option<PathBuf>,
    /// Per-request timeout in real seconds (`None`: 120 model seconds / speed-up + 5 s).
    pub timeout_s: Option<f64>,
    /// Replica URLs to reset and warm directly.
    pub direct: Vec<String>,
    /// The model name in requests.
    pub model: String,
    /// Arrival spacing.
    pub arrivals: ArrivalProcess,
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A URL is not `http://host:port`.
    #[error("invalid URL {0:?}: expected http://host:port")]
    Url(String),
    /// A numeric option is out of range.
    #[error("invalid option: {0}")]
    Option(String),
    /// Writing records failed.
    #[error("cannot write records to {path}: {source}")]
    Records {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// One phase's outcome.
#[derive(Debug)]
pub struct PhaseOutcome {
    /// Per-request records.
    pub records: Vec<RequestRecord>,
    /// The summary row.
    pub summary: PhaseSummary,
    /// Notes on priming (homes observed, what could not be done).
    pub notes: Vec<String>,
}

fn base_uri(url: &str) -> Result<String, ReplayError> {
    let trimmed = url.trim_end_matches('/');
    let uri: Uri = trimmed
        .parse()
        .map_err(|_| ReplayError::Url(url.to_owned()))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(ReplayError::Url(url.to_owned()));
    }
    Ok(trimmed.to_owned())
}

impl ReplayConfig {
    fn validate(&self) -> Result<(), ReplayError> {
        base_uri(&self.url)?;
        for d in &self.direct {
            base_uri(d)?;
        }
        if !(self.speedup.is_finite() && self.speedup > 0.0) {
            return Err(ReplayError::Option(format!(
                "--speedup must be > 0, got {}",
                self.speedup
            )));
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return Err(ReplayError::Option(format!(
                "--rate must be > 0, got {}",
                self.rate
            )));
        }
        if self.requests == 0 || self.requests > 100_000 {
            return Err(ReplayError::Option(
                "--requests must be between 1 and 100000".into(),
            ));
        }
        if self.max_tokens == 0 {
            return Err(ReplayError::Option(
                "--max-tokens must be at least 1".into(),
            ));
        }
        if self.timeout_s.is_some_and(|t| !(t.is_finite() && t > 0.0)) {
            return Err(ReplayError::Option("--timeout must be > 0".into()));
        }
        Ok(())
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(
            self.timeout_s
                .unwrap_or(120.0 / self.speedup + 5.0)
                .min(3600.0),
        )
    }

    fn round_label(&self) -> String {
        match self.seed {
            102 => format!("{} / 1", self.scenario.name()),
            103 => format!("{} / 2", self.scenario.name()),
            s => format!("{} / seed {s}", self.scenario.name()),
        }
    }
}

/// Runs every phase and returns their outcomes (records are written when asked).
pub async fn run(cfg: &ReplayConfig) -> Result<Vec<PhaseOutcome>, ReplayError> {
    cfg.validate()?;
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(CLIENT_CAP)
        .build_http();
    let strategies: Vec<Option<String>> = if cfg.strategies.is_empty() {
        vec![None]
    } else {
        cfg.strategies.iter().cloned().map(Some).collect()
    };
    let run_nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut out = Vec::new();
    for (i, strategy) in strategies.iter().enumerate() {
        // Fresh salts per phase and per run, so no earlier cache or index entry can match.
        let phase = StudyPhase::new(
            cfg.scenario,
            cfg.seed,
            mix(run_nonce ^ mix(i as u64)),
            cfg.requests,
            cfg.rate,
            cfg.arrivals,
            cfg.max_tokens,
        );
        let notes = prime(cfg, &client, &phase).await;
        let label = cfg.round_label();
        let name = strategy.clone().unwrap_or_else(|| "(default)".to_owned());
        let records = run_phase(cfg, &client, &phase, strategy.as_deref(), &label).await;
        let mut pods: Vec<String> = records.iter().filter_map(|r| r.pod.clone()).collect();
        pods.sort();
        pods.dedup();
        let summary =
            PhaseSummary::from_records(&label, &name, cfg.requests, &records, &pods, None);
        out.push(PhaseOutcome {
            records,
            summary,
            notes,
        });
    }
    if let Some(path) = &cfg.records {
        let all: Vec<RequestRecord> = out.iter().flat_map(|p| p.records.iter().cloned()).collect();
        crate::report::write_jsonl(path, &all).map_err(|source| ReplayError::Records {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(out)
}

struct Sent {
    status: Option<u16>,
    headers: BTreeMap<String, String>,
    ttft: Option<Duration>,
    last_content: Option<Duration>,
    end: Duration,
    usage: Option<Value>,
    done: bool,
    error: Option<String>,
}

fn completion_body(model: &str, prompt: &str, max_tokens: u32) -> Bytes {
    Bytes::from(
        json!({
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": true, "stream_options": { "include_usage": true }, "ignore_eos": true,
        })
        .to_string(),
    )
}

/// Sends one streaming completion and measures it; never panics, bounded by `timeout`.
async fn send(
    client: &HttpClient,
    base: &str,
    headers: &[(&str, &str)],
    body: Bytes,
    timeout: Duration,
) -> Sent {
    let start = Instant::now();
    let mut sent = Sent {
        status: None,
        headers: BTreeMap::new(),
        ttft: None,
        last_content: None,
        end: Duration::ZERO,
        usage: None,
        done: false,
        error: None,
    };
    let fut = async {
        let mut builder = hyper::Request::post(format!("{base}/v1/completions"))
            .header("content-type", "application/json");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let req = builder.body(Full::new(body)).map_err(|e| e.to_string())?;
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        sent.status = Some(resp.status().as_u16());
        for name in [
            "target-pod",
            "x-kvroute-decision",
            crate::serve::REPLICA_HEADER,
        ] {
            if let Some(v) = resp.headers().get(name).and_then(|v| v.to_str().ok()) {
                sent.headers.insert(name.to_owned(), v.to_owned());
            }
        }
        let ok = resp.status().is_success();
        let mut body = resp.into_body();
        let mut buf: Vec<u8> = Vec::new();
        let mut raw_err = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("body error: {e}"))?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            if !ok {
                raw_err.extend_from_slice(data);
                continue;
            }
            buf.extend_from_slice(data);
            while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&line);
                let Some(payload) = line.trim().strip_prefix("data:") else {
                    continue;
                };
                let payload = payload.trim();
                if payload == "[DONE]" {
                    sent.done = true;
                    continue;
                }
                let Ok(v) = serde_json::from_str::<Value>(payload) else {
                    continue;
                };
                let content = v["choices"].get(0).is_some_and(|c| {
                    c["text"].as_str().is_some_and(|t| !t.is_empty())
                        || c["delta"]["content"]
                            .as_str()
                            .is_some_and(|t| !t.is_empty())
                });
                if content {
                    let now = start.elapsed();
                    sent.ttft.get_or_insert(now);
                    sent.last_content = Some(now);
                }
                if v.get("usage").is_some_and(|u| !u.is_null()) {
                    sent.usage = Some(v["usage"].clone());
                }
                if v.get("error").is_some() {
                    return Err(format!("stream error: {}", v["error"]["message"]));
                }
            }
        }
        if !ok {
            let text = String::from_utf8_lossy(&raw_err);
            return Err(format!(
                "HTTP {}: {}",
                sent.status.unwrap_or(0),
                text.chars().take(200).collect::<String>()
            ));
        }
        Ok::<(), String>(())
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => sent.error = Some(e),
        Err(_) => sent.error = Some(format!("timed out after {:.1} s", timeout.as_secs_f64())),
    }
    sent.end = start.elapsed();
    sent
}

async fn prime(cfg: &ReplayConfig, client: &HttpClient, phase: &StudyPhase) -> Vec<String> {
    let mut notes = Vec::new();
    let timeout = cfg.timeout();
    for d in &cfg.direct {
        let d = d.trim_end_matches('/');
        let req =
            hyper::Request::post(format!("{d}/reset_prefix_cache")).body(Full::new(Bytes::new()));
        let status = match req {
            Ok(r) => match tokio::time::timeout(timeout, client.request(r)).await {
                Ok(Ok(resp)) => resp.status().as_u16().to_string(),
                Ok(Err(e)) => format!("error {e}"),
                Err(_) => "timeout".into(),
            },
            Err(e) => format!("error {e}"),
        };
        notes.push(format!("reset_prefix_cache {d}: {status}"));
    }
    if cfg.scenario == Scenario::Cold {
        return notes;
    }
    if cfg.scenario.warm_engines() {
        if cfg.direct.is_empty() {
            notes.push("warm: no --direct replica URLs, so engines hold only the families primed through the gateway".into());
        }
        let mut tasks = Vec::new();
        for d in &cfg.direct {
            for f in 0..STUDY_FAMILIES {
                let (client, d, body) = (
                    client.clone(),
                    d.trim_end_matches('/').to_owned(),
                    completion_body(&cfg.model, &phase.priming_prompt(f), 1),
                );
                tasks.push(tokio::spawn(async move {
                    send(&client, &d, &[], body, timeout).await
                }));
            }
        }
        for t in tasks {
            if let Ok(s) = t.await {
                if let Some(e) = s.error {
                    notes.push(format!("direct warm-up failed: {e}"));
                }
            }
        }
        if let Scenario::Warm { on_a } = cfg.scenario {
            if on_a != 4 {
                notes.push(format!("warm: a live gateway's index is primed 4/4; the {on_a}/{} split is simulator-only", 8 - on_a));
            }
        }
    }
    let base = cfg.url.trim_end_matches('/').to_owned();
    let mut tasks = Vec::new();
    for f in 0..STUDY_FAMILIES {
        let (client, base, body) = (
            client.clone(),
            base.clone(),
            completion_body(&cfg.model, &phase.priming_prompt(f), 1),
        );
        tasks.push(tokio::spawn(async move {
            send(
                &client,
                &base,
                &[("routing-strategy", "least-request")],
                body,
                timeout,
            )
            .await
        }));
    }
    let mut homes = Vec::new();
    for (f, t) in tasks.into_iter().enumerate() {
        match t.await {
            Ok(s) if s.error.is_none() => {
                let pod = s
                    .headers
                    .get("target-pod")
                    .or_else(|| s.headers.get(crate::serve::REPLICA_HEADER))
                    .cloned()
                    .unwrap_or_else(|| "?".into());
                homes.push(format!(
                    "{f}{}→{pod}",
                    if f == 0 && cfg.scenario.engine_home(0, 2).is_some() {
                        "(hot)"
                    } else {
                        ""
                    }
                ));
            }
            Ok(s) => notes.push(format!(
                "priming family {f} failed: {}",
                s.error.unwrap_or_default()
            )),
            Err(e) => notes.push(format!("priming family {f} failed: {e}")),
        }
    }
    notes.push(format!(
        "primed through the gateway (least-request): {}",
        homes.join(" ")
    ));
    notes
}

async fn run_phase(
    cfg: &ReplayConfig,
    client: &HttpClient,
    phase: &StudyPhase,
    strategy: Option<&str>,
    label: &str,
) -> Vec<RequestRecord> {
    let sem = Arc::new(Semaphore::new(CLIENT_CAP));
    let start = Instant::now();
    let base = cfg.url.trim_end_matches('/').to_owned();
    let timeout = cfg.timeout();
    let speed = cfg.speedup;
    let mut tasks = Vec::new();
    for (i, a) in phase.arrivals.iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_secs_f64(a.at_us as f64 / 1e6 / speed))
            .await;
        let Ok(permit) = Arc::clone(&sem).acquire_owned().await else {
            break;
        };
        let sent_at = start.elapsed();
        let body = completion_body(&cfg.model, &a.prompt, a.output_tokens);
        let (client, base, strategy) = (client.clone(), base.clone(), strategy.map(str::to_owned));
        let mut rec = RequestRecord {
            phase: label.to_owned(),
            strategy: strategy.clone().unwrap_or_else(|| "(default)".into()),
            index: i + 1,
            family: a.family,
            planned_s: a.at_us as f64 / 1e6,
            sent_s: Some(sent_at.as_secs_f64() * speed),
            ..Default::default()
        };
        let expect = a.output_tokens;
        tasks.push(tokio::spawn(async move {
            let headers: Vec<(&str, &str)> = strategy
                .as_deref()
                .map(|s| vec![("routing-strategy", s)])
                .unwrap_or_default();
            let s = send(&client, &base, &headers, body, timeout).await;
            drop(permit);
            fill_record(&mut rec, s, expect, speed);
            rec
        }));
    }
    let mut records = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(r) = t.await {
            records.push(r);
        }
    }
    records
}

fn fill_record(rec: &mut RequestRecord, s: Sent, expect: u32, speed: f64) {
    let scale = |d: Duration| d.as_secs_f64() * speed;
    rec.status = s.status;
    rec.decision = s.headers.get("x-kvroute-decision").cloned();
    rec.pod = s
        .headers
        .get("target-pod")
        .or_else(|| s.headers.get(crate::serve::REPLICA_HEADER))
        .cloned();
    if let Some(d) = &rec.decision {
        rec.reason = decision_field(d, "reason").map(str::to_owned);
        rec.match_percent =
            decision_field(d, "match").and_then(|m| m.trim_end_matches('%').parse().ok());
        rec.imbalance = decision_field(d, "imbalance").map(|v| v == "1");
    }
    rec.ttft_s = s.ttft.map(scale);
    rec.e2e_s = Some(scale(s.end));
    if let (Some(first), Some(last)) = (s.ttft, s.last_content) {
        rec.tpot_ms =
            Some(scale(last - first) * 1000.0 / f64::from(expect.saturating_sub(1).max(1)));
    }
    if let Some(u) = &s.usage {
        rec.prompt_tokens = u["prompt_tokens"].as_u64().map(|v| v as u32);
        rec.output_tokens = u["completion_tokens"].as_u64().map(|v| v as u32);
        rec.cached_tokens = Some(
            u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0) as u32,
        );
    }
    rec.success = s.error.is_none()
        && s.status == Some(200)
        && s.ttft.is_some()
        && s.done
        && rec.output_tokens == Some(expect);
    rec.error = s.error.or_else(|| {
        (!rec.success).then(|| "incomplete response (no content, [DONE] or usage)".to_owned())
    });
    rec.judge(&Slo::default());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(headers: &[(&str, &str)], usage_tokens: u32) -> Sent {
        Sent {
            status: Some(200),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ttft: Some(Duration::from_millis(20)),
            last_content: Some(Duration::from_millis(147)),
            end: Duration::from_millis(150),
            usage: Some(
                json!({"prompt_tokens": 100, "completion_tokens": usage_tokens, "prompt_tokens_details": {"cached_tokens": 80}}),
            ),
            done: true,
            error: None,
        }
    }

    #[test]
    fn records_read_the_gateway_headers_and_scale_by_the_speedup() {
        let mut r = RequestRecord::default();
        let d = "strategy=prefix-cache reason=prefix_match pod=vllm-b match=99% blocks=218/219 imbalance=1 load=3";
        fill_record(
            &mut r,
            sent(
                &[
                    ("target-pod", "vllm-b"),
                    ("x-kvroute-decision", d),
                    ("x-kvroute-sim-replica", "b"),
                ],
                128,
            ),
            128,
            10.0,
        );
        assert_eq!(r.pod.as_deref(), Some("vllm-b"));
        assert_eq!(r.reason.as_deref(), Some("prefix_match"));
        assert_eq!((r.match_percent, r.imbalance), (Some(99), Some(true)));
        assert!((r.ttft_s.unwrap() - 0.2).abs() < 1e-9);
        assert!((r.tpot_ms.unwrap() - 10.0).abs() < 1e-9); // 127 ms real × 10 / 127
        assert!(r.success && r.within_slo);
        assert_eq!(r.cached_tokens, Some(80));

        let mut short = RequestRecord::default();
        fill_record(
            &mut short,
            sent(&[("x-kvroute-sim-replica", "b")], 100),
            128,
            1.0,
        );
        assert_eq!(short.pod.as_deref(), Some("b"));
        assert_eq!(short.reason, None);
        assert!(!short.success && short.error.is_some());
    }

    #[test]
    fn options_are_validated() {
        let ok = ReplayConfig {
            url: "http://127.0.0.1:1".into(),
            scenario: Scenario::Cold,
            strategies: vec![],
            requests: 1,
            rate: 1.0,
            speedup: 1.0,
            seed: 1,
            max_tokens: 1,
            records: None,
            timeout_s: None,
            direct: vec![],
            model: "m".into(),
            arrivals: ArrivalProcess::Uniform,
        };
        assert!(ok.validate().is_ok());
        assert!(ReplayConfig {
            url: "127.0.0.1:1".into(),
            ..ok.clone()
        }
        .validate()
        .is_err());
        assert!(ReplayConfig {
            speedup: 0.0,
            ..ok.clone()
        }
        .validate()
        .is_err());
        assert!(ReplayConfig {
            requests: 0,
            ..ok.clone()
        }
        .validate()
        .is_err());
        assert!(ReplayConfig {
            timeout_s: Some(-1.0),
            ..ok.clone()
        }
        .validate()
        .is_err());
        assert!(ReplayConfig {
            direct: vec!["nope".into()],
            ..ok
        }
        .validate()
        .is_err());
    }
}
