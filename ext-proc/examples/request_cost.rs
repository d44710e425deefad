//! The in-process cost of one routed request without any IO: body extraction (serde), prompt
//! hashing and `Router::route` + `complete`, for a study-shaped ~28 KB completions body.
//! `cargo run --release -p kvroute-ext-proc --example request_cost`

use std::time::Instant;

use kvroute_core::{Completion, Outcome, PodSpec, RouteRequest, Router, RouterConfig, Timestamp};
use kvroute_ext_proc::extract::{extract, Endpoint};

fn main() {
    let mut router = Router::new(RouterConfig {
        seed: 1,
        ..Default::default()
    })
    .expect("config");
    for (name, addr) in [("a", "127.0.0.1:1"), ("b", "127.0.0.1:2")] {
        router
            .add_pod(
                "study",
                PodSpec {
                    name,
                    address: addr,
                    ready: true,
                },
            )
            .expect("pod");
    }
    let filler = "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n".repeat(300);
    let bodies: Vec<Vec<u8>> = (0..64)
        .map(|i| {
            let prompt = format!(
                "{:0256}\nDocument {}\n{filler}Question {i:06}: Explain.",
                i % 8,
                i % 8
            );
            serde_json::json!({ "model": "study", "prompt": prompt, "max_tokens": 1 })
                .to_string()
                .into_bytes()
        })
        .collect();
    let n = 20_000u32;
    let (mut t_extract, mut t_hash, mut t_route) = (0f64, 0f64, 0f64);
    for i in 0..n {
        let body = &bodies[i as usize % bodies.len()];
        let t0 = Instant::now();
        let x = extract(Endpoint::Completions, body).expect("body");
        let t1 = Instant::now();
        let hashes = router.hash_config().hashes(x.prompt.as_bytes());
        let t2 = Instant::now();
        let now = Timestamp::from_millis(u64::from(i));
        let d = router
            .route(
                RouteRequest::new(x.model.as_deref().unwrap_or(""), &hashes),
                now,
            )
            .expect("route");
        router
            .complete(d.ticket, Completion::new(Outcome::Success), now)
            .expect("complete");
        let t3 = Instant::now();
        t_extract += (t1 - t0).as_secs_f64();
        t_hash += (t2 - t1).as_secs_f64();
        t_route += (t3 - t2).as_secs_f64();
    }
    let us = |t: f64| t * 1e6 / f64::from(n);
    println!(
        "body {} bytes: extract {:.1} µs, hash {:.1} µs, route+complete {:.1} µs, total {:.1} µs per request",
        bodies[0].len(),
        us(t_extract),
        us(t_hash),
        us(t_route),
        us(t_extract + t_hash + t_route)
    );
}
