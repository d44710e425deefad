//! Property tests: the fast engine against `tokenizers` (and its scanners against
//! `fancy-regex`), and `encode_cached` against `encode` under sharing, truncation and eviction.

mod common;

use std::sync::OnceLock;

use kvroute_tokens::fast::pretok::{Scanner, GPT2, LLAMA3, QWEN2};
use kvroute_tokens::{Engine, ModelTokenizer, PrefixStore, PrefixStoreConfig};
use proptest::prelude::*;

fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(common::FRAGMENTS), 0..max).prop_map(|v| v.concat())
}

fn models() -> &'static [ModelTokenizer] {
    static MODELS: OnceLock<Vec<ModelTokenizer>> = OnceLock::new();
    MODELS.get_or_init(|| {
        let jsons = [
            common::fixture_tokenizer_json(),
            common::dev_tokenizer_json().to_vec(),
            common::dev_tokenizer_json_with_pattern(QWEN2),
            common::dev_tokenizer_json_with_pattern(GPT2),
        ];
        jsons
            .iter()
            .map(|j| {
                let m = ModelTokenizer::from_bytes(j, None).unwrap();
                assert_eq!(m.engine(), Engine::Fast, "{:?}", m.fast_unsupported());
                m
            })
            .collect()
    })
}

fn regex_pieces(pattern: &str, s: &str) -> Vec<(usize, usize)> {
    let re = fancy_regex::Regex::new(pattern).unwrap();
    re.find_iter(s)
        .map(|m| m.unwrap())
        .map(|m| (m.start(), m.end()))
        .collect()
}

fn scanner_pieces(scanner: Scanner, s: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    scanner.split(s, |a, b| out.push((a, b)));
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn scanners_match_fancy_regex(s in text(40), any in "\\PC{0,12}") {
        for s in [s.as_str(), any.as_str()] {
            for pattern in [GPT2, LLAMA3, QWEN2] {
                let scanner = Scanner::for_pattern(pattern).unwrap();
                prop_assert_eq!(scanner_pieces(scanner, s), regex_pieces(pattern, s), "{:?} on {:?}", scanner, s);
            }
        }
    }

    #[test]
    fn fast_engine_matches_tokenizers(s in text(40), any in "\\PC{0,16}") {
        for model in models() {
            for s in [s.as_str(), any.as_str()] {
                for special in [false, true] {
                    let want = model.reference().encode(s, special).unwrap().get_ids().to_vec();
                    prop_assert_eq!(model.encode(s, special).unwrap(), want, "{:?}", s);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Requests share prefixes (whole documents, or documents cut at any character), then go on
    /// with random text; small blocks and a small cap force evictions. Every cached result
    /// equals the uncached one, and the store stays under its cap.
    #[test]
    fn encode_cached_equals_encode(
        docs in prop::collection::vec(text(120), 1..4),
        requests in prop::collection::vec((0usize..4, 0usize..2000, any::<bool>(), text(12)), 1..24),
        block in 16usize..80,
        cap in prop::sample::select(vec![1usize << 10, 4 << 10, 1 << 20]),
        special in any::<bool>(),
        reference in any::<bool>(),
    ) {
        let model = &models()[0];
        let reference_model;
        let model = if reference {
            reference_model = ModelTokenizer::from_bytes(&common::fixture_tokenizer_json(), None).unwrap().with_engine(Engine::Reference);
            &reference_model
        } else {
            model
        };
        let store = PrefixStore::new(PrefixStoreConfig { block_bytes: block, capacity_bytes: cap, ..Default::default() }).unwrap();
        for (doc, cut, whole, suffix) in requests {
            let doc = &docs[doc % docs.len()];
            let prefix = if whole {
                doc.as_str()
            } else {
                let mut c = cut.min(doc.len());
                while !doc.is_char_boundary(c) { c -= 1; }
                &doc[..c]
            };
            let text = format!("{prefix}{suffix}");
            let want = model.encode(&text, special).unwrap();
            prop_assert_eq!(model.encode_cached(&store, &text, special).unwrap(), want, "{:?}", text);
            prop_assert!(store.stats().bytes_used <= cap as u64);
        }
    }
}

/// Long shared prefixes with fresh questions, on the Llama 3-shaped development tokenizer:
/// results are exact and the prefix is reused.
#[test]
fn long_prefixes_are_reused_exactly() {
    let corpus = common::corpus();
    for model in &models()[1..] {
        let store = PrefixStore::default();
        for doc in 0..4 {
            let start = floor_char(corpus, doc * 3000);
            let prefix = &corpus[start..floor_char(corpus, start + 12_000)];
            for q in 0..5 {
                let text = format!("{prefix}\nQuestion {q} about document {doc}: what's next?");
                assert_eq!(
                    model.encode_cached(&store, &text, true).unwrap(),
                    model.encode(&text, true).unwrap()
                );
            }
        }
        let stats = store.stats();
        assert_eq!(stats.misses, 4, "{stats:?}");
        assert_eq!(stats.hits, 16, "{stats:?}");
        assert!(stats.tokens_reused > 16 * 2000, "{stats:?}");
        assert_eq!(stats.rejected_cuts, 0, "{stats:?}");
    }
}

fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A cap far below the working set: entries are evicted, results stay exact, memory stays
/// under the cap.
#[test]
fn eviction_keeps_results_exact() {
    let corpus = common::corpus();
    let model = &models()[0];
    let cap = 48 << 10;
    let store = PrefixStore::new(PrefixStoreConfig {
        block_bytes: 64,
        capacity_bytes: cap,
        ..Default::default()
    })
    .unwrap();
    for doc in 0..6 {
        for round in 0..3 {
            let start = floor_char(corpus, doc * 1500);
            let text = format!(
                "{} question {round}",
                &corpus[start..floor_char(corpus, start + 6000)]
            );
            assert_eq!(
                model.encode_cached(&store, &text, false).unwrap(),
                model.encode(&text, false).unwrap()
            );
            assert!(store.stats().bytes_used <= cap as u64);
        }
    }
    let stats = store.stats();
    assert!(stats.evictions > 0 && stats.hits > 0, "{stats:?}");
}

/// Several threads share one store (a small one, so inserts and evictions interleave with
/// lookups): every result is exact.
#[test]
fn concurrent_use_is_exact() {
    let corpus = common::corpus();
    let model = &models()[0];
    let store = PrefixStore::new(PrefixStoreConfig {
        block_bytes: 32,
        capacity_bytes: 64 << 10,
        ..Default::default()
    })
    .unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let store = &store;
            s.spawn(move || {
                for i in 0..40 {
                    let start = floor_char(corpus, (i % 5) * 2000);
                    let text = format!(
                        "{} thread {t} request {i}",
                        &corpus[start..floor_char(corpus, start + 4000 + 97 * t)]
                    );
                    assert_eq!(
                        model.encode_cached(store, &text, true).unwrap(),
                        model.encode(&text, true).unwrap()
                    );
                }
            });
        }
    });
    let stats = store.stats();
    assert!(stats.hits > 0 && stats.bytes_used <= 64 << 10, "{stats:?}");
}
