//! `/metrics` in vLLM's Prometheus names.

use std::fmt::Write;

use crate::engine::EngineCounters;

/// Renders the engine's counters as Prometheus text, labelled `model_name`.
pub fn render(model: &str, c: &EngineCounters, requests_total: u64) -> String {
    let model = model.replace(['\\', '"', '\n'], "_");
    let mut s = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} {kind}");
        let _ = writeln!(s, "{name}{{model_name=\"{model}\"}} {value}");
    };
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        c.running.to_string(),
    );
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        c.waiting.to_string(),
    );
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        format!("{:.6}", c.kv_usage),
    );
    metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        c.prefix_cache_queries.to_string(),
    );
    metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        c.prefix_cache_hits.to_string(),
    );
    metric(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        c.prompt_tokens_computed.to_string(),
    );
    metric(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        c.generation_tokens.to_string(),
    );
    metric(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemptions.",
        c.preemptions.to_string(),
    );
    metric(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        c.finished.to_string(),
    );
    metric(
        "kvroute_sim:requests_received_total",
        "counter",
        "Generation requests accepted by the fake server.",
        requests_total.to_string(),
    );
    s
}
