//! Engine views: route cost with and without them, and event ingest rate.
//!
//! - `route_tokens/{index,engine}/PODS`: the per-request core work of a token-keyed request on
//!   the study's shape (8 families of ~5,000-token prompts, each with a fresh 40-token
//!   question): key the tokens, `route` (prefix-cache), `complete`. `index`: no engine views
//!   (the router-side index answers; the baseline). `engine`: every pod has a complete view
//!   holding the families plus 100,000 unrelated blocks, so every candidate is matched
//!   against its engine's blocks.
//! - `ingest/stored_removed`: blocks per second through [`Router::apply_kv_events`]: batches
//!   storing 32 blocks (one prompt's worth at vLLM's 16-token blocks) and removing the 32
//!   stored longest ago, on a view held at 200,000 blocks.
//!
//! Run: `cargo bench -p kvroute-core --bench engine_view`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvroute_core::{
    BlockExtras, BlockHash, Completion, EngineBlockHash, KvEvent, KvSource, Outcome, PodId,
    PodSpec, PromptTokens, RouteRequest, Router, RouterConfig, StoredBlocks, Timestamp,
};

const BS: u32 = 16;
const FAMILY_TOKENS: u32 = 4_960;

fn prompt(family: u32, question: u32) -> Vec<u32> {
    (0..FAMILY_TOKENS)
        .map(|i| family << 20 | i)
        .chain((0..40).map(|i| 0x4000_0000 | question << 6 | i))
        .collect()
}

fn router(pods: usize) -> (Router, Vec<PodId>) {
    let mut r = Router::new(RouterConfig {
        seed: 3,
        ..Default::default()
    })
    .unwrap();
    let ids = (0..pods)
        .map(|i| {
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
            .unwrap()
        })
        .collect();
    (r, ids)
}

/// One stored event of `tokens`' full blocks after `parent`, with engine hashes from `next`.
fn store(
    r: &mut Router,
    pod: PodId,
    seq: u64,
    parent: Option<EngineBlockHash>,
    tokens: &[u32],
    next: &mut u64,
) {
    let n = tokens.len() / BS as usize;
    let hashes: Vec<EngineBlockHash> = (0..n)
        .map(|_| {
            *next += 1;
            EngineBlockHash(*next)
        })
        .collect();
    let ev = KvEvent::Stored(StoredBlocks {
        block_hashes: &hashes,
        parent,
        token_ids: &tokens[..n * BS as usize],
        block_size: BS,
        ..StoredBlocks::default()
    });
    r.apply_kv_events(pod, KvSource::Live, seq, &[ev], Timestamp::ZERO)
        .unwrap();
}

fn with_views(r: &mut Router, pods: &[PodId]) {
    let mut next = 0u64;
    for (i, &pod) in pods.iter().enumerate() {
        let mut seq = 0;
        for f in 0..8u32 {
            if f as usize % pods.len() == i % 8 || pods.len() <= 2 {
                store(r, pod, seq, None, &prompt(f, 0), &mut next);
                seq += 1;
            }
        }
        // Unrelated prompts up to 100,000 blocks.
        let mut u = 0u32;
        while r.kv_view(pod).unwrap().blocks < 100_000 {
            let tokens: Vec<u32> = (0..512).map(|t| 0x8000_0000 | u << 9 | t).collect();
            store(r, pod, seq, None, &tokens, &mut next);
            seq += 1;
            u += 1;
        }
    }
}

fn route_tokens(c: &mut Criterion) {
    let prompts: Vec<Vec<u32>> = (0..256).map(|q| prompt(q % 8, q)).collect();
    let mut g = c.benchmark_group("route_tokens");
    for pods in [2usize, 16] {
        for engine in [false, true] {
            let (mut r, ids) = router(pods);
            if engine {
                with_views(&mut r, &ids);
            }
            let keys = r.token_key_config(BS).unwrap();
            // What is measured must be what is claimed: the views answer, and fully.
            let probe = keys.keys(&prompts[1], BlockExtras::default());
            let size = PromptTokens {
                prompt_tokens: prompts[1].len() as u32,
                block_tokens: BS,
            };
            let d = r
                .route(
                    RouteRequest::new("m", &probe).with_tokens(size),
                    Timestamp::ZERO,
                )
                .unwrap();
            r.complete(d.ticket, Completion::new(Outcome::Success), Timestamp::ZERO)
                .unwrap();
            if engine {
                assert_eq!(d.view, kvroute_core::MatchView::Engine);
                assert_eq!(d.matched_blocks, FAMILY_TOKENS / BS);
            }
            let mut scratch: Vec<BlockHash> = Vec::new();
            let (mut i, mut now) = (0usize, 0u64);
            let name = if engine { "engine" } else { "index" };
            g.bench_with_input(BenchmarkId::new(name, pods), &pods, |b, _| {
                b.iter(|| {
                    i += 1;
                    now += 1;
                    let p = &prompts[i % prompts.len()];
                    keys.keys_into(p, BlockExtras::default(), &mut scratch);
                    let size = PromptTokens {
                        prompt_tokens: p.len() as u32,
                        block_tokens: BS,
                    };
                    let at = Timestamp::from_millis(now);
                    let d = r
                        .route(RouteRequest::new("m", &scratch).with_tokens(size), at)
                        .unwrap();
                    r.complete(d.ticket, Completion::new(Outcome::Success), at)
                        .unwrap();
                    black_box(d.matched_blocks)
                })
            });
        }
    }
    g.finish();
}

fn ingest(c: &mut Criterion) {
    let (mut r, ids) = router(1);
    let pod = ids[0];
    let mut next = 0u64;
    let mut seq = 0u64;
    let mut u = 0u32;
    let batch = |u: u32| -> Vec<u32> { (0..512).map(|t| u << 9 | t).collect() };
    while r.kv_view(pod).map_or(0, |v| v.blocks) < 200_000 {
        store(&mut r, pod, seq, None, &batch(u), &mut next);
        seq += 1;
        u += 1;
    }
    let mut oldest = 1u64;
    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements(32));
    g.bench_function("stored_removed", |b| {
        b.iter(|| {
            store(&mut r, pod, seq, None, &batch(u), &mut next);
            seq += 1;
            u += 1;
            let gone: Vec<EngineBlockHash> = (oldest..oldest + 32).map(EngineBlockHash).collect();
            oldest += 32;
            let ev = KvEvent::Removed {
                block_hashes: &gone,
                medium: kvroute_core::Medium::Gpu,
                group: 0,
            };
            r.apply_kv_events(pod, KvSource::Live, seq, &[ev], Timestamp::ZERO)
                .unwrap();
            seq += 1;
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(500)).measurement_time(std::time::Duration::from_secs(3));
    targets = route_tokens, ingest
}
criterion_main!(benches);
