//! vLLM's KV-cache event wire format: owned types mirroring `vllm/distributed/kv_events.py`,
//! a decoder that accepts every layout vLLM has published, and an encoder that writes exactly
//! the bytes vLLM's msgspec encoder writes.
//!
//! # Layouts
//!
//! vLLM declares the events as msgspec `Struct`s with `omit_defaults=True`; the event base class
//! is tagged (`tag=True`: the tag is the class name under msgspec's default tag field `"type"`).
//!
//! | [`Layout`] | batch | events | who |
//! | --- | --- | --- | --- |
//! | [`Layout::Positional`] | `[ts, events, dp_rank]` | `["BlockStored", f1, f2, ...]` | vLLM before PR #42892, SGLang |
//! | [`Layout::Map`] | `[ts, events, dp_rank]` | `{"type": "BlockStored", "f1": ...}` | vLLM since PR #42892 (June 2026) |
//! | [`Layout::MapBatch`] | `{"ts", "events", "data_parallel_rank"}` | maps | a vLLM snapshot without `array_like` on the batch |
//!
//! msgspec ignores `omit_defaults` for `array_like` structs (msgspec issue #720), so positional
//! batches and events always carry every declared field (a `None` is `nil`). In maps, fields
//! whose value equals their default (`None` for `extra_keys`, `group_idx`, `kv_cache_spec_*`,
//! `data_parallel_rank`) are left out; fields without a default (`lora_id`, `medium`,
//! `lora_name`, `parent_block_hash`) are always written.
//!
//! # Decoding policy
//!
//! [`decode`] never panics, whatever the input. It accepts both event encodings (even mixed in
//! one batch) and both batch encodings; positional events may be shorter than today's (older
//! vLLM and SGLang: missing trailing fields are `None`) or longer (extra trailing fields are
//! ignored); unknown map keys are ignored, wherever the tag sits in the map. An event whose tag
//! this crate does not know is skipped and reported in [`EventBatch::skipped`] (so that a newer
//! vLLM's new event type does not cost the batch's other events); a known event whose fields
//! have the wrong type is an error for the whole batch, as are malformed or truncated msgpack
//! and trailing bytes after the batch.

use std::fmt;

use thiserror::Error;

/// Deepest container nesting [`decode`] accepts (batch, events, event, extra keys, values).
pub const MAX_DEPTH: usize = 64;

/// `ExternalBlockHash = bytes | int` in vLLM.
///
/// vLLM publishes ints by default (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`: the low 64 bits of the
/// block digest, big-endian) and the digest bytes otherwise; older vLLM published Python
/// `hash()` values, which can be negative.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BlockHash {
    /// A non-negative int (msgpack uint).
    Int(u64),
    /// A negative int (msgpack negative int); always `< 0` when decoded.
    NegInt(i64),
    /// A byte-string digest.
    Bytes(Vec<u8>),
}

impl BlockHash {
    /// A hash from a signed value: [`BlockHash::Int`] when non-negative.
    pub fn from_i64(v: i64) -> Self {
        if v >= 0 {
            BlockHash::Int(v as u64)
        } else {
            BlockHash::NegInt(v)
        }
    }

    /// The hash folded to a `u64`, the same for a block whatever form vLLM published it in:
    /// ints are their 64-bit two's complement, bytes are `int.from_bytes(b, "big") & (2**64 - 1)`
    /// (the last 8 bytes, big-endian) -- exactly the int vLLM's `maybe_convert_block_hash`
    /// publishes for that digest when int hashes are on.
    pub fn fold(&self) -> u64 {
        match self {
            BlockHash::Int(v) => *v,
            BlockHash::NegInt(v) => *v as u64,
            BlockHash::Bytes(b) => {
                let tail = &b[b.len().saturating_sub(8)..];
                let mut buf = [0u8; 8];
                buf[8 - tail.len()..].copy_from_slice(tail);
                u64::from_be_bytes(buf)
            }
        }
    }
}

impl From<u64> for BlockHash {
    fn from(v: u64) -> Self {
        BlockHash::Int(v)
    }
}

/// A msgpack value, as found in [`BlockStored::extra_keys`] (tuples of anything: multimodal
/// `(identifier, offset)` pairs, LoRA names, `cache_salt`, prompt-embedding hashes, ...).
///
/// Ints are normalised on decoding: non-negative values are [`Value::UInt`], negative ones
/// [`Value::Int`] (so re-encoding writes msgspec's minimal form). Tuples and lists are both
/// [`Value::Array`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Nil,
    Bool(bool),
    UInt(u64),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Ext(i8, Vec<u8>),
}

/// One `extra_keys` entry: the block's tuple of extra keys, or `None`.
pub type ExtraKeys = Option<Vec<Value>>;

/// `BlockStored`: blocks were added to the cache (`medium`) of the publishing engine.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockStored {
    pub block_hashes: Vec<BlockHash>,
    pub parent_block_hash: Option<BlockHash>,
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    /// Deprecated in vLLM in favour of `lora_name`; kept for compatibility.
    pub lora_id: Option<i64>,
    /// `"GPU"`, `"CPU"`, ... (`None` from older publishers).
    pub medium: Option<String>,
    pub lora_name: Option<String>,
    /// One entry per block of `block_hashes` (vLLM: `list[tuple | None] | None`).
    pub extra_keys: Option<Vec<ExtraKeys>>,
    /// KV-cache group (hybrid models); `None` from older publishers.
    pub group_idx: Option<u32>,
    pub kv_cache_spec_kind: Option<String>,
    pub kv_cache_spec_sliding_window: Option<u32>,
}

/// `BlockRemoved`: blocks were evicted from `medium`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockRemoved {
    pub block_hashes: Vec<BlockHash>,
    pub medium: Option<String>,
    pub group_idx: Option<u32>,
}

/// One event of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    /// The whole cache was reset.
    AllBlocksCleared,
}

impl KvEvent {
    /// The wire tag (msgspec's class-name tag).
    pub fn tag(&self) -> &'static str {
        match self {
            KvEvent::BlockStored(_) => "BlockStored",
            KvEvent::BlockRemoved(_) => "BlockRemoved",
            KvEvent::AllBlocksCleared => "AllBlocksCleared",
        }
    }
}

/// An event [`decode`] skipped because it does not know its tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedEvent {
    /// Position in the batch's event list on the wire.
    pub index: usize,
    pub tag: String,
}

/// vLLM's `KVEventBatch`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventBatch {
    /// Seconds since the epoch (`time.time()` on the publisher).
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// Set by vLLM's publisher to its DP rank (each rank publishes on `port + rank`).
    pub data_parallel_rank: Option<u32>,
    /// Not on the wire: events [`decode`] skipped (unknown tags). [`encode`] ignores it.
    pub skipped: Vec<SkippedEvent>,
}

impl EventBatch {
    pub fn new(ts: f64, events: Vec<KvEvent>) -> Self {
        EventBatch {
            ts,
            events,
            data_parallel_rank: None,
            skipped: Vec::new(),
        }
    }
}

/// How [`encode`] lays a batch out (see the module docs); [`decode`] accepts all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Everything positional (`array_like=True` on batch and events): vLLM before PR #42892.
    Positional,
    /// Positional batch, events as tagged maps: vLLM since PR #42892.
    Map,
    /// Batch and events as maps.
    MapBatch,
}

/// Why a payload could not be decoded. Offsets are byte offsets into the payload.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("truncated msgpack at offset {offset}")]
    Truncated { offset: usize },
    #[error("invalid msgpack marker 0xc1 at offset {offset}")]
    InvalidMarker { offset: usize },
    #[error("{field}: expected {expected}, found {found} at offset {offset}")]
    UnexpectedType {
        field: &'static str,
        expected: &'static str,
        found: &'static str,
        offset: usize,
    },
    #[error("{field}: integer out of range at offset {offset}")]
    OutOfRange { field: &'static str, offset: usize },
    #[error("{field}: invalid UTF-8 at offset {offset}")]
    InvalidUtf8 { field: &'static str, offset: usize },
    #[error("{event}: missing required field {field}")]
    MissingField {
        event: &'static str,
        field: &'static str,
    },
    #[error("event {index}: missing or non-string tag at offset {offset}")]
    MissingTag { index: usize, offset: usize },
    #[error("containers nested deeper than {MAX_DEPTH} at offset {offset}")]
    TooDeep { offset: usize },
    #[error("{count} trailing bytes after the batch")]
    TrailingBytes { count: usize },
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// Decodes one msgpack payload (the third frame of a vLLM KV-event ZMQ message) in any layout.
mod reader;
mod writer;

pub use reader::decode;
pub use writer::{encode, encode_into};

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Positional => "positional",
            Layout::Map => "map",
            Layout::MapBatch => "map_batch",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_matches_vllm_int_conversion() {
        // int.from_bytes(b, "big") & (2**64 - 1)
        assert_eq!(BlockHash::Bytes(vec![]).fold(), 0);
        assert_eq!(BlockHash::Bytes(vec![1, 2, 3]).fold(), 0x010203);
        let d: Vec<u8> = (0u8..32).collect();
        assert_eq!(
            BlockHash::Bytes(d).fold(),
            u64::from_be_bytes([24, 25, 26, 27, 28, 29, 30, 31])
        );
        assert_eq!(BlockHash::NegInt(-1).fold(), u64::MAX);
        assert_eq!(BlockHash::from_i64(5), BlockHash::Int(5));
        assert_eq!(BlockHash::from_i64(-5), BlockHash::NegInt(-5));
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        for input in [
            &[][..],
            &[0xc1],
            &[0x93],
            &[0xdd, 0xff, 0xff, 0xff, 0xff],
            &[0x92, 0xcb, 0, 0],
        ] {
            assert!(decode(input).is_err(), "{input:?}");
        }
    }
}
