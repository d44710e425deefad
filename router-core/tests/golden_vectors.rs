//! The hash scheme against vectors produced by an independent implementation (python-xxhash,
//! `tests/vectors/gen_prefix_hash.py`).

use kvroute_core::{BlockHash, HashConfig};

#[test]
fn rust_hashes_match_python_xxhash_vectors() {
    let doc: serde_json::Value =
        serde_json::from_str(include_str!("../../tests/vectors/prefix_hash_v1.json"))
            .expect("vectors are JSON");
    assert_eq!(doc["scheme"], "v1");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10);
    let mut blocks_checked = 0;
    for case in cases {
        let note = case["note"].as_str().unwrap_or("?");
        let block_size = case["block_size"].as_u64().expect("block_size") as usize;
        let seed = case["seed"].as_u64().expect("seed");
        let hex = case["prompt_hex"].as_str().expect("prompt_hex");
        let prompt: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        let want: Vec<BlockHash> = case["hashes"]
            .as_array()
            .expect("hashes")
            .iter()
            .map(|h| {
                BlockHash(
                    u64::from_str_radix(h.as_str().expect("str").trim_start_matches("0x"), 16)
                        .expect("hex"),
                )
            })
            .collect();
        let got = HashConfig::new(block_size, seed)
            .expect("valid")
            .hashes(&prompt);
        assert_eq!(got, want, "case {note:?}");
        blocks_checked += want.len();
    }
    assert!(
        blocks_checked > 500,
        "vectors must exercise many blocks, got {blocks_checked}"
    );
}
