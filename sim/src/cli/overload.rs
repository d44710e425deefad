//! `kvroute-sim overload`: the overload suite ([`crate::overload`]).

use std::process::ExitCode;

use clap::Args;

use crate::overload::{contenders, goodput_ratios, render, run_suite, suite, suite_policy};
use crate::study::StudyConfig;

/// `kvroute-sim overload` flags.
#[derive(Args, Debug)]
pub struct OverloadArgs {
    /// Seeds per workload and contender (salts, family order and arrival times drawn anew).
    #[arg(long, default_value_t = 4)]
    seeds: u64,
    /// Times a client sends a shed request again, `Retry-After` later (0: a 429 is final).
    #[arg(long, default_value_t = 0)]
    retries: u32,
    /// Admission's TTFT target, ms (the study's SLO: 2,000).
    #[arg(long, default_value_t = 2_000)]
    target_ms: u32,
    /// Longest a request is held, ms.
    #[arg(long, default_value_t = 2_000)]
    queue_timeout_ms: u64,
}

/// Runs the suite and prints its table and the goodput ratios.
pub fn overload_cmd(a: OverloadArgs) -> ExitCode {
    let policy = kvroute_core::AdmissionPolicy {
        ttft_target_ms: a.target_ms,
        queue_timeout_ms: a.queue_timeout_ms,
        ..suite_policy()
    };
    if let Err(e) = policy.validate() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let workloads = suite();
    let contenders = contenders(policy);
    let started = std::time::Instant::now();
    let results = match run_suite(
        &StudyConfig::default(),
        &workloads,
        &contenders,
        a.seeds.max(1),
        a.retries,
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", render(&workloads, &contenders, &results));
    println!();
    println!("| workload | goodput with admission ÷ best of random, least-request, prefix-cache |");
    println!("|---|---|");
    for (w, _, ratio) in goodput_ratios(&workloads, &contenders, &results) {
        println!("| {w} | {ratio:.2} |");
    }
    eprintln!(
        "simulated {} runs in {:.1} s",
        results.values().map(Vec::len).sum::<usize>(),
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
