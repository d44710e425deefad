//! Shared fixtures: the study's prompt shape and small router builders.
#![allow(dead_code)]

use kvroute_core::{PodId, PodSpec, Router, RouterConfig, Timestamp};

pub const MODEL: &str = "study";
pub const SENTENCE: &str =
    "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n";

/// The study's prompt: salt line, document number, the sentence 300 times, a question number.
pub fn study_prompt(salt: &str, family: usize, question: u32) -> String {
    format!(
        "{salt}\nDocument {family}\n{}Question {question:06}: Explain the operational tradeoffs in detail.",
        SENTENCE.repeat(300)
    )
}

/// 256 hex characters from a seeded PRNG.
pub fn salt(rng: &mut fastrand::Rng) -> String {
    (0..256)
        .map(|_| char::from(b"0123456789abcdef"[rng.usize(..16)]))
        .collect()
}

pub fn t(ms: u64) -> Timestamp {
    Timestamp::from_millis(ms)
}

/// A router with `n` ready pods named pod-0.. serving MODEL.
pub fn router_with_pods(n: usize, config: RouterConfig) -> (Router, Vec<PodId>) {
    let mut r = Router::new(config).expect("valid config");
    let pods = (0..n)
        .map(|i| {
            let name = format!("pod-{i}");
            let addr = format!("10.0.{}.{}:8000", i / 250, i % 250 + 1);
            r.add_pod(
                MODEL,
                PodSpec {
                    name: &name,
                    address: &addr,
                    ready: true,
                },
            )
            .expect("valid pod")
        })
        .collect();
    (r, pods)
}
