//! vLLM's Prometheus text, read into what the scraper hands on: the engine snapshot
//! ([`parse`], [`parse_engine`]) and the KV block size ([`engine_block_tokens`]).

use kvroute_core::EngineSnapshot;

use super::ScrapeError;

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

/// One sample line: its metric name, its labels' text (between the braces, as written), and
/// value.
struct Sample<'a> {
    name: &'a str,
    labels: &'a str,
    value: f64,
}

impl<'a> Sample<'a> {
    /// The value of label `key`, as written between its quotes (escapes not decoded).
    fn label(&self, key: &str) -> Option<&'a str> {
        label_pairs(self.labels)
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    /// vLLM's engine index (`engine` label).
    fn engine(&self) -> Option<&'a str> {
        self.label("engine")
    }
}

/// The `key="value"` pairs of a label text that starts just after `{`, in order, up to the
/// closing brace outside quotes (its offset then in [`LabelPairs::end`]) or the text's end.
fn label_pairs(labels: &str) -> LabelPairs<'_> {
    LabelPairs {
        labels,
        at: 0,
        end: None,
    }
}

struct LabelPairs<'a> {
    labels: &'a str,
    at: usize,
    /// Offset of the closing brace, once found.
    end: Option<usize>,
}

impl<'a> Iterator for LabelPairs<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        if self.end.is_some() {
            return None;
        }
        let rest = &self.labels[self.at..];
        let mut value_start = None;
        let mut escaped = false;
        for (i, c) in rest.char_indices() {
            match (c, value_start) {
                (_, Some(_)) if escaped => escaped = false,
                ('\\', Some(_)) => escaped = true,
                ('"', Some(start)) => {
                    let key = rest[..start].trim_start_matches([',', ' ']);
                    let key = key.trim_end().strip_suffix('=').unwrap_or(key).trim();
                    let value = &rest[start + 1..i];
                    self.at += i + 1;
                    return Some((key, value));
                }
                ('"', None) => value_start = Some(i),
                ('}', None) => {
                    self.end = Some(self.at + i);
                    return None;
                }
                _ => {}
            }
        }
        None
    }
}

/// Splits one sample line into its metric name, labels and value; `None` for comments, blank
/// lines and lines that do not parse (a label text without its closing brace included).
fn sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = "";
    if let Some(text) = rest.strip_prefix('{') {
        let mut pairs = label_pairs(text);
        pairs.by_ref().for_each(drop);
        let close = pairs.end?;
        labels = &text[..close];
        rest = &text[close + 1..];
    }
    let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
    value.is_finite().then_some(Sample {
        name,
        labels,
        value,
    })
}

/// The KV block size in tokens the engine reports: the `block_size` label of
/// `vllm:cache_config_info` (vLLM's cache configuration as an info gauge; for hybrid models
/// the attention block size vLLM settled on), for engine `rank` when given (a series without
/// an `engine` label counts for every engine). `None` when absent or not a positive whole
/// number; when several series disagree, the largest.
pub fn engine_block_tokens(text: &str, rank: Option<u32>) -> Option<u32> {
    cache_configs(text, rank)
        .filter_map(|x| positive_label(&x, "block_size"))
        .max()
}

/// The size of the engine's KV cache in tokens: `num_gpu_blocks` × `block_size`, labels of
/// `vllm:cache_config_info` (vLLM's "GPU KV cache size"), for engine `rank` as in
/// [`engine_block_tokens`]; when several series count, the smallest. `None` when no series
/// has both as positive whole numbers.
fn kv_cache_tokens(text: &str, rank: Option<u32>) -> Option<u64> {
    cache_configs(text, rank)
        .filter_map(|x| {
            let blocks = u64::from(positive_label(&x, "num_gpu_blocks")?);
            Some(blocks * u64::from(positive_label(&x, "block_size")?))
        })
        .min()
}

/// The `vllm:cache_config_info` samples that count for engine `rank` (all when `None`; a
/// series without an `engine` label counts for every engine).
fn cache_configs(text: &str, rank: Option<u32>) -> impl Iterator<Item = Sample<'_>> {
    let rank = rank.map(|r| r.to_string());
    text.lines()
        .filter(|l| l.trim_start().starts_with("vllm:cache_config_info"))
        .filter_map(sample)
        .filter(|x| x.name == "vllm:cache_config_info")
        .filter(move |x| rank.is_none() || x.engine().is_none() || x.engine() == rank.as_deref())
}

/// Label `key` as a positive whole number.
fn positive_label(x: &Sample<'_>, key: &str) -> Option<u32> {
    x.label(key)?.parse::<u32>().ok().filter(|&n| n > 0)
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
/// request may wait on), clamped to [0, 1]; the KV cache's size in tokens is `num_gpu_blocks` ×
/// `block_size` of `vllm:cache_config_info` (the smallest engine's). Missing metrics stay `None`
/// (running and waiting: 0), but a text with neither running nor waiting is not an engine's:
/// [`ScrapeError::NoEngineMetrics`]. Negative values count as 0.
pub fn parse(text: &str) -> Result<EngineSnapshot, ScrapeError> {
    parse_engine(text, None)
}

/// As [`parse`], counting only the series labelled `engine="RANK"` when `rank` is given: one
/// engine of a data-parallel server ([`crate::data_parallel`]). A text with no running or
/// waiting series for that engine is [`ScrapeError::NoEngineMetrics`].
pub fn parse_engine(text: &str, rank: Option<u32>) -> Result<EngineSnapshot, ScrapeError> {
    let label = rank.map(|r| r.to_string());
    let mut s = Sums::default();
    let samples = text
        .lines()
        .filter_map(sample)
        .filter(|x| label.is_none() || x.engine() == label.as_deref());
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
        kv_cache_tokens: kv_cache_tokens(text, rank),
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

/// A vLLM page with two engines, odd label values and series kvroute does not read (tests).
#[cfg(test)]
pub(super) const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="1568",cache_dtype="auto",engine="0",num_gpu_blocks="160"} 1.0
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_text_is_summed_over_label_sets() {
        let s = parse(VLLM).unwrap();
        assert_eq!(
            s,
            EngineSnapshot {
                running: 5,
                waiting: 4,
                kv_usage: Some(0.5),
                kv_cache_tokens: Some(160 * 1568),
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
    fn the_engine_block_size_is_read_from_cache_config_info() {
        assert_eq!(engine_block_tokens(VLLM, None), Some(1568));
        assert_eq!(engine_block_tokens(VLLM, Some(0)), Some(1568));
        assert_eq!(engine_block_tokens(VLLM, Some(1)), None, "engine 0's only");
        // Labels in any order, quoted and escaped values skipped correctly; a series without an
        // engine label counts for every engine; the largest of disagreeing series.
        let text = "vllm:cache_config_info{a=\"x,\\\"block_size=\\\"9\",block_size=\"16\"} 1\n\
                    vllm:cache_config_info_other{block_size=\"64\"} 1\n\
                    vllm:cache_config_info{engine=\"1\",block_size=\"32\"} 1\n";
        assert_eq!(engine_block_tokens(text, None), Some(32));
        assert_eq!(engine_block_tokens(text, Some(0)), Some(16));
        assert_eq!(engine_block_tokens(text, Some(1)), Some(32));
        for bad in [
            "",
            "vllm:cache_config_info 1\n",
            "vllm:cache_config_info{block_size=\"0\"} 1\n",
            "vllm:cache_config_info{block_size=\"-16\"} 1\n",
            "vllm:cache_config_info{block_size=\"16.5\"} 1\n",
            "vllm:cache_config_info{block_size=\"16\" 1\n",
            "vllm:cache_config_info{num_gpu_blocks=\"16\"} 1\n",
        ] {
            assert_eq!(engine_block_tokens(bad, None), None, "{bad:?}");
        }
    }

    #[test]
    fn the_kv_cache_size_is_read_from_cache_config_info() {
        let running = "vllm:num_requests_running 1\n";
        let size = |config: &str, rank| {
            let text = format!("{running}{config}");
            parse_engine(&text, rank).ok()?.kv_cache_tokens
        };
        let one = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n";
        assert_eq!(size(one, None), Some(16_000));
        // Several engines behind one address: the smallest cache; per engine, its own (a
        // series without an engine label counts for every engine).
        let two = "vllm:num_requests_running{engine=\"0\"} 1\n\
                   vllm:num_requests_running{engine=\"1\"} 1\n\
                   vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"1000\"} 1\n\
                   vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"800\"} 1\n";
        assert_eq!(size(two, None), Some(12_800));
        assert_eq!(size(two, Some(0)), Some(16_000));
        assert_eq!(size(two, Some(1)), Some(12_800));
        assert_eq!(parse_engine(VLLM, Some(1)).unwrap().kv_cache_tokens, None);
        for bad in [
            "",
            "vllm:cache_config_info{block_size=\"16\"} 1\n",
            "vllm:cache_config_info{num_gpu_blocks=\"16\"} 1\n",
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"0\"} 1\n",
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"-5\"} 1\n",
        ] {
            assert_eq!(size(bad, None), None, "{bad:?}");
        }
    }
}
