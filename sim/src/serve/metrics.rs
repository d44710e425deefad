//! `/metrics` in vLLM's Prometheus names.

use std::fmt::Write;

use crate::engine::EngineCounters;

/// vLLM V1's bucket boundaries for `vllm:time_to_first_token_seconds`, in seconds.
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM V1's bucket boundaries for `vllm:e2e_request_latency_seconds` (its request-latency
/// buckets), in seconds.
pub const E2E_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A Prometheus histogram with fixed upper bounds (plus `+Inf`), as `prometheus_client` keeps
/// one: a count per bucket, the sum and the count of the observations.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    // Observations per bucket, not cumulative; the last is above every bound.
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram with these upper bounds (ascending).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            buckets: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Counts one value (a value equal to a bound falls in that bound's bucket, `le`).
    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.buckets[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Their sum.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// `(le, cumulative count)` per bucket, `+Inf` last (as `f64::INFINITY`).
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut n = 0;
        self.bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(&self.buckets)
            .map(|(le, c)| {
                n += c;
                (le, n)
            })
            .collect()
    }
}

/// The per-request latency histograms the server observes in real time, as vLLM's frontend
/// does: from a request's arrival at the engine (its submission) to its first token, and to its
/// last token.
#[derive(Clone, Debug, PartialEq)]
pub struct Latencies {
    /// `vllm:time_to_first_token_seconds`.
    pub ttft: Histogram,
    /// `vllm:e2e_request_latency_seconds` (requests that produced all their tokens).
    pub e2e: Histogram,
}

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies {
            ttft: Histogram::new(&TTFT_BUCKETS),
            e2e: Histogram::new(&E2E_BUCKETS),
        }
    }
}

/// Everything `/metrics` shows of one engine (one data-parallel rank).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineStats {
    /// The engine's counters and gauges.
    pub counters: EngineCounters,
    /// Generation requests the engine accepted.
    pub requests_total: u64,
    /// Its requests' real-time latencies.
    pub latencies: Latencies,
}

/// Renders one engine's counters and request latencies as Prometheus text, labelled
/// `model_name` only (a server with one engine); see [`render_engines`].
pub fn render(
    model: &str,
    c: &EngineCounters,
    requests_total: u64,
    speedup: f64,
    latencies: &Latencies,
) -> String {
    let one = EngineStats {
        counters: *c,
        requests_total,
        latencies: latencies.clone(),
    };
    render_engines(model, speedup, std::slice::from_ref(&one))
}

/// Renders the engines' counters and request latencies as Prometheus text, labelled
/// `model_name`, and, when there is more than one engine, `engine="R"` (the index in
/// `engines`, as vLLM labels its data-parallel engines), one sample per engine under each
/// metric's one `# HELP`/`# TYPE`. Labels are sorted by name, as Python's `prometheus_client`
/// writes them (`{engine="1",le="0.5",model_name="m"}`). Times are in seconds of real time:
/// the prefill, inter-token, queue and decode times are the engine's model time divided by
/// `speedup`; `latencies` are measured in real time. The finished-request histograms (queue
/// time, decode time, prompt and generation tokens) count the engine's finished requests.
pub fn render_engines(model: &str, speedup: f64, engines: &[EngineStats]) -> String {
    let model = model.replace(['\\', '"', '\n'], "_");
    let engine_labels = match engines.len() {
        1 => vec![String::new()],
        _ => (0..engines.len())
            .map(|r| format!("engine=\"{r}\","))
            .collect(),
    };
    let mut out = Text {
        s: String::new(),
        model,
        engines: engines.iter().zip(engine_labels).collect(),
    };
    out.metric(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        |e| e.counters.running.to_string(),
    );
    out.metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        |e| e.counters.waiting.to_string(),
    );
    out.metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        |e| format!("{:.6}", e.counters.kv_usage),
    );
    out.metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        |e| e.counters.prefix_cache_queries.to_string(),
    );
    out.metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        |e| e.counters.prefix_cache_hits.to_string(),
    );
    out.metric(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        |e| e.counters.prompt_tokens_computed.to_string(),
    );
    out.metric(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        |e| e.counters.generation_tokens.to_string(),
    );
    out.metric(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemptions.",
        |e| e.counters.preemptions.to_string(),
    );
    out.metric(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        |e| e.counters.finished.to_string(),
    );
    let seconds = |us: u64| us as f64 / 1e6 / speedup;
    out.histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        |c| (seconds(c.prefill_time_us), c.prefills),
    );
    out.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        |c| (seconds(c.inter_token_time_us), c.inter_tokens),
    );
    out.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        |c| (seconds(c.queue_time_us), c.finished),
    );
    out.histogram(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        |c| (seconds(c.decode_time_us), c.finished),
    );
    out.histogram(
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        |c| (c.request_prompt_tokens as f64, c.finished),
    );
    out.histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        |c| (c.request_generation_tokens as f64, c.finished),
    );
    out.buckets(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        |l| &l.ttft,
    );
    out.buckets(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        |l| &l.e2e,
    );
    out.metric(
        "kvroute_sim:requests_received_total",
        "counter",
        "Generation requests accepted by the fake server.",
        |e| e.requests_total.to_string(),
    );
    out.s
}

/// `vllm:cache_config_info`: the engines' cache configuration as vLLM exports it, an info gauge
/// of value 1 whose labels carry the settings (here `block_size`, `enable_prefix_caching` and
/// `num_gpu_blocks`; vLLM adds more), one sample per engine, labelled `engine="R"` when there
/// are several, labels sorted by name.
pub fn render_cache_config(engine: &crate::engine::EngineConfig, engines: usize) -> String {
    let name = "vllm:cache_config_info";
    let mut s =
        format!("# HELP {name} Information of the LLMEngine CacheConfig\n# TYPE {name} gauge\n");
    let caching = if engine.prefix_caching {
        "True"
    } else {
        "False"
    };
    for rank in 0..engines {
        let label = if engines > 1 {
            format!("engine=\"{rank}\",")
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "{name}{{block_size=\"{}\",enable_prefix_caching=\"{caching}\",{label}num_gpu_blocks=\"{}\"}} 1.0",
            engine.block_size, engine.kv_capacity_blocks
        );
    }
    s
}

/// `kvroute_sim_faults_total{kind="..."}`: faults injected so far, one sample per kind.
pub fn render_faults(injected: &[(super::fault::FaultKind, u64)]) -> String {
    let name = "kvroute_sim_faults_total";
    let mut s = format!(
        "# HELP {name} Faults injected by the fake server (status answers, stalls, dropped connections).\n# TYPE {name} counter\n"
    );
    for (kind, n) in injected {
        let _ = writeln!(s, "{name}{{kind=\"{}\"}} {n}", kind.label());
    }
    s
}

/// The text being written, the `model_name` label value, and each engine with the labels
/// that sort before `le` (`engine="R",`, or nothing for a lone engine).
struct Text<'a> {
    s: String,
    model: String,
    engines: Vec<(&'a EngineStats, String)>,
}

impl Text<'_> {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.s, "# HELP {name} {help}");
        let _ = writeln!(self.s, "# TYPE {name} {kind}");
    }

    fn metric(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        value: impl Fn(&EngineStats) -> String,
    ) {
        self.head(name, kind, help);
        let model = &self.model;
        for (e, engine) in &self.engines {
            let _ = writeln!(
                self.s,
                "{name}{{{engine}model_name=\"{model}\"}} {}",
                value(e)
            );
        }
    }

    /// A histogram with only the `+Inf` bucket: the engine keeps sums and counts, not
    /// distributions. `sum_count` gives an engine's (sum, count).
    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        sum_count: impl Fn(&EngineCounters) -> (f64, u64),
    ) {
        self.head(name, "histogram", help);
        let model = &self.model;
        for (e, engine) in &self.engines {
            let (sum, count) = sum_count(&e.counters);
            let _ = writeln!(
                self.s,
                "{name}_bucket{{{engine}le=\"+Inf\",model_name=\"{model}\"}} {count}"
            );
            let _ = writeln!(
                self.s,
                "{name}_sum{{{engine}model_name=\"{model}\"}} {sum:.6}"
            );
            let _ = writeln!(
                self.s,
                "{name}_count{{{engine}model_name=\"{model}\"}} {count}"
            );
        }
    }

    /// A histogram with all its buckets. `le` is written as Python's `prometheus_client` writes
    /// it (`0.001`, `1.0`, `2560.0`, `+Inf`), so that selectors such as `le="2.5"` match.
    fn buckets(&mut self, name: &str, help: &str, of: impl Fn(&Latencies) -> &Histogram) {
        self.head(name, "histogram", help);
        let model = &self.model;
        for (e, engine) in &self.engines {
            let h = of(&e.latencies);
            for (le, n) in h.cumulative() {
                let le = if le.is_finite() {
                    format!("{le:?}")
                } else {
                    "+Inf".to_owned()
                };
                let _ = writeln!(
                    self.s,
                    "{name}_bucket{{{engine}le=\"{le}\",model_name=\"{model}\"}} {n}"
                );
            }
            let _ = writeln!(
                self.s,
                "{name}_sum{{{engine}model_name=\"{model}\"}} {:.6}",
                h.sum()
            );
            let _ = writeln!(
                self.s,
                "{name}_count{{{engine}model_name=\"{model}\"}} {}",
                h.count()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_with_le_as_vllm_writes_it() {
        let mut l = Latencies::default();
        for v in [0.0005, 0.001, 2.4, 2.5, 3.0, 9999.0] {
            l.ttft.observe(v);
        }
        l.e2e.observe(4.0);
        let text = render("m", &EngineCounters::default(), 0, 1.0, &l);
        let line = |series: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {series} in\n{text}"))
                .to_owned()
        };
        let ttft = "vllm:time_to_first_token_seconds";
        assert_eq!(
            line(&format!("{ttft}_bucket{{le=\"0.001\",model_name=\"m\"}}")),
            "2"
        );
        assert_eq!(
            line(&format!("{ttft}_bucket{{le=\"1.0\",model_name=\"m\"}}")),
            "2"
        );
        assert_eq!(
            line(&format!("{ttft}_bucket{{le=\"2.5\",model_name=\"m\"}}")),
            "4"
        );
        assert_eq!(
            line(&format!("{ttft}_bucket{{le=\"2560.0\",model_name=\"m\"}}")),
            "5"
        );
        assert_eq!(
            line(&format!("{ttft}_bucket{{le=\"+Inf\",model_name=\"m\"}}")),
            "6"
        );
        assert_eq!(line(&format!("{ttft}_count{{model_name=\"m\"}}")), "6");
        assert_eq!(
            line(&format!("{ttft}_sum{{model_name=\"m\"}}")),
            "10006.901500"
        );
        assert_eq!(
            text.matches(&format!("{ttft}_bucket")).count(),
            TTFT_BUCKETS.len() + 1
        );
        let e2e = "vllm:e2e_request_latency_seconds";
        assert_eq!(
            line(&format!("{e2e}_bucket{{le=\"2.5\",model_name=\"m\"}}")),
            "0"
        );
        assert_eq!(
            line(&format!("{e2e}_bucket{{le=\"5.0\",model_name=\"m\"}}")),
            "1"
        );
        assert_eq!(line(&format!("{e2e}_count{{model_name=\"m\"}}")), "1");
        assert_eq!(
            text.matches(&format!("{e2e}_bucket")).count(),
            E2E_BUCKETS.len() + 1
        );
        assert!(text.contains(&format!("# TYPE {ttft} histogram\n")));
        assert!(text.contains(&format!("# TYPE {e2e} histogram\n")));
    }

    #[test]
    fn several_engines_get_one_sample_each_labelled_engine_under_one_type_line() {
        let engine = |running: u32, finished: u64, ttft: f64| {
            let mut latencies = Latencies::default();
            latencies.ttft.observe(ttft);
            EngineStats {
                counters: EngineCounters {
                    running,
                    finished,
                    ..EngineCounters::default()
                },
                requests_total: finished + u64::from(running),
                latencies,
            }
        };
        let text = render_engines("m", 1.0, &[engine(2, 5, 0.3), engine(0, 1, 3.0)]);
        for line in [
            "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2",
            "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 0",
            "vllm:request_success_total{engine=\"0\",model_name=\"m\"} 5",
            "vllm:request_success_total{engine=\"1\",model_name=\"m\"} 1",
            "vllm:request_queue_time_seconds_bucket{engine=\"1\",le=\"+Inf\",model_name=\"m\"} 1",
            "vllm:request_queue_time_seconds_count{engine=\"0\",model_name=\"m\"} 5",
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.5\",model_name=\"m\"} 1",
            "vllm:time_to_first_token_seconds_bucket{engine=\"1\",le=\"0.5\",model_name=\"m\"} 0",
            "vllm:time_to_first_token_seconds_count{engine=\"1\",model_name=\"m\"} 1",
            "kvroute_sim:requests_received_total{engine=\"0\",model_name=\"m\"} 7",
            "kvroute_sim:requests_received_total{engine=\"1\",model_name=\"m\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        // Every sample is one engine's: none is unlabelled, and each TYPE line comes once.
        let samples = text.lines().filter(|l| !l.starts_with('#'));
        assert!(samples.clone().all(|l| l.contains("{engine=\"")), "{text}");
        assert_eq!(
            samples.filter(|l| l.contains("engine=\"1\"")).count() * 2,
            text.lines().filter(|l| !l.starts_with('#')).count()
        );
        assert_eq!(text.matches("# TYPE vllm:num_requests_running ").count(), 1);
        // One engine: no engine label at all.
        assert!(!render_engines("m", 1.0, &[engine(1, 1, 1.0)]).contains("engine="));
        let config = crate::engine::EngineConfig::default();
        assert_eq!(
            render_cache_config(&config, 2).lines().skip(2).collect::<Vec<_>>(),
            [
                "vllm:cache_config_info{block_size=\"1568\",enable_prefix_caching=\"True\",engine=\"0\",num_gpu_blocks=\"160\"} 1.0",
                "vllm:cache_config_info{block_size=\"1568\",enable_prefix_caching=\"True\",engine=\"1\",num_gpu_blocks=\"160\"} 1.0",
            ]
        );
        assert!(!render_cache_config(&config, 1).contains("engine="));
    }

    #[test]
    fn finished_request_histograms_count_finished_requests_in_real_seconds() {
        let c = EngineCounters {
            finished: 4,
            queue_time_us: 3_000_000,
            decode_time_us: 9_000_000,
            request_prompt_tokens: 4_000,
            request_generation_tokens: 410,
            ..EngineCounters::default()
        };
        let text = render("m", &c, 5, 2.0, &Latencies::default());
        for (name, sum) in [
            ("vllm:request_queue_time_seconds", "1.500000"),
            ("vllm:request_decode_time_seconds", "4.500000"),
            ("vllm:request_prompt_tokens", "4000.000000"),
            ("vllm:request_generation_tokens", "410.000000"),
        ] {
            for line in [
                format!("# TYPE {name} histogram"),
                format!("{name}_bucket{{le=\"+Inf\",model_name=\"m\"}} 4"),
                format!("{name}_sum{{model_name=\"m\"}} {sum}"),
                format!("{name}_count{{model_name=\"m\"}} 4"),
            ] {
                assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
            }
        }
    }
}
