//! Issue 6's evidence through Envoy, for kvroute-ext-proc and for the in-Envoy module alike:
//! the study's hot50 scenario replayed with prefix-cache then least-ttft, least-ttft must meet
//! the SLO for more requests, having learned the engines' rates from the responses it timed.

use super::*;

/// The kvroute configuration the check is made for (append it to the models' config): the
/// engine facts only, so that the rates must be learned.
///
/// In real time (kvroute measures wall-clock ms and the fake engine runs 5× faster than its
/// model, `serve --help` defaults: 300 µs per prefill token, a step of 33 ms + 3 ms per
/// sequence) the truth is about 16,667 prefill tokens/s and 11.4 ms per output token at 8
/// sequences; the default priors are 3,000 and 50. The timed responses' first tokens and
/// usage teach them (stream_timing.rs); before this, only the scraped
/// `vllm:request_prefill_time_seconds` windows did, and least-ttft got 58–96 within SLO here
/// (median 85 in 12 runs, then 59–96 in 8), its learned prefill rate 5,800–50,000. The tie
/// band is a decision threshold in wall-clock ms, not a prior: 60 ms here is the default
/// 300 ms of engine time. (Left at 300, it is 1.5 s of engine time, and the hot family stays
/// on its home until the home's predicted wait is that much worse than a cold spill:
/// least-ttft got 55–96 within SLO, median 58, in 10 runs; with 60, 58–96, median 85, in 12;
/// both before responses were timed.)
pub const CONFIG: &str = "[ttft]\nengine_block_tokens = 1568\nmax_seqs = 8\ntie_ms = 60\n\
                          [engine_metrics]\nscrape_interval_ms = 200\n";

/// Within-SLO count of `strategy`'s phase in `kvroute-sim replay`'s summary table
/// (`| hot50 / 1 | STRATEGY | TTFT P95 | TPOT P95 | token hit | SLO | split |`).
pub fn within_slo(summary: &str, strategy: &str) -> Option<u32> {
    summary.lines().find_map(|l| {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        (cells.len() >= 8 && cells[1].starts_with("hot50") && cells[2] == strategy)
            .then(|| cells[6].parse().ok())
            .flatten()
    })
}

/// Runs `kvroute-sim replay --scenario hot50` through the gateway at `listen` in front of
/// `sims` (speed-up 5) and checks the outcome and what kvroute (admin address `admin`)
/// learned. About 30 s of wall time.
pub fn replay_and_check(listen: &str, sims: &[Sim], admin: &str) {
    let direct: Vec<String> = sims.iter().map(|x| format!("http://{}", x.addr)).collect();
    let out = std::process::Command::new(sim_bin())
        .args(["replay", "--url", &format!("http://{}", listen)])
        .args(["--scenario", "hot50", "--requests", "96", "--speedup", "5"])
        .args(["--strategy", "prefix-cache", "--strategy", "least-ttft"])
        .arg("--direct")
        .args(&direct)
        .arg("--quiet")
        .output()
        .expect("run kvroute-sim replay");
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{summary}");
    assert!(
        out.status.success(),
        "replay failed: {summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pc = within_slo(&summary, "prefix-cache").expect("no prefix-cache row");
    let lt = within_slo(&summary, "least-ttft").expect("no least-ttft row");
    println!("within SLO through Envoy: prefix-cache {pc}/96, least-ttft {lt}/96");
    assert!(
        summary.contains("least_ttft="),
        "least-ttft decisions missing"
    );
    // The simulator's hot50 phases give least-ttft 96 of 96 and prefix-cache 45 (sim/README.md);
    // through Envoy, with rates learned from a sample of timed responses, 96 via ext_proc and
    // 89-95 in the module in the runs measured (2026-12, this 2-core machine, shared). At most
    // 10% lost to the real clock (the run is in real time at speed-up 5: a stalled process
    // delays whole requests); prefix-cache stays near half.
    assert!(lt > pc, "least-ttft {lt} ≤ prefix-cache {pc}:\n{summary}");
    assert!(lt >= 87, "least-ttft {lt} of 96 within SLO:\n{summary}");
    // Responses were timed, the engines scraped, the rates learned, and no slot leaked.
    // Learned TPOT and prefill rate: within a factor 2 of the truth (11.4 ms and 16,667
    // tokens/s; the priors are 50 and 3,000).
    let m = http(admin, "GET", "/metrics", &[], b"").text();
    let bytes_per_token = m.lines().find_map(|l| {
        l.strip_prefix("kvroute_ttft_prompt_bytes_per_token ")?
            .parse::<f64>()
            .ok()
    });
    println!("learned prompt bytes per token: {bytes_per_token:?}");
    for pod in ["replica-a", "replica-b"] {
        let prefill = gauge_value(&m, "kvroute_ttft_prefill_tokens_per_second", pod);
        let tpot = gauge_value(&m, "kvroute_ttft_time_per_output_token_seconds", pod);
        let overhead = gauge_value(&m, "kvroute_ttft_overhead_seconds", pod);
        println!(
            "learned for {pod}: prefill {prefill:.0} tokens/s, TPOT {:.1} ms, overhead {:.1} ms",
            tpot * 1e3,
            overhead * 1e3
        );
        assert!(
            (8_333.0..=33_333.0).contains(&prefill),
            "{pod} prefill {prefill}\n{m}"
        );
        assert!((0.0057..=0.0228).contains(&tpot), "{pod} TPOT {tpot}\n{m}");
    }
    assert!(
        m.contains("kvroute_engine_requests_running{pod=\"replica-a\"}"),
        "{m}"
    );
    // Every timed response's first token was held against its prediction, once.
    assert_eq!(
        metric_sum(&m, "kvroute_ttft_calibration_samples_total"),
        metric_sum(&m, "kvroute_timed_responses_total"),
        "{m}"
    );
    for wait in ["none", "predicted"] {
        let sum = |name: &str| -> f64 {
            m.lines()
                .filter(|l| l.starts_with(name) && l.contains(&format!("wait=\"{wait}\"")))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        let n = sum("kvroute_ttft_calibration_samples_total");
        let error = (sum("kvroute_ttft_calibration_observed_seconds_total")
            - sum("kvroute_ttft_calibration_predicted_seconds_total"))
            / n;
        let abs = sum("kvroute_ttft_calibration_abs_error_seconds_total") / n;
        println!(
            "calibration, wait={wait}: {n} requests, mean error {:+.0} ms, mean |error| {:.0} ms",
            error * 1e3,
            abs * 1e3
        );
    }
    let timed = metric_sum(&m, "kvroute_timed_responses_total");
    println!("responses timed: {timed} of 192 (+ 16 priming)");
    assert!(timed > 0, "{m}");
    assert_eq!(
        metric_sum(&m, "kvroute_timed_responses_without_body_total"),
        0,
        "the shipped Envoy configuration passes timed bodies through kvroute\n{m}"
    );
    assert_eq!(
        metric_sum(&m, "kvroute_engine_scrape_errors_total"),
        0,
        "{m}"
    );
}
