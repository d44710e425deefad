//! A fixed workload for instruction-count profiling of the route path (callgrind counts are
//! repeatable on a noisy machine, unlike wall time): fills the index to 200,000 blocks, then
//! hashes, routes and completes N study-shaped prompts inside `measured`.
//!
//! ```sh
//! cargo build --release -p kvroute-core --example profile_route
//! valgrind --tool=callgrind --toggle-collect='profile_route::measured' \
//!     target/release/examples/profile_route PODS N
//! ```
#![allow(clippy::disallowed_methods)] // a command-line harness, not part of the no-IO library

use kvroute_core::{BlockHash, Outcome, PodSpec, RouteRequest, Router, RouterConfig, Timestamp};
fn main() {
    let pods: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(2);
    let mut r = Router::new(RouterConfig {
        seed: 3,
        ..Default::default()
    })
    .unwrap();
    for i in 0..pods {
        let name = format!("pod-{i}");
        let addr = format!("10.{}.{}.1:8000", i / 200, i % 200);
        r.add_pod(
            "m",
            PodSpec {
                name: &name,
                address: &addr,
                ready: true,
            },
        )
        .unwrap();
    }
    let mut rng = fastrand::Rng::with_seed(9);
    let mut now = 0;
    while r.index().len() < 200_000 {
        let h: Vec<BlockHash> = (0..218).map(|_| BlockHash(rng.u64(..))).collect();
        let d = r
            .route(RouteRequest::new("m", &h), Timestamp::from_millis(now))
            .unwrap();
        r.complete(
            d.ticket,
            Outcome::Success.into(),
            Timestamp::from_millis(now),
        )
        .unwrap();
        now += 1;
    }
    let sentence = "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n".repeat(300);
    let salts: Vec<String> = (0..8)
        .map(|_| {
            (0..256)
                .map(|_| char::from(b"0123456789abcdef"[rng.usize(..16)]))
                .collect()
        })
        .collect();
    let prompts: Vec<Vec<u8>> = (0..1024)
        .map(|i| {
            format!(
                "{}\nDocument {}\n{sentence}Question {:06}: x",
                salts[i % 8],
                i % 8,
                i
            )
            .into_bytes()
        })
        .collect();
    let mut scratch = Vec::new();
    let n: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(2000);
    measured(&mut r, &prompts, &mut scratch, n, now);
}
#[inline(never)]
fn measured(
    r: &mut Router,
    prompts: &[Vec<u8>],
    scratch: &mut Vec<BlockHash>,
    n: usize,
    mut now: u64,
) {
    for i in 0..n {
        now += 1;
        r.hash_config().hash_into(&prompts[i % 1024], scratch);
        let d = r
            .route(RouteRequest::new("m", scratch), Timestamp::from_millis(now))
            .unwrap();
        r.complete(
            d.ticket,
            Outcome::Success.into(),
            Timestamp::from_millis(now),
        )
        .unwrap();
    }
}
