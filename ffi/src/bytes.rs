//! Input strings and output buffers, on top of the slices `handle.rs` borrows.
//!
//! Inputs are `(const uint8_t *data, size_t len)` pairs, not NUL-terminated, borrowed for the
//! call only. Outputs are `(buf, len, out_n)` triples: on success the data is written to `buf`
//! and its count to `*out_n`; on `KVROUTE_STATUS_INSUFFICIENT_SIZE`, `*out_n` holds the `len`
//! that would have succeeded and `buf` is untouched.

use std::mem::MaybeUninit;

use crate::status::kvroute_status;

/// The input bytes as UTF-8, or `INVALID_UTF8`.
pub(crate) fn utf8(bytes: &[u8]) -> Result<&str, kvroute_status> {
    std::str::from_utf8(bytes).map_err(|_| kvroute_status::InvalidUtf8)
}

/// Writes `s` plus a NUL terminator to `buf`; `*out_n` gets `s.len()` (without the NUL). When
/// `buf` holds fewer than `s.len() + 1` bytes, writes only `*out_n = s.len() + 1` and returns
/// `INSUFFICIENT_SIZE`.
pub(crate) fn write_str(
    s: &str,
    buf: &mut [MaybeUninit<u8>],
    out_n: &mut MaybeUninit<usize>,
) -> kvroute_status {
    let need = s.len() + 1;
    if buf.len() < need {
        out_n.write(need);
        return kvroute_status::InsufficientSize;
    }
    for (dst, src) in buf.iter_mut().zip(s.as_bytes().iter().chain(Some(&0u8))) {
        dst.write(*src);
    }
    out_n.write(s.len());
    kvroute_status::Ok
}

/// Writes `items` to `buf`; `*out_n` gets their count. When `buf` is shorter, writes only
/// `*out_n = items.len()` and returns `INSUFFICIENT_SIZE`.
pub(crate) fn write_items<T: Copy>(
    items: &[T],
    buf: &mut [MaybeUninit<T>],
    out_n: &mut MaybeUninit<usize>,
) -> kvroute_status {
    if buf.len() < items.len() {
        out_n.write(items.len());
        return kvroute_status::InsufficientSize;
    }
    for (dst, src) in buf.iter_mut().zip(items) {
        dst.write(*src);
    }
    out_n.write(items.len());
    kvroute_status::Ok
}

/// `&str` from `(data, len)`: `NULL_PARAMETER` or `INVALID_UTF8` returned from the enclosing
/// function.
macro_rules! try_str {
    ( $data:expr, $len:expr ) => {
        try_status!($crate::bytes::utf8(try_slice!($data, $len)))
    };
}

/// `Option<&str>` from `(data, len)`: `None` for `(NULL, 0)` or an empty string (an absent
/// strategy, LoRA adapter or cache salt), else the UTF-8 text; `NULL_PARAMETER` or
/// `INVALID_UTF8` returned from the enclosing function.
macro_rules! try_opt_str {
    ( $data:expr, $len:expr ) => {{
        let s = try_str!($data, $len);
        if s.is_empty() {
            None
        } else {
            Some(s)
        }
    }};
}
