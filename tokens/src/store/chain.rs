//! Block keys: the 128-bit XXH3 hash of each prefix of the text that ends at a block boundary.
//!
//! Block `k` covers bytes `[k·B, (k+1)·B)`; only complete blocks have keys. The keys chain:
//! `key_k = XXH3-128(block_k, seed = low64(key_{k-1})) XOR key_{k-1}`, with
//! `key_{-1} = (seed, seed)`, so key `k` names the whole prefix up to its block's end: two texts
//! that differ in an earlier block have different `key_{k-1}`, and either the low halves differ
//! (independent XXH3 outputs) or only the high halves do (then the XOR keeps the keys apart).
//! Collisions are at the 2^-128 scale. Chaining per block costs half of one streaming hash with
//! a 128-bit digest at every boundary. The seed mixes the store's seed with the tokenizer's
//! fingerprint, so models sharing a store never share keys.

use xxhash_rust::xxh3::xxh3_128_with_seed;

/// The keys of the complete blocks of `text`, appended to `out` (cleared first).
pub(crate) fn block_keys(text: &[u8], block: usize, seed: u64, out: &mut Vec<u128>) {
    out.clear();
    out.reserve(text.len() / block);
    let mut prev = (u128::from(seed) << 64) | u128::from(seed);
    for chunk in text.chunks_exact(block) {
        prev ^= xxh3_128_with_seed(chunk, prev as u64);
        out.push(prev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_prefixes() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        block_keys(b"0123456789abcdefXY", 4, 7, &mut a);
        block_keys(b"0123456789abZZZZ", 4, 7, &mut b);
        assert_eq!(a.len(), 4);
        assert_eq!(b.len(), 4);
        assert_eq!(a[..3], b[..3]);
        assert_ne!(a[3], b[3]);
        let mut c = Vec::new();
        block_keys(b"0123456789abcdef", 4, 8, &mut c);
        assert_ne!(a[0], c[0]);
    }
}
