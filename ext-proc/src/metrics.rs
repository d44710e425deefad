//! Prometheus metrics. The [`Registry`] is built in [`crate::run`] and passed down; nothing is
//! global.
//!
//! Router counters are read from [`kvroute_core::Router::stats`] at scrape time by
//! [`RouterCollector`], with AIBrix's names, labels and buckets
//! (`algorithms/prefix_cache.go`, `using_kv_sync="false"`). Per-request service metrics
//! (routing latency, rejections, ext_proc stream ends and errors, reloads) are live
//! prometheus-client metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvroute_core::{EngineSnapshot, Outcome, Reason, Router, MATCH_BUCKETS};
use parking_lot::Mutex;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::admission::metrics::AdmissionMetrics;
use crate::engines::EngineTable;

/// A metric's label pairs.
pub(crate) type Labels = Vec<(&'static str, String)>;

/// Time to first token: 14 exponential buckets from 10 ms, factor 2 (up to 82 s).
pub(crate) fn ttft_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

fn latency_histogram() -> Histogram {
    // AIBrix: 15 exponential buckets from 10 µs, factor 2 (up to 163.84 ms).
    Histogram::new(exponential_buckets(1e-5, 2.0, 15))
}

/// Live service metrics.
#[derive(Debug)]
pub struct Metrics {
    routing_latency: Family<Labels, Histogram, fn() -> Histogram>,
    ttft_predicted: Family<Labels, Histogram, fn() -> Histogram>,
    first_token: Family<Labels, Histogram, fn() -> Histogram>,
    rejects: Family<Labels, Counter>,
    streams_open: Gauge,
    stream_ends: Family<Labels, Counter>,
    release_errors: Counter,
    reloads: Family<Labels, Counter>,
    reload_ok: Gauge,
    scrape_errors: Family<Labels, Counter>,
    timed_responses: Counter,
    timed_without_body: Counter,
    tokenized: Family<Labels, Counter>,
    tokenize_latency: Family<Labels, Histogram, fn() -> Histogram>,
    /// Whether any timed response's body has reached kvroute.
    timed_body_seen: AtomicBool,
    /// Admission's metrics ([`crate::admission::metrics`]).
    pub admission: AdmissionMetrics,
}

/// Every `kvroute_requests_rejected_total{kind}` ([`crate::respond::Reject::kind`]).
pub const REJECT_KINDS: [&str; 8] = [
    "model_not_found",
    "no_ready_pod",
    "no_pod_in_subset",
    "bad_strategy",
    "bad_body",
    "no_messages",
    "too_large",
    "shed",
];

/// Every `kvroute_ext_proc_stream_ends_total{how}` ([`crate::service`]).
pub const STREAM_ENDS: [&str; 3] = ["closed", "connection_lost", "error"];

/// Timed successes without a body, none ever with one, after which kvroute warns that Envoy
/// ignores the mode override (one could be a client gone before the first token).
const TIMED_WITHOUT_BODY_WARNING: u64 = 3;

impl Metrics {
    /// Creates the metrics and registers them (and a [`RouterCollector`] over `router`).
    pub fn register(
        registry: &mut Registry,
        router: Arc<Mutex<Router>>,
        engines: EngineTable,
    ) -> Metrics {
        let m = Metrics {
            routing_latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            ttft_predicted: Family::new_with_constructor(ttft_histogram as fn() -> Histogram),
            first_token: Family::new_with_constructor(ttft_histogram as fn() -> Histogram),
            rejects: Family::default(),
            streams_open: Gauge::default(),
            stream_ends: Family::default(),
            release_errors: Counter::default(),
            reloads: Family::default(),
            reload_ok: Gauge::default(),
            scrape_errors: Family::default(),
            timed_responses: Counter::default(),
            timed_without_body: Counter::default(),
            tokenized: Family::default(),
            tokenize_latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            timed_body_seen: AtomicBool::new(false),
            admission: AdmissionMetrics::register(registry, router.clone()),
        };
        registry.register(
            "aibrix_prefix_cache_routing_latency_seconds",
            "Time spent in the routing decision",
            m.routing_latency.clone(),
        );
        registry.register(
            "kvroute_requests_rejected",
            "Requests answered by kvroute itself (ImmediateResponse), by kind",
            m.rejects.clone(),
        );
        registry.register(
            "kvroute_ext_proc_streams_open",
            "ext_proc streams currently open",
            m.streams_open.clone(),
        );
        registry.register(
            "kvroute_ext_proc_stream_ends",
            "ext_proc streams ended, by how (closed = ended by Envoy: END_STREAM or RST_STREAM, the normal end of every request; connection_lost = the connection to Envoy went away first, the ticket held until its predicted end; error = kvroute failed it with a non-OK status)",
            m.stream_ends.clone(),
        );
        registry.register(
            "kvroute_ticket_release_errors",
            "Ticket completions the router refused (must stay 0)",
            m.release_errors.clone(),
        );
        registry.register(
            "kvroute_config_reloads",
            "Configuration reloads, by result",
            m.reloads.clone(),
        );
        registry.register(
            "kvroute_engine_scrape_errors",
            "Failed scrapes of a pod's engine /metrics (timeout, connection, status, no vLLM metrics)",
            m.scrape_errors.clone(),
        );
        registry.register(
            "kvroute_timed_responses",
            "Streaming responses whose body Envoy was asked to pass through kvroute, to time their first token and read their usage",
            m.timed_responses.clone(),
        );
        registry.register(
            "kvroute_timed_responses_without_body",
            "Timed responses that succeeded without any body chunk reaching kvroute: Envoy ignored the mode override (set allow_mode_override: true on the ext_proc filter), or the client went away before the first token",
            m.timed_without_body.clone(),
        );
        registry.register(
            "kvroute_tokenize_requests",
            "Request bodies of models with a tokenizer, by result: tokens (routed on token blocks), skipped (a prompt shape that is not tokenized) or error (routed on text blocks)",
            m.tokenized.clone(),
        );
        registry.register(
            "kvroute_tokenize_seconds",
            "Time spent tokenizing a request body (outside the router lock), by model",
            m.tokenize_latency.clone(),
        );
        registry.register(
            "kvroute_ttft_predicted_seconds",
            "Time to first token the TTFT model predicted for each routed request, by model and chosen pod",
            m.ttft_predicted.clone(),
        );
        registry.register(
            "kvroute_first_token_seconds",
            "Time from routing to the first response body chunk of timed streaming responses (a sample: [stream_timing]), by model and pod",
            m.first_token.clone(),
        );
        registry.register(
            "kvroute_config_last_reload_successful",
            "1 while the configuration in force is the file's latest version (start-up or last reload applied), 0 after a refused reload until one applies",
            m.reload_ok.clone(),
        );
        m.reload_ok.set(1);
        // Known label values start at 0, so that rate() and increase() see their first event.
        for result in ["ok", "error"] {
            let _ = m
                .reloads
                .get_or_create(&vec![("result", result.to_owned())]);
        }
        for kind in REJECT_KINDS {
            let _ = m.rejects.get_or_create(&vec![("kind", kind.to_owned())]);
        }
        for how in STREAM_ENDS {
            let _ = m.stream_ends.get_or_create(&vec![("how", how.to_owned())]);
        }
        registry.register_collector(Box::new(RouterCollector { router, engines }));
        m
    }

    /// Records the time spent in one routing decision.
    pub fn observe_routing(&self, model: &str, seconds: f64) {
        let labels = vec![
            ("model", model.to_owned()),
            ("using_kv_sync", "false".to_owned()),
        ];
        self.routing_latency.get_or_create(&labels).observe(seconds);
    }

    /// Records one tokenization of `model`'s request body: its result (`tokens`, `skipped`,
    /// `error`) and duration.
    pub fn observe_tokenize(&self, model: &str, result: &str, seconds: f64) {
        let labels = vec![("model", model.to_owned()), ("result", result.to_owned())];
        self.tokenized.get_or_create(&labels).inc();
        let labels = vec![("model", model.to_owned())];
        self.tokenize_latency
            .get_or_create(&labels)
            .observe(seconds);
    }

    /// Records the TTFT predicted for a request routed to `pod`.
    pub fn observe_prediction(&self, model: &str, pod: &str, seconds: f64) {
        let labels = vec![("model", model.to_owned()), ("pod", pod.to_owned())];
        self.ttft_predicted.get_or_create(&labels).observe(seconds);
    }

    /// Records a first token measured on a timed response from `pod`.
    pub fn observe_first_token(&self, model: &str, pod: &str, seconds: f64) {
        let labels = vec![("model", model.to_owned()), ("pod", pod.to_owned())];
        self.first_token.get_or_create(&labels).observe(seconds);
    }

    /// Counts a rejection.
    pub fn reject(&self, kind: &'static str) {
        self.rejects
            .get_or_create(&vec![("kind", kind.to_owned())])
            .inc();
    }

    /// An ext_proc stream opened.
    pub fn stream_opened(&self) {
        self.streams_open.inc();
    }

    /// An ext_proc stream ended (`how`: closed, error; see [`crate::service`]).
    pub fn stream_ended(&self, how: &'static str) {
        self.streams_open.dec();
        self.stream_ends
            .get_or_create(&vec![("how", how.to_owned())])
            .inc();
    }

    /// The router refused a completion (a bug if it ever happens).
    pub fn release_error(&self) {
        self.release_errors.inc();
    }

    /// A scrape of `pod`'s engine metrics failed.
    pub fn scrape_error(&self, pod: &str) {
        self.scrape_errors
            .get_or_create(&vec![("pod", pod.to_owned())])
            .inc();
    }

    /// A response is timed (its body streamed through kvroute).
    pub fn response_timed(&self) {
        self.timed_responses.inc();
    }

    /// A timed response succeeded; `had_body`: whether any of its body reached kvroute. True
    /// once, when the third (`TIMED_WITHOUT_BODY_WARNING`) without a body ends and none ever had
    /// one (for a one-time warning that Envoy ignores the mode override).
    pub fn timed_response_succeeded(&self, had_body: bool) -> bool {
        if had_body {
            self.timed_body_seen.store(true, Ordering::Relaxed);
            return false;
        }
        self.timed_without_body.inc() + 1 == TIMED_WITHOUT_BODY_WARNING
            && !self.timed_body_seen.load(Ordering::Relaxed)
    }

    /// How many timed responses succeeded without a body (tests).
    #[cfg(test)]
    pub fn timed_without_body(&self) -> u64 {
        self.timed_without_body.get()
    }

    /// A reload finished (`result`: ok, error).
    pub fn reloaded(&self, result: &'static str) {
        self.reloads
            .get_or_create(&vec![("result", result.to_owned())])
            .inc();
        self.reload_ok.set(i64::from(result == "ok"));
    }

    /// Makes the pod's scrape-error counter exist (at 0 until its first error).
    pub fn scraped(&self, pod: &str) {
        let _ = self
            .scrape_errors
            .get_or_create(&vec![("pod", pod.to_owned())]);
    }
}

/// Encodes [`Router::stats`] on every scrape.
#[derive(Debug)]
pub struct RouterCollector {
    router: Arc<Mutex<Router>>,
    engines: EngineTable,
}

/// Encodes one counter family from precomputed rows.
pub(crate) fn counter<N: Copy>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Labels, N)],
) -> std::fmt::Result
where
    ConstCounter<N>: EncodeMetric,
{
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        if labels.is_empty() {
            ConstCounter::new(*v).encode(m)?;
            break;
        }
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// Encodes one gauge family from precomputed rows.
pub(crate) fn gauge<N: Copy>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Labels, N)],
) -> std::fmt::Result
where
    ConstGauge<N>: EncodeMetric,
{
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        if labels.is_empty() {
            ConstGauge::new(*v).encode(m)?;
            break;
        }
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn kv(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

impl prometheus_client::collector::Collector for RouterCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let (stats, router_block) = {
            let router = self.router.lock();
            (router.stats(), router.config().ttft.engine_block_tokens)
        };
        let (mut decisions, mut selections, mut imbalance, mut errors, mut routed) =
            (vec![], vec![], vec![], vec![], vec![]);
        for m in &stats.models {
            let model = &*m.model;
            for (i, b) in MATCH_BUCKETS.iter().enumerate() {
                let l = kv(&[
                    ("model", model),
                    ("match_percent_bucket", b),
                    ("using_kv_sync", "false"),
                ]);
                decisions.push((l, m.decisions_by_bucket[i]));
            }
            for r in Reason::ALL {
                if r.is_prefix_cache() {
                    let l = kv(&[
                        ("model", model),
                        ("selection", r.as_str()),
                        ("using_kv_sync", "false"),
                    ]);
                    selections.push((l, m.routed(r)));
                }
                routed.push((kv(&[("model", model), ("reason", r.as_str())]), m.routed(r)));
            }
            imbalance.push((
                kv(&[("model", model), ("using_kv_sync", "false")]),
                m.imbalance_events,
            ));
            let l = kv(&[
                ("model", model),
                ("reason", "no_target_pod"),
                ("using_kv_sync", "false"),
            ]);
            errors.push((l, m.no_ready_pod));
        }
        counter(
            &mut enc,
            "aibrix_prefix_cache_routing_decisions",
            "prefix-cache decisions by the chosen pod's match percent",
            &decisions,
        )?;
        counter(
            &mut enc,
            "aibrix_prefix_cache_routing_selection",
            "prefix-cache selections by kind",
            &selections,
        )?;
        counter(
            &mut enc,
            "aibrix_prefix_cache_load_imbalance",
            "Load-imbalance guard activations",
            &imbalance,
        )?;
        counter(
            &mut enc,
            "aibrix_prefix_cache_routing_errors",
            "Routing errors by reason",
            &errors,
        )?;
        counter(
            &mut enc,
            "kvroute_routed",
            "Requests routed, by model and reason",
            &routed,
        )?;

        let mut in_flight = vec![];
        let mut pod_routed = vec![];
        for p in &stats.pods {
            let l = kv(&[("pod", &p.name), ("address", &p.address)]);
            in_flight.push((l.clone(), i64::from(p.in_flight)));
            pod_routed.push((l, p.routed));
        }
        gauge(
            &mut enc,
            "kvroute_pod_in_flight",
            "Requests routed to the pod and not yet finished",
            &in_flight,
        )?;
        counter(
            &mut enc,
            "kvroute_pod_routed",
            "Requests routed to the pod",
            &pod_routed,
        )?;
        let mut info = vec![];
        for p in &stats.pods {
            for m in &p.models {
                let l = kv(&[("pod", &p.name), ("address", &p.address), ("model", m)]);
                info.push((l, 1i64));
            }
        }
        gauge(
            &mut enc,
            "kvroute_pod_info",
            "1 for each model a pod serves (joins per-pod series to models)",
            &info,
        )?;
        let (mut ejected, mut ejections, mut checks_failing) = (vec![], vec![], vec![]);
        for p in &stats.pods {
            let pod = kv(&[("pod", &p.name)]);
            ejected.push((pod.clone(), i64::from(p.health.ejected)));
            checks_failing.push((pod, i64::from(p.health.checks_failing)));
            for (i, reason) in crate::health::ejection_reasons() {
                let l = kv(&[("pod", &p.name), ("reason", reason)]);
                ejections.push((l, p.health.ejections[i]));
            }
        }
        gauge(
            &mut enc,
            "kvroute_pod_ejected",
            "1 while the pod is ejected for failing requests (waiting out its ejection or probing), else 0",
            &ejected,
        )?;
        counter(
            &mut enc,
            "kvroute_pod_ejections",
            "Times the pod was ejected, by reason (consecutive_5xx, consecutive_gateway_failure)",
            &ejections,
        )?;
        gauge(
            &mut enc,
            "kvroute_pod_health_checks_failing",
            "1 while the pod's active health checks (engine metrics scrapes or GET /health) fail, else 0",
            &checks_failing,
        )?;

        let predicted: Vec<_> = stats
            .pods
            .iter()
            .map(|p| (kv(&[("pod", &p.name)]), p.predicted_hit_tokens))
            .collect();
        counter(
            &mut enc,
            "kvroute_prefix_predicted_hit_tokens",
            "Prompt tokens the TTFT model predicted the pod's engine would serve from its prefix cache (compare with kvroute_engine_prefix_cache_hits_total)",
            &predicted,
        )?;
        encode_calibration(&mut enc, &stats.pods)?;
        let rates = |f: &dyn Fn(&kvroute_core::PodInfo) -> f64| -> Vec<(Labels, f64)> {
            stats
                .pods
                .iter()
                .map(|p| (kv(&[("pod", &p.name)]), f(p)))
                .collect()
        };
        gauge(
            &mut enc,
            "kvroute_ttft_prefill_tokens_per_second",
            "The prefill rate least-ttft predicts with for the pod: its own once it has a few measured samples, the fleet's before (the prior until learned from completions or engine metrics)",
            &rates(&|p| p.prefill_tokens_per_s),
        )?;
        gauge(
            &mut enc,
            "kvroute_ttft_time_per_output_token_seconds",
            "The least-ttft model's time per output token for the pod (the prior until learned from completions or engine metrics)",
            &rates(&|p| p.tpot_ms / 1_000.0),
        )?;
        gauge(
            &mut enc,
            "kvroute_ttft_overhead_seconds",
            "The least-ttft model's fixed part of a TTFT for the pod (the prior until learned from completions or engine metrics)",
            &rates(&|p| p.overhead_ms / 1_000.0),
        )?;
        gauge(
            &mut enc,
            "kvroute_ttft_prompt_bytes_per_token",
            "The least-ttft model's prompt bytes per engine token (the prior until learned from completions or engine metrics)",
            &[(Labels::new(), stats.prompt_bytes_per_token)],
        )?;
        gauge(
            &mut enc,
            "kvroute_ttft_engine_block_tokens",
            "The engines' KV block size in tokens the least-ttft model counts reuse in ([ttft] engine_block_tokens)",
            &[(Labels::new(), i64::from(router_block))],
        )?;
        // The router lock is released (stats() returned): take the engine table now.
        let engines: Vec<_> = self
            .engines
            .lock()
            .iter()
            .map(|(pod, s)| (pod.clone(), *s))
            .collect();
        let rows = |f: &dyn Fn(&EngineSnapshot) -> Option<u64>| -> Vec<(Labels, u64)> {
            engines
                .iter()
                .filter_map(|(pod, s)| Some((kv(&[("pod", pod)]), f(&s.snapshot)?)))
                .collect()
        };
        let grows = |f: &dyn Fn(&EngineSnapshot) -> u32| -> Vec<(Labels, i64)> {
            engines
                .iter()
                .map(|(pod, s)| (kv(&[("pod", pod)]), i64::from(f(&s.snapshot))))
                .collect()
        };
        let blocks: Vec<(Labels, i64)> = engines
            .iter()
            .filter_map(|(pod, s)| Some((kv(&[("pod", pod)]), i64::from(s.block_tokens?))))
            .collect();
        counter(
            &mut enc,
            "kvroute_engine_prefix_cache_hits",
            "The engine's vllm:prefix_cache_hits_total (tokens) at the last good scrape",
            &rows(&|s| s.prefix_hits),
        )?;
        counter(
            &mut enc,
            "kvroute_engine_prefix_cache_queries",
            "The engine's vllm:prefix_cache_queries_total (tokens) at the last good scrape",
            &rows(&|s| s.prefix_queries),
        )?;
        gauge(
            &mut enc,
            "kvroute_engine_requests_running",
            "The engine's vllm:num_requests_running at the last good scrape",
            &grows(&|s| s.running),
        )?;
        gauge(
            &mut enc,
            "kvroute_engine_requests_waiting",
            "The engine's vllm:num_requests_waiting at the last good scrape",
            &grows(&|s| s.waiting),
        )?;
        gauge(
            &mut enc,
            "kvroute_engine_block_tokens",
            "The engine's KV block size in tokens (vllm:cache_config_info block_size) at the last good scrape; compare with kvroute_ttft_engine_block_tokens",
            &blocks,
        )?;

        let t = &stats.tickets;
        let open = i64::try_from(t.open).unwrap_or(i64::MAX);
        gauge(
            &mut enc,
            "kvroute_tickets_open",
            "Tickets issued and not yet released",
            &[(vec![], open)],
        )?;
        let outcomes: Vec<_> = Outcome::ALL
            .iter()
            .enumerate()
            .map(|(i, o)| (kv(&[("outcome", o.as_str())]), t.completed[i]))
            .collect();
        counter(
            &mut enc,
            "kvroute_tickets_completed",
            "Tickets released by the ext_proc stream end",
            &outcomes,
        )?;
        counter(
            &mut enc,
            "kvroute_tickets_expired",
            "Tickets released by the TTL safety net",
            &[(vec![], t.expired)],
        )?;
        counter(
            &mut enc,
            "kvroute_tickets_detached_released",
            "Tickets whose ext_proc connection was lost mid-request, released at their predicted end",
            &[(vec![], t.detached_released)],
        )?;
        counter(
            &mut enc,
            "kvroute_tickets_orphaned",
            "Tickets completed after their pod was removed",
            &[(vec![], t.orphaned)],
        )?;
        counter(
            &mut enc,
            "kvroute_tickets_rejected",
            "Duplicate or unknown completions",
            &[(vec![], t.rejected)],
        )?;
        counter(
            &mut enc,
            "kvroute_unknown_model",
            "Requests for a model no pod serves",
            &[(vec![], stats.unknown_model)],
        )?;
        let blocks = i64::try_from(stats.index.blocks).unwrap_or(i64::MAX);
        gauge(
            &mut enc,
            "kvroute_index_blocks",
            "Blocks in the prefix index",
            &[(vec![], blocks)],
        )?;
        Ok(())
    }
}

/// Renders the registry in the OpenMetrics text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // A fmt::Write into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// least-ttft's predicted against reported TTFTs per pod and predicted wait
/// (`kvroute_ttft_calibration_*`): mean error = (observed − predicted) / samples, mean absolute
/// error = abs_error / samples, over any window with `rate()`.
fn encode_calibration(
    enc: &mut DescriptorEncoder<'_>,
    pods: &[kvroute_core::PodInfo],
) -> std::fmt::Result {
    type Pick = fn(&kvroute_core::TtftErrors) -> f64;
    fn rows<N>(
        pods: &[kvroute_core::PodInfo],
        f: impl Fn(&kvroute_core::TtftErrors) -> N,
    ) -> Vec<(Labels, N)> {
        let mut out = Vec::with_capacity(pods.len() * 2);
        for p in pods {
            let c = &p.ttft_calibration;
            for (wait, e) in [("none", &c.at_once), ("predicted", &c.waited)] {
                out.push((kv(&[("pod", &p.name), ("wait", wait)]), f(e)));
            }
        }
        out
    }
    let samples = rows(pods, |e| e.samples);
    counter(
        enc,
        "kvroute_ttft_calibration_samples",
        "Requests whose first-token time was reported, by pod and by whether least-ttft's model predicted a wait (slot or prefill backlog) before their prefill when they were routed",
        &samples,
    )?;
    let sums: [(&str, &str, Pick); 3] = [
        (
            "kvroute_ttft_calibration_predicted_seconds",
            "The TTFTs least-ttft's model predicted for those requests at routing, summed",
            |e| e.predicted_ms / 1_000.0,
        ),
        (
            "kvroute_ttft_calibration_observed_seconds",
            "Their reported first-token times (from routing), summed",
            |e| e.observed_ms / 1_000.0,
        ),
        (
            "kvroute_ttft_calibration_abs_error_seconds",
            "|observed - predicted| of those requests, summed: divided by the samples, the model's mean absolute error",
            |e| e.abs_error_ms / 1_000.0,
        ),
    ];
    for (name, help, pick) in sums {
        counter(enc, name, help, &rows(pods, pick))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::respond::Reject;

    #[test]
    fn known_label_values_start_at_zero_and_cover_every_kind() {
        let every = Reject::every();
        for r in &every {
            assert!(REJECT_KINDS.contains(&r.kind()), "{}", r.kind());
        }
        let mut router = Router::new(kvroute_core::RouterConfig::default()).unwrap();
        let pod = kvroute_core::PodSpec {
            name: "a",
            address: "10.0.0.1:80",
            ready: true,
        };
        router.add_pod("m", pod).unwrap();
        let mut registry = Registry::default();
        let metrics = Metrics::register(
            &mut registry,
            Arc::new(Mutex::new(router)),
            EngineTable::default(),
        );
        let text = render(&registry);
        for line in [
            "kvroute_config_reloads_total{result=\"error\"} 0",
            "kvroute_requests_rejected_total{kind=\"too_large\"} 0",
            "kvroute_ext_proc_stream_ends_total{how=\"connection_lost\"} 0",
            "kvroute_config_last_reload_successful 1",
            "kvroute_pod_info{pod=\"a\",address=\"10.0.0.1:80\",model=\"m\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        metrics.reloaded("error");
        assert!(render(&registry).contains("kvroute_config_last_reload_successful 0"));
    }
}
