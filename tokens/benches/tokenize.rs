//! Study-shaped prompts: 8 families, each a ~28 KB shared prefix (text of this repository's
//! READMEs) followed by a fresh question per request, tokenized with the golden tokenizer
//! (`tests/tokenizer/`).
//!
//! - `cold/encode`: a full tokenization (what a prompt costs without a store);
//! - `cold/encode_reference`: the same with the `tokenizers` library;
//! - `cold/encode_cached_miss`: a first sighting through an empty store (tokenize, choose and
//!   verify cuts, insert);
//! - `warm/encode_cached`: a known prefix with a fresh question (~95 bytes, inside the prefix's
//!   last partial block), through a warm store;
//! - `warm/encode_cached_long_question`: the same with a ~290-byte question, which completes
//!   new blocks, so every request also chooses, verifies and inserts cuts;
//! - `bytes/core_hashes`: kvroute-core's 128-byte block hashing of the same prompt (today's
//!   routing key), the baseline for `warm/encode_cached`.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use kvroute_tokens::{Engine, ModelTokenizer, PrefixStore};

const FAMILIES: usize = 8;
const PREFIX_BYTES: usize = 28 * 1024;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Family `f`'s shared prefix: 28 KB of the READMEs' text starting at a family-specific offset
/// (wrapping around), deterministic for a given checkout.
fn prefixes() -> Vec<String> {
    let mut corpus = String::new();
    for rel in [
        "README.md",
        "sim/README.md",
        "ext-proc/README.md",
        "envoy-module/README.md",
        "deploy/README.md",
    ] {
        corpus.push_str(&std::fs::read_to_string(root().join(rel)).unwrap_or_default());
        corpus.push('\n');
    }
    assert!(
        corpus.len() > 2 * PREFIX_BYTES,
        "not enough text to build prompts"
    );
    (0..FAMILIES)
        .map(|f| {
            let start = floor_char(&corpus, f * corpus.len() / FAMILIES);
            let doubled = format!("{}{}", &corpus[start..], &corpus[..start]);
            format!(
                "Document {f}.\n{}",
                &doubled[..floor_char(&doubled, PREFIX_BYTES)]
            )
        })
        .collect()
}

fn question(i: usize) -> String {
    format!("\n\nQuestion {i}: given the document above, which replica should request {} go to, and why?", i * 7919)
}

fn bench(c: &mut Criterion) {
    let dir = root().join("tests/tokenizer");
    let model = ModelTokenizer::from_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .unwrap();
    assert_eq!(model.engine(), Engine::Fast);
    let reference = ModelTokenizer::from_files(&dir.join("tokenizer.json"), None)
        .unwrap()
        .with_engine(Engine::Reference);
    let prefixes = prefixes();
    let prompt = format!("{}{}", prefixes[0], question(0));
    let hash = kvroute_core::RouterConfig::default().hash_config().unwrap();

    c.bench_function("cold/encode", |b| {
        b.iter(|| model.encode(black_box(&prompt), true).unwrap())
    });
    c.bench_function("cold/encode_reference", |b| {
        b.iter(|| reference.encode(black_box(&prompt), true).unwrap())
    });
    c.bench_function("cold/encode_cached_miss", |b| {
        b.iter_batched(
            PrefixStore::default,
            |store| {
                model
                    .encode_cached(&store, black_box(&prompt), true)
                    .unwrap()
            },
            BatchSize::SmallInput,
        )
    });

    let store = PrefixStore::default();
    for (f, p) in prefixes.iter().enumerate() {
        model
            .encode_cached(&store, &format!("{p}{}", question(f)), true)
            .unwrap();
    }
    // Every request is new: a family's prefix and a question never asked before (built and
    // freed outside the timed part). The ids (and hashes) are dropped inside it, as a router
    // drops them once it has keyed them, so the allocator reuses their memory.
    let mut i = 1000;
    let mut fresh = || {
        i += 1;
        format!("{}{}", prefixes[i % FAMILIES], question(i))
    };
    c.bench_function("warm/encode_cached", |b| {
        b.iter_batched_ref(
            &mut fresh,
            |p| {
                model
                    .encode_cached(&store, black_box(p), true)
                    .unwrap()
                    .len()
            },
            BatchSize::SmallInput,
        )
    });
    let mut k = 5000;
    let mut fresh_long = || {
        k += 1;
        format!(
            "{}{}{}",
            prefixes[k % FAMILIES],
            question(k),
            question(k + 1).repeat(2)
        )
    };
    c.bench_function("warm/encode_cached_long_question", |b| {
        b.iter_batched_ref(
            &mut fresh_long,
            |p| {
                model
                    .encode_cached(&store, black_box(p), true)
                    .unwrap()
                    .len()
            },
            BatchSize::SmallInput,
        )
    });
    c.bench_function("bytes/core_hashes", |b| {
        b.iter_batched_ref(
            &mut fresh,
            |p| hash.hashes(black_box(p.as_bytes())).len(),
            BatchSize::SmallInput,
        )
    });
    for _ in 0..64 {
        let p = fresh();
        assert_eq!(
            model.encode_cached(&store, &p, true).unwrap(),
            model.encode(&p, true).unwrap()
        );
    }
    eprintln!("store after the warm runs: {:?}", store.stats());
}

criterion_group!(benches, bench);
criterion_main!(benches);
