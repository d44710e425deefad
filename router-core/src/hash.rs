//! Prompt hashing: the chained block hashes that key the prefix index.
//!
//! Scheme (AIBrix v0.7.0, `pkg/utils/tokenizer/` and `getPrefixHashes` in
//! `pkg/utils/prefixcacheindexer/hash.go`; "v1" in the test vectors' name):
//! - the prompt is a byte string (the "character" tokenizer: UTF-8 bytes);
//! - it is cut into blocks of `block_size` bytes; a trailing partial block is ignored;
//! - `h_i = XXH64_S(LE64(parent_i) || block_i)` with `parent_0 = S` and `parent_{i+1} = h_i`,
//!   where `S` is the hash seed.
//!
//! Each `h_i` names the whole prefix up to and including block `i`. Hashing is a pure function
//! of the [`HashConfig`] and the bytes, so shells run it outside the router's lock.
//! `tests/vectors/prefix_hash_v1.json` pins the scheme against an independent implementation.

use xxhash_rust::xxh64::xxh64;

/// The largest block size accepted, in bytes.
pub const MAX_BLOCK_SIZE: usize = 1 << 20;

/// Default block size in bytes (AIBrix's shipped `AIBRIX_PREFIX_CACHE_BLOCK_SIZE`).
pub const DEFAULT_BLOCK_SIZE: usize = 128;

/// The hash of one prompt prefix ending at a block boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockHash(pub u64);

/// What hashing needs: block size and seed. Cheap to copy out of the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashConfig {
    block_size: usize,
    seed: u64,
}

/// A block size of zero or above [`MAX_BLOCK_SIZE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("block size must be between 1 and {MAX_BLOCK_SIZE} bytes, got {0}")]
pub struct InvalidBlockSize(pub usize);

impl HashConfig {
    /// A hash configuration; fails on a block size of 0 or above [`MAX_BLOCK_SIZE`].
    pub fn new(block_size: usize, seed: u64) -> Result<Self, InvalidBlockSize> {
        if block_size == 0 || block_size > MAX_BLOCK_SIZE {
            return Err(InvalidBlockSize(block_size));
        }
        Ok(HashConfig { block_size, seed })
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The XXH64 seed `S`.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Number of complete blocks in a prompt of `len` bytes.
    pub fn complete_blocks(&self, len: usize) -> usize {
        len / self.block_size
    }

    /// Appends the block hashes of `prompt` to `out` (which is cleared first).
    ///
    /// `out` is reused by callers on hot paths to avoid allocation; the `8 + block_size` byte
    /// scratch buffer lives on the stack for block sizes up to 248 bytes.
    pub fn hash_into(&self, prompt: &[u8], out: &mut Vec<BlockHash>) {
        out.clear();
        let n = self.complete_blocks(prompt.len());
        out.reserve(n);
        let mut stack = [0u8; 8 + 248];
        let mut heap = Vec::new();
        let buf: &mut [u8] = if self.block_size <= 248 {
            &mut stack[..8 + self.block_size]
        } else {
            heap.resize(8 + self.block_size, 0);
            &mut heap
        };
        let mut parent = self.seed;
        for block in prompt.chunks_exact(self.block_size) {
            buf[..8].copy_from_slice(&parent.to_le_bytes());
            buf[8..].copy_from_slice(block);
            parent = xxh64(buf, self.seed);
            out.push(BlockHash(parent));
        }
    }

    /// The block hashes of `prompt`.
    pub fn hashes(&self, prompt: &[u8]) -> Vec<BlockHash> {
        let mut out = Vec::new();
        self.hash_into(prompt, &mut out);
        out
    }
}

/// Derives a 64-bit value from seed material (SplitMix64 finaliser). Used to derive the hash
/// seed and the hasher keys from [`crate::RouterConfig::seed`] so that one caller-provided seed
/// fixes every random choice of the router.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_trailing_block_is_ignored() {
        let cfg = HashConfig::new(4, 7).unwrap();
        assert_eq!(cfg.hashes(b"abc").len(), 0);
        assert_eq!(cfg.hashes(b"abcd").len(), 1);
        assert_eq!(cfg.hashes(b"abcdefg").len(), 1);
        assert_eq!(cfg.hashes(b"abcdefgh").len(), 2);
    }

    #[test]
    fn chain_matches_the_written_rule() {
        let cfg = HashConfig::new(4, 42).unwrap();
        let h = cfg.hashes(b"abcdefgh");
        let mut first = 42u64.to_le_bytes().to_vec();
        first.extend_from_slice(b"abcd");
        let h0 = xxh64(&first, 42);
        let mut second = h0.to_le_bytes().to_vec();
        second.extend_from_slice(b"efgh");
        assert_eq!(h, vec![BlockHash(h0), BlockHash(xxh64(&second, 42))]);
    }

    #[test]
    fn a_hash_names_the_whole_prefix() {
        let cfg = HashConfig::new(4, 1).unwrap();
        let a = cfg.hashes(b"aaaabbbb");
        let b = cfg.hashes(b"ccccbbbb");
        assert_ne!(
            a[1], b[1],
            "same block after different prefixes must differ"
        );
        assert_eq!(cfg.hashes(b"aaaabbbbcc")[..2], a[..]);
    }

    #[test]
    fn invalid_block_sizes_are_rejected() {
        assert_eq!(HashConfig::new(0, 0), Err(InvalidBlockSize(0)));
        assert!(HashConfig::new(MAX_BLOCK_SIZE + 1, 0).is_err());
        assert!(HashConfig::new(MAX_BLOCK_SIZE, 0).is_ok());
    }
}
