//! Stateless helpers: the prefix hash chain, token-block keys and prompt extraction, for
//! callers that want to check or precompute what the router does.

use kvroute_core::{BlockExtras, HashConfig, TokenKeyConfig};

use crate::bytes;
use crate::handle;
use crate::prompt;
use crate::status::kvroute_status;

/// Computes the block hashes of a prompt with hash scheme v1 (the router's: the prompt's bytes
/// cut into `block_size`-byte blocks, a trailing partial block ignored, each block hashed as
/// `XXH64_seed(LE64(previous hash, or seed for the first) || block)`), into `(buf, len)`.
///
/// `(prompt, prompt_len)` is borrowed for the call only. On success `*out_n` is the number of
/// hashes (`prompt_len / block_size`). If `len` is too small, returns
/// `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set to that number and `buf` untouched;
/// `(NULL, 0)` is a valid count query. Returns `KVROUTE_STATUS_INVALID_PARAMETER` for a
/// `block_size` of 0 or above 1 MiB.
#[no_mangle]
pub extern "C" fn kvroute_prefix_hashes(
    block_size: usize,
    seed: u64,
    prompt: *const u8,
    prompt_len: usize,
    buf: *mut u64,
    len: usize,
    out_n: *mut usize,
) -> kvroute_status {
    ffi_panic_boundary! {
        let prompt = try_slice!(prompt, prompt_len);
        let buf = try_out_slice!(buf, len);
        let out_n = try_out!(out_n);
        let config = try_status!(HashConfig::new(block_size, seed).map_err(|_| kvroute_status::InvalidParameter));
        let n = config.complete_blocks(prompt.len());
        if buf.len() < n {
            handle::set_out(out_n, n);
            return kvroute_status::InsufficientSize;
        }
        let hashes: Vec<u64> = config.hashes(prompt).into_iter().map(|h| h.0).collect();
        bytes::write_items(&hashes, buf, out_n)
    }
}

/// vLLM's default KV-cache block size in tokens (its `--block-size`): the `block_tokens` of
/// `kvroute_router_route_tokens()` for an engine run with the default.
pub const KVROUTE_DEFAULT_BLOCK_TOKENS: u32 = 16;

/// The largest `block_tokens` accepted.
pub const KVROUTE_MAX_BLOCK_TOKENS: u32 = 65536;

const _: () = assert!(
    KVROUTE_DEFAULT_BLOCK_TOKENS == kvroute_core::DEFAULT_BLOCK_TOKENS
        && KVROUTE_MAX_BLOCK_TOKENS == kvroute_core::MAX_BLOCK_TOKENS,
    "the header's block-size constants are the core's"
);

/// Computes the token-block keys of a tokenized prompt, as `kvroute_router_route_tokens()` keys
/// it with `seed` the router's hash seed, into `(buf, len)`: for callers that precompute keys
/// (and route on them with `kvroute_router_route_keys()`) or check them.
///
/// The scheme (kvroute's own): the ids are cut into blocks of `block_tokens` tokens, a trailing
/// partial block ignored; block `i`'s key is
/// `XXH64_seed(LE64(parent) || LE32(id) for each id of the block || extras)`, where `parent` is
/// `seed ^ 0x746f6b656e730001` for the first block and the previous block's key after it, and
/// `extras` is `0x01 || LE32(length) || name` for the LoRA adapter (every block) followed by
/// `0x02 || LE32(length) || salt` for the cache salt (first block only), each present only when
/// given.
///
/// `(tokens, tokens_len)` is the prompt's token ids (`(NULL, 0)`: none); `(lora, lora_len)`
/// and `(cache_salt, cache_salt_len)` are as in `kvroute_router_route_tokens()` (`(NULL, 0)` or
/// empty: no LoRA, no salt). All are borrowed for the call only. On success `*out_n` is the
/// number of keys (`tokens_len / block_tokens`). If `len` is too small, returns
/// `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set to that number and `buf` untouched;
/// `(NULL, 0)` is a valid count query. Returns `KVROUTE_STATUS_INVALID_PARAMETER` for a
/// `block_tokens` of 0 or above `KVROUTE_MAX_BLOCK_TOKENS`, `KVROUTE_STATUS_INVALID_UTF8` for a
/// LoRA name or salt that is not UTF-8.
#[no_mangle]
pub extern "C" fn kvroute_token_block_keys(
    block_tokens: u32,
    seed: u64,
    tokens: *const u32,
    tokens_len: usize,
    lora: *const u8,
    lora_len: usize,
    cache_salt: *const u8,
    cache_salt_len: usize,
    buf: *mut u64,
    len: usize,
    out_n: *mut usize,
) -> kvroute_status {
    ffi_panic_boundary! {
        let ids = try_opt_array!(tokens, tokens_len).unwrap_or_default();
        let extras = BlockExtras {
            lora: try_opt_str!(lora, lora_len),
            cache_salt: try_opt_str!(cache_salt, cache_salt_len),
        };
        let buf = try_out_slice!(buf, len);
        let out_n = try_out!(out_n);
        let config = try_status!(TokenKeyConfig::new(block_tokens, seed).map_err(|_| kvroute_status::InvalidParameter));
        let n = ids.len() / block_tokens as usize;
        if buf.len() < n {
            handle::set_out(out_n, n);
            return kvroute_status::InsufficientSize;
        }
        let keys: Vec<u64> = config.keys(ids, extras).into_iter().map(|k| k.0).collect();
        bytes::write_items(&keys, buf, out_n)
    }
}

/// Extracts the prompt text of an OpenAI-style JSON body exactly as
/// `kvroute_router_route_json()` does, into `(buf, len)`, NUL-terminated. On success `*out_n` is
/// its length in bytes without the NUL. If `len` is too small, returns
/// `KVROUTE_STATUS_INSUFFICIENT_SIZE` with `*out_n` set to the `len` needed (length + 1) and
/// `buf` untouched. Returns `KVROUTE_STATUS_INVALID_BODY` for a body that is not a JSON object
/// or whose `messages` or `prompt` field has the wrong type.
#[no_mangle]
pub extern "C" fn kvroute_extract_prompt(
    body: *const u8,
    body_len: usize,
    buf: *mut u8,
    len: usize,
    out_n: *mut usize,
) -> kvroute_status {
    ffi_panic_boundary! {
        let body = try_slice!(body, body_len);
        let buf = try_out_slice!(buf, len);
        let out_n = try_out!(out_n);
        let parsed = try_status!(prompt::extract(body));
        bytes::write_str(&parsed.prompt, buf, out_n)
    }
}
