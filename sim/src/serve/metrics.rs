//! `/metrics` in vLLM's Prometheus names.

use std::fmt::Write;

use crate::engine::EngineCounters;

/// Renders the engine's counters as Prometheus text, labelled `model_name`. Times are in
/// seconds of real time: the engine's model time divided by `speedup`.
pub fn render(model: &str, c: &EngineCounters, requests_total: u64, speedup: f64) -> String {
    let model = model.replace(['\\', '"', '\n'], "_");
    let mut out = Text {
        s: String::new(),
        model,
    };
    out.metric(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        c.running.to_string(),
    );
    out.metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        c.waiting.to_string(),
    );
    out.metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        format!("{:.6}", c.kv_usage),
    );
    out.metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        c.prefix_cache_queries.to_string(),
    );
    out.metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        c.prefix_cache_hits.to_string(),
    );
    out.metric(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        c.prompt_tokens_computed.to_string(),
    );
    out.metric(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        c.generation_tokens.to_string(),
    );
    out.metric(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemptions.",
        c.preemptions.to_string(),
    );
    out.metric(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        c.finished.to_string(),
    );
    let seconds = |us: u64| us as f64 / 1e6 / speedup;
    out.histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        seconds(c.prefill_time_us),
        c.prefills,
    );
    out.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        seconds(c.inter_token_time_us),
        c.inter_tokens,
    );
    out.metric(
        "kvroute_sim:requests_received_total",
        "counter",
        "Generation requests accepted by the fake server.",
        requests_total.to_string(),
    );
    out.s
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

/// The text being written, and the `model_name` label value.
struct Text {
    s: String,
    model: String,
}

impl Text {
    fn metric(&mut self, name: &str, kind: &str, help: &str, value: String) {
        let model = &self.model;
        let _ = writeln!(self.s, "# HELP {name} {help}");
        let _ = writeln!(self.s, "# TYPE {name} {kind}");
        let _ = writeln!(self.s, "{name}{{model_name=\"{model}\"}} {value}");
    }

    /// A histogram with only the `+Inf` bucket: the engine keeps sums and counts, not
    /// distributions.
    fn histogram(&mut self, name: &str, help: &str, sum: f64, count: u64) {
        let model = &self.model;
        let _ = writeln!(self.s, "# HELP {name} {help}");
        let _ = writeln!(self.s, "# TYPE {name} histogram");
        let _ = writeln!(
            self.s,
            "{name}_bucket{{le=\"+Inf\",model_name=\"{model}\"}} {count}"
        );
        let _ = writeln!(self.s, "{name}_sum{{model_name=\"{model}\"}} {sum:.6}");
        let _ = writeln!(self.s, "{name}_count{{model_name=\"{model}\"}} {count}");
    }
}
