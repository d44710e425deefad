//! Stateless helpers: the prefix hash chain and prompt extraction, for callers that want to
//! check or precompute what the router does.

use kvroute_core::HashConfig;

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
