//! Token-block keys: the prefix index's keys for a prompt that the shell tokenized as the engine
//! does (its tokenizer and chat template), so that a block of the index is a block of the
//! engine's KV cache.
//!
//! Scheme (kvroute's own; the engine's block hashes are not reproducible across processes):
//! - the prompt is a sequence of token ids, cut into blocks of `block_tokens` tokens (vLLM's
//!   `--block-size`, default 16); a trailing partial block is ignored, as the engine caches
//!   only full blocks;
//! - `k_i = XXH64_S(LE64(parent_i) || LE32(t) for each token t of block i || extras_i)` with
//!   `parent_0 = S ^ TOKEN_DOMAIN` and `parent_{i+1} = k_i`, where `S` is the router's hash seed
//!   and `TOKEN_DOMAIN` keeps token keys apart from byte-block hashes;
//! - `extras_i`, as vLLM keys its blocks: the LoRA adapter's name on every block
//!   (`0x01 || LE32(len) || name`), and the request's `cache_salt` on the first block only
//!   (`0x02 || LE32(len) || salt`), so that requests for another adapter or with another salt
//!   never match.
//!
//! Each key names the whole token prefix up to and including its block (and the extras). Like
//! byte hashing, a pure function of the [`TokenKeyConfig`] and the ids: shells run it outside
//! the router's lock.

use xxhash_rust::xxh64::xxh64;

use crate::hash::BlockHash;

/// vLLM's default KV-cache block size, in tokens.
pub const DEFAULT_BLOCK_TOKENS: u32 = 16;

/// The largest token block size accepted.
pub const MAX_BLOCK_TOKENS: u32 = 1 << 16;

/// XORed into the seed for the first parent: token keys never equal byte-block hashes of the
/// same seed by construction of the chain's start.
const TOKEN_DOMAIN: u64 = 0x746f_6b65_6e73_0001;

/// A token block size of zero or above [`MAX_BLOCK_TOKENS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("token block size must be between 1 and {MAX_BLOCK_TOKENS} tokens, got {0}")]
pub struct InvalidBlockTokens(pub u32);

/// What keys a prompt's blocks besides its tokens (vLLM's block "extra keys").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockExtras<'a> {
    /// The LoRA adapter the request runs with (part of every block's key).
    pub lora: Option<&'a str>,
    /// The request's `cache_salt` (part of the first block's key).
    pub cache_salt: Option<&'a str>,
}

/// What token keying needs: block size and seed. Cheap to copy out of the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenKeyConfig {
    block_tokens: u32,
    seed: u64,
}

impl TokenKeyConfig {
    /// A configuration for blocks of `block_tokens` tokens keyed with `seed` (the router's
    /// hash seed: [`crate::Router::token_key_config`]).
    pub fn new(block_tokens: u32, seed: u64) -> Result<Self, InvalidBlockTokens> {
        if block_tokens == 0 || block_tokens > MAX_BLOCK_TOKENS {
            return Err(InvalidBlockTokens(block_tokens));
        }
        Ok(TokenKeyConfig { block_tokens, seed })
    }

    /// Block size in tokens.
    pub fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    /// Appends the keys of `tokens`' complete blocks to `out` (which is cleared first).
    pub fn keys_into(&self, tokens: &[u32], extras: BlockExtras<'_>, out: &mut Vec<BlockHash>) {
        out.clear();
        let block = self.block_tokens as usize;
        out.reserve(tokens.len() / block);
        let mut buf = Vec::with_capacity(8 + 4 * block + 64);
        let mut parent = self.root();
        for (i, chunk) in tokens.chunks_exact(block).enumerate() {
            parent = self.block_key(parent, i == 0, chunk, extras, &mut buf);
            out.push(BlockHash(parent));
        }
    }

    /// The parent of a prompt's first block.
    pub(crate) fn root(&self) -> u64 {
        self.seed ^ TOKEN_DOMAIN
    }

    /// The key of one block of tokens after `parent` (`first`: the prompt's first block, which
    /// the cache salt keys). `buf` is scratch space.
    pub(crate) fn block_key(
        &self,
        parent: u64,
        first: bool,
        tokens: &[u32],
        extras: BlockExtras<'_>,
        buf: &mut Vec<u8>,
    ) -> u64 {
        buf.clear();
        buf.extend_from_slice(&parent.to_le_bytes());
        for t in tokens {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        if let Some(lora) = extras.lora {
            push_extra(buf, 0x01, lora);
        }
        if let (true, Some(salt)) = (first, extras.cache_salt) {
            push_extra(buf, 0x02, salt);
        }
        xxh64(buf, self.seed)
    }

    /// The keys of `tokens`' complete blocks.
    pub fn keys(&self, tokens: &[u32], extras: BlockExtras<'_>) -> Vec<BlockHash> {
        let mut out = Vec::new();
        self.keys_into(tokens, extras, &mut out);
        out
    }
}

fn push_extra(buf: &mut Vec<u8>, tag: u8, value: &str) {
    buf.push(tag);
    let len = u32::try_from(value.len()).unwrap_or(u32::MAX);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(value.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HashConfig;

    fn cfg() -> TokenKeyConfig {
        TokenKeyConfig::new(4, 42).unwrap()
    }

    #[test]
    fn full_blocks_only_and_the_written_chain() {
        let c = cfg();
        assert!(c.keys(&[1, 2, 3], BlockExtras::default()).is_empty());
        let k = c.keys(&[1, 2, 3, 4, 5, 6, 7, 8, 9], BlockExtras::default());
        assert_eq!(k.len(), 2);
        let mut first = (42 ^ TOKEN_DOMAIN).to_le_bytes().to_vec();
        for t in [1u32, 2, 3, 4] {
            first.extend_from_slice(&t.to_le_bytes());
        }
        let k0 = xxh64(&first, 42);
        let mut second = k0.to_le_bytes().to_vec();
        for t in [5u32, 6, 7, 8] {
            second.extend_from_slice(&t.to_le_bytes());
        }
        assert_eq!(k, vec![BlockHash(k0), BlockHash(xxh64(&second, 42))]);
    }

    #[test]
    fn a_key_names_the_whole_prefix_and_its_extras() {
        let c = cfg();
        let none = BlockExtras::default();
        let a = c.keys(&[1, 1, 1, 1, 2, 2, 2, 2], none);
        let b = c.keys(&[3, 3, 3, 3, 2, 2, 2, 2], none);
        assert_ne!(a[1], b[1]);
        assert_eq!(c.keys(&[1, 1, 1, 1, 2, 2, 2, 2, 9], none), a);
        // LoRA changes every block, the salt the first block and so, by the chain, all.
        let lora = c.keys(
            &[1, 1, 1, 1, 2, 2, 2, 2],
            BlockExtras {
                lora: Some("sql"),
                ..none
            },
        );
        let salted = c.keys(
            &[1, 1, 1, 1, 2, 2, 2, 2],
            BlockExtras {
                cache_salt: Some("tenant-1"),
                ..none
            },
        );
        for other in [&lora, &salted] {
            assert_ne!(other[0], a[0]);
            assert_ne!(other[1], a[1]);
        }
        assert_ne!(lora, salted);
        // Length-prefixed extras: no ambiguity between a name and a longer one.
        let x = c.keys(
            &[1, 1, 1, 1],
            BlockExtras {
                lora: Some("ab"),
                ..none
            },
        );
        let y = c.keys(
            &[1, 1, 1, 1],
            BlockExtras {
                lora: Some("a"),
                ..none
            },
        );
        assert_ne!(x, y);
    }

    #[test]
    fn token_keys_are_not_byte_hashes_of_the_same_bytes() {
        let tokens = [0x6463_6261u32]; // "abcd" little-endian
        let t = TokenKeyConfig::new(1, 7)
            .unwrap()
            .keys(&tokens, BlockExtras::default());
        let b = HashConfig::new(4, 7).unwrap().hashes(b"abcd");
        assert_ne!(t, b);
    }

    #[test]
    fn invalid_block_sizes_are_rejected() {
        assert_eq!(TokenKeyConfig::new(0, 0), Err(InvalidBlockTokens(0)));
        assert!(TokenKeyConfig::new(MAX_BLOCK_TOKENS + 1, 0).is_err());
        assert!(TokenKeyConfig::new(DEFAULT_BLOCK_TOKENS, 0).is_ok());
    }
}
