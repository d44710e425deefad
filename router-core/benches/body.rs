//! Prompt extraction from a study-shaped completions body (~29 KB, the prompt with 302 `\n`
//! escapes), and from the same text as a two-message chat body.
//!
//! - `study/{completions,by_fields}`: [`kvroute_core::body::extract`] in the Envoy service's
//!   `/v1/completions` mode and the C ABI's by-fields mode.
//! - `chat/{chat,by_fields}`: the same, for a chat body (system message + user message).
//!
//! The two extractors it replaced (ext-proc's and the C ABI's) were measured against it in the
//! same run at commit caea1ba (`benches/old`, same bench names under `old/`).
//!
//! Run: `cargo bench -p kvroute-core --features json --bench body`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvroute_core::body::{extract, Endpoint};

const SENTENCE: &str =
    "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n";

fn salt() -> String {
    let mut rng = fastrand::Rng::with_seed(7);
    (0..256)
        .map(|_| char::from(b"0123456789abcdef"[rng.usize(..16)]))
        .collect()
}

fn study_prompt() -> String {
    format!(
        "{}\nDocument 3\n{}Question 000042: Explain the operational tradeoffs in detail.",
        salt(),
        SENTENCE.repeat(300)
    )
}

/// The study's body, fields in its order.
fn completions_body() -> Vec<u8> {
    let prompt = serde_json::to_string(&study_prompt()).unwrap();
    format!(r#"{{"model":"study","prompt":{prompt},"max_tokens":128,"temperature":0}}"#)
        .into_bytes()
}

fn chat_body() -> Vec<u8> {
    let prompt = study_prompt();
    let (system, user) = prompt.split_at(prompt.len() - 63);
    let (system, user) = (
        serde_json::to_string(system).unwrap(),
        serde_json::to_string(user).unwrap(),
    );
    format!(
        r#"{{"model":"study","messages":[{{"role":"system","content":{system}}},{{"role":"user","content":{user}}}],"max_tokens":128}}"#
    )
    .into_bytes()
}

fn bench(c: &mut Criterion) {
    let body = completions_body();
    let expected = study_prompt();
    assert_eq!(
        extract(Endpoint::Completions, &body).unwrap().prompt,
        expected
    );

    let mut g = c.benchmark_group("study");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("completions", |b| {
        b.iter(|| extract(Endpoint::Completions, black_box(&body)).unwrap())
    });
    g.bench_function("by_fields", |b| {
        b.iter(|| extract(Endpoint::ByFields, black_box(&body)).unwrap())
    });
    g.finish();

    let chat = chat_body();
    let mut g = c.benchmark_group("chat");
    g.throughput(Throughput::Bytes(chat.len() as u64));
    g.bench_function("chat", |b| {
        b.iter(|| extract(Endpoint::ChatCompletions, black_box(&chat)).unwrap())
    });
    g.bench_function("by_fields", |b| {
        b.iter(|| extract(Endpoint::ByFields, black_box(&chat)).unwrap())
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50);
    targets = bench
}
criterion_main!(benches);
