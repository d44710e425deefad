//! `/metrics` of the fake server: the latency histograms it measures in real time and the
//! engine's histograms, in vLLM's names and buckets.

use super::*;

/// The value of a `/metrics` sample as a float.
fn sample_f64(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in\n{metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_ttft_and_e2e_histograms_in_vllm_buckets_and_real_time() {
    // Twice as fast as the model: a 1,000-token prompt's prefill step takes
    // 33 ms + 1,000 × 300 µs = 333 ms of model time, 166.5 ms of real time; each of the 3
    // decode steps after it 36 ms, 18 ms real.
    let (url, _stop) = start("vllm-t", 2.0).await;
    let c = client();
    let ttft = "vllm:time_to_first_token_seconds";
    let e2e = "vllm:e2e_request_latency_seconds";
    let series = |name: &str, part: &str| format!("{name}_{part}{{model_name=\"study\"}}");
    let bucket =
        |name: &str, le: &str| format!("{name}_bucket{{le=\"{le}\",model_name=\"study\"}}");

    // Exported, empty, before any request (so Prometheus's rate() sees the first one).
    let (_, m) = get(&c, &url, "/metrics").await;
    for name in [ttft, e2e] {
        assert!(m.contains(&format!("# TYPE {name} histogram\n")), "{m}");
        assert_eq!(sample(&m, &series(name, "count")), 0);
        assert_eq!(sample(&m, &bucket(name, "+Inf")), 0);
    }
    assert_eq!(sample(&m, &bucket(ttft, "2.5")), 0);

    let prompt: Vec<u32> = (1..=1000).collect();
    let body = serde_json::json!({"model": "study", "prompt": prompt, "max_tokens": 4}).to_string();
    let sent = Instant::now();
    let (status, _, text) = post(&c, &url, "/v1/completions", &[], &body).await;
    let elapsed = sent.elapsed().as_secs_f64();
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], 1000);

    let (_, m) = get(&c, &url, "/metrics").await;
    assert_eq!(sample(&m, &series(ttft, "count")), 1, "{m}");
    assert_eq!(sample(&m, &series(e2e, "count")), 1, "{m}");
    let t = sample_f64(&m, &series(ttft, "sum"));
    let e = sample_f64(&m, &series(e2e, "sum"));
    // Never faster than the model, never longer than the client waited. The engine
    // schedules steps against deadlines, so a late step shortens the next: the decode
    // steps' 54 ms may be a little less after the TTFT was recorded late.
    assert!(
        (0.1665..elapsed).contains(&t),
        "TTFT {t} s, request {elapsed} s"
    );
    assert!(
        (t + 0.045..=elapsed).contains(&e),
        "E2E {e} s, TTFT {t} s, request {elapsed} s"
    );
    // Cumulative buckets: nothing at or below 0.1 s, the one request in +Inf.
    assert_eq!(sample(&m, &bucket(ttft, "0.1")), 0, "{m}");
    assert_eq!(sample(&m, &bucket(ttft, "+Inf")), 1, "{m}");
    assert_eq!(sample(&m, &bucket(e2e, "+Inf")), 1, "{m}");
    assert_eq!(
        m.matches(&format!("{ttft}_bucket{{")).count(),
        kvroute_sim::serve::metrics::TTFT_BUCKETS.len() + 1
    );
    assert_eq!(
        m.matches(&format!("{e2e}_bucket{{")).count(),
        kvroute_sim::serve::metrics::E2E_BUCKETS.len() + 1
    );
}

/// The finished-request histograms `least-latency` and `throughput` read through
/// kvroute-ext-proc's scrape (`vllm:request_queue_time_seconds`,
/// `vllm:request_decode_time_seconds`, `vllm:request_prompt_tokens`,
/// `vllm:request_generation_tokens`, as `_sum` and `_count` summed over label sets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_the_finished_request_histograms_in_vllms_names() {
    // One sequence at a time: of two requests sent together, one waits for the other.
    let speedup = 10.0;
    let cfg = ServeConfig {
        engine: EngineConfig {
            max_num_seqs: 1,
            ..EngineConfig::default()
        },
        ..config("vllm-q", speedup, FaultSpec::default())
    };
    let (url, _stop) = start_config(cfg).await;
    let c = client();
    let [queue, decode, prompt, generation] = [
        "vllm:request_queue_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
    ];
    let series = |name: &str, part: &str| format!("{name}_{part}{{model_name=\"study\"}}");
    // Exported, empty, before any request: a scrape reads means of 0, not missing metrics.
    let (_, m) = get(&c, &url, "/metrics").await;
    for name in [queue, decode, prompt, generation] {
        assert!(m.contains(&format!("# TYPE {name} histogram\n")), "{m}");
        assert_eq!(sample(&m, &series(name, "count")), 0, "{m}");
        assert_eq!(sample_f64(&m, &series(name, "sum")), 0.0, "{m}");
    }

    let body = |tokens: u32, max_tokens: u32| {
        let prompt: Vec<u32> = (1..=tokens).collect();
        serde_json::json!({"model": "study", "prompt": prompt, "max_tokens": max_tokens})
            .to_string()
    };
    let (long, short) = (body(1000, 4), body(500, 3));
    let (a, b) = tokio::join!(
        post(&c, &url, "/v1/completions", &[], &long),
        post(&c, &url, "/v1/completions", &[], &short)
    );
    assert_eq!((a.0, b.0), (200, 200), "{} {}", a.2, b.2);

    let (_, m) = get(&c, &url, "/metrics").await;
    for name in [queue, decode, prompt, generation] {
        assert_eq!(sample(&m, &series(name, "count")), 2, "{m}");
        assert_eq!(
            sample(
                &m,
                &format!("{name}_bucket{{le=\"+Inf\",model_name=\"study\"}}")
            ),
            2,
            "{m}"
        );
    }
    assert_eq!(sample_f64(&m, &series(prompt, "sum")), 1500.0, "{m}");
    assert_eq!(sample_f64(&m, &series(generation, "sum")), 7.0, "{m}");
    // In the model's time over the speed-up: 3 + 2 decode steps of one sequence each, which
    // are also the requests' inter-token gaps.
    let step = EngineConfig::default().step;
    let seconds = |us: u64| us as f64 / 1e6 / speedup;
    let d = sample_f64(&m, &series(decode, "sum"));
    assert!((d - seconds(5 * step.step_us(1, 0))).abs() < 1e-5, "{m}");
    let itl = sample_f64(
        &m,
        "vllm:inter_token_latency_seconds_sum{model_name=\"study\"}",
    );
    assert!((d - itl).abs() < 1e-5, "{m}");
    // The second request waited for at least the first's decode steps and at most its whole
    // run (whichever came first).
    let q = sample_f64(&m, &series(queue, "sum"));
    let longest_run = step.step_us(0, 1000) + 3 * step.step_us(1, 0);
    assert!(
        (seconds(2 * step.step_us(1, 0)) - 1e-5..=seconds(longest_run) + 1e-5).contains(&q),
        "queue {q} s:\n{m}"
    );
}
