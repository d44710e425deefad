//! Route cost on the study's prompt shape, against a hash-only baseline measured in the same run.
//!
//! - `baseline/xxh64_once`: one XXH64 over the whole ~28 KB prompt (the cheapest thing any
//!   prefix router must do per request).
//! - `route/prefix-cache/{2,16,256}`: the full per-request core work a shell does: hash the
//!   prompt into blocks, `route` (match + select + index write + ticket), `complete`, with the
//!   index pre-filled to its 200,000-block capacity.
//! - `length/{route,xxh64_once}_kib/{1..512}`: the same for prompts from 1 KiB to 512 KiB (cost
//!   must be linear), each beside its own hash-only baseline.
//! - `loaded/{prefix-cache,least-ttft}/PODSxOPEN`: the same with `OPEN` requests open on each of
//!   `PODS` pods (each iteration routes one and completes the oldest, so the load stays put):
//!   least-ttft replays every candidate's open requests, prefix-cache (the baseline) does not.
//!
//! Run: `cargo bench -p kvroute-core --bench route`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::collections::VecDeque;

use kvroute_core::{
    BlockHash, Completion, Outcome, PodSpec, RouteRequest, Router, RouterConfig, Strategy,
    StrategySpec, Ticket, Timestamp,
};

const SENTENCE: &str =
    "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n";

fn salt(rng: &mut fastrand::Rng) -> String {
    (0..256)
        .map(|_| char::from(b"0123456789abcdef"[rng.usize(..16)]))
        .collect()
}

/// 8 families × `per_family` fresh question numbers, interleaved.
fn study_prompts(per_family: usize, repeats: usize) -> Vec<Vec<u8>> {
    let mut rng = fastrand::Rng::with_seed(7);
    let salts: Vec<String> = (0..8).map(|_| salt(&mut rng)).collect();
    let body = SENTENCE.repeat(repeats);
    (0..per_family * 8)
        .map(|i| {
            let f = i % 8;
            format!("{}\nDocument {f}\n{body}Question {:06}: Explain the operational tradeoffs in detail.", salts[f], 100_000 + i)
                .into_bytes()
        })
        .collect()
}

/// A router with `pods` ready pods and its index filled to capacity with unrelated prompts.
fn filled_router(pods: usize) -> Router {
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
    let capacity = r.config().index_capacity;
    let mut now = 0;
    while r.index().len() < capacity {
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
    r
}

fn route_once(r: &mut Router, prompt: &[u8], scratch: &mut Vec<BlockHash>, now: u64) {
    r.hash_config().hash_into(prompt, scratch);
    let d = r
        .route(RouteRequest::new("m", scratch), Timestamp::from_millis(now))
        .unwrap();
    r.complete(
        d.ticket,
        Completion::new(Outcome::Success),
        Timestamp::from_millis(now),
    )
    .unwrap();
    black_box(d);
}

fn study_shape(c: &mut Criterion) {
    let prompts = study_prompts(128, 300);
    let len = prompts[0].len();
    let mut g = c.benchmark_group("study_prompt");
    g.throughput(Throughput::Bytes(len as u64));
    let mut i = 0usize;
    g.bench_function("baseline/xxh64_once", |b| {
        b.iter(|| {
            i += 1;
            black_box(xxhash_rust::xxh64::xxh64(&prompts[i % prompts.len()], 0))
        })
    });
    let cfg = kvroute_core::HashConfig::new(128, 0).unwrap();
    let mut scratch = Vec::new();
    g.bench_function("hash_blocks", |b| {
        b.iter(|| {
            i += 1;
            cfg.hash_into(&prompts[i % prompts.len()], &mut scratch);
            black_box(scratch.len())
        })
    });
    for pods in [2usize, 16, 256] {
        let mut r = filled_router(pods);
        let mut now = 10_000_000u64;
        g.bench_with_input(
            BenchmarkId::new("route/prefix-cache", pods),
            &pods,
            |b, _| {
                b.iter(|| {
                    i += 1;
                    now += 1;
                    route_once(&mut r, &prompts[i % prompts.len()], &mut scratch, now)
                })
            },
        );
    }
    g.finish();
}

fn length_sweep(c: &mut Criterion) {
    let mut g = c.benchmark_group("length");
    for kib in [1usize, 4, 16, 64, 256, 512] {
        // Body repeats chosen so the prompt is about `kib` KiB.
        let repeats = (kib * 1024).saturating_sub(400) / SENTENCE.len();
        let prompts = study_prompts(16, repeats.max(1));
        g.throughput(Throughput::Bytes(prompts[0].len() as u64));
        let mut r = filled_router(16);
        let mut scratch = Vec::new();
        let (mut i, mut now) = (0usize, 10_000_000u64);
        g.bench_with_input(BenchmarkId::new("xxh64_once_kib", kib), &kib, |b, _| {
            b.iter(|| {
                i += 1;
                black_box(xxhash_rust::xxh64::xxh64(&prompts[i % prompts.len()], 0))
            })
        });
        g.bench_with_input(BenchmarkId::new("route_kib", kib), &kib, |b, _| {
            b.iter(|| {
                i += 1;
                now += 1;
                route_once(&mut r, &prompts[i % prompts.len()], &mut scratch, now)
            })
        });
    }
    g.finish();
}

/// Route one request with `strategy` and complete the oldest open one: the open count per pod
/// stays where the set-up left it (on average: each strategy spreads the load its own way).
fn route_loaded(
    r: &mut Router,
    strategy: &StrategySpec,
    prompt: &[u8],
    scratch: &mut Vec<BlockHash>,
    open: &mut VecDeque<Ticket>,
    now: u64,
) {
    r.hash_config().hash_into(prompt, scratch);
    let req = RouteRequest::new("m", scratch).with_strategy(strategy);
    let d = r.route(req, Timestamp::from_millis(now)).unwrap();
    open.push_back(d.ticket);
    let oldest = open.pop_front().unwrap();
    r.complete(oldest, Outcome::Success.into(), Timestamp::from_millis(now))
        .unwrap();
    black_box(d);
}

fn loaded(c: &mut Criterion) {
    let prompts = study_prompts(64, 300);
    let mut g = c.benchmark_group("loaded");
    for (pods, per_pod) in [(16usize, 8usize), (16, 64), (256, 8), (256, 64)] {
        let mut r = filled_router(pods);
        let mut scratch = Vec::new();
        let mut open = VecDeque::new();
        let (mut i, mut now) = (0usize, 10_000_000u64);
        let spread = StrategySpec::single(Strategy::LeastRequest);
        for _ in 0..pods * per_pod {
            i += 1;
            r.hash_config()
                .hash_into(&prompts[i % prompts.len()], &mut scratch);
            let req = RouteRequest::new("m", &scratch).with_strategy(&spread);
            open.push_back(r.route(req, Timestamp::from_millis(now)).unwrap().ticket);
        }
        let id = format!("{pods}x{per_pod}");
        for strategy in [Strategy::PrefixCache, Strategy::LeastTtft] {
            let spec = StrategySpec::single(strategy);
            g.bench_with_input(BenchmarkId::new(strategy.name(), &id), &id, |b, _| {
                b.iter(|| {
                    i += 1;
                    now += 1;
                    let p = &prompts[i % prompts.len()];
                    route_loaded(&mut r, &spec, p, &mut scratch, &mut open, now)
                })
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(3));
    targets = study_shape, length_sweep, loaded
}
criterion_main!(benches);
