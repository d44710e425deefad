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

use rmp::Marker;
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
pub fn decode(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut r = Reader {
        buf: payload,
        pos: 0,
    };
    let batch = read_batch(&mut r)?;
    if r.pos != payload.len() {
        return Err(DecodeError::TrailingBytes {
            count: payload.len() - r.pos,
        });
    }
    Ok(batch)
}

/// A msgpack item header: scalars with their value, containers with their length.
#[derive(Debug, Clone, Copy)]
enum Head<'a> {
    Nil,
    Bool(bool),
    UInt(u64),
    /// Always negative.
    NegInt(i64),
    F32(f32),
    F64(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
    Ext(i8, &'a [u8]),
}

impl Head<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Head::Nil => "nil",
            Head::Bool(_) => "bool",
            Head::UInt(_) | Head::NegInt(_) => "int",
            Head::F32(_) | Head::F64(_) => "float",
            Head::Str(_) => "str",
            Head::Bin(_) => "bin",
            Head::Array(_) => "array",
            Head::Map(_) => "map",
            Head::Ext(..) => "ext",
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated { offset: self.pos });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn len8(&mut self) -> Result<usize, DecodeError> {
        Ok(self.be::<1>()?[0] as usize)
    }

    fn len16(&mut self) -> Result<usize, DecodeError> {
        Ok(u16::from_be_bytes(self.be()?) as usize)
    }

    fn len32(&mut self) -> Result<usize, DecodeError> {
        Ok(u32::from_be_bytes(self.be()?) as usize)
    }

    fn signed(v: i64) -> Head<'a> {
        if v >= 0 {
            Head::UInt(v as u64)
        } else {
            Head::NegInt(v)
        }
    }

    /// Reads one item's header (and a scalar's value). Container lengths are checked against
    /// the bytes left (each element takes at least one byte), so no length can make the
    /// decoder allocate more than the input's size.
    fn head(&mut self) -> Result<Head<'a>, DecodeError> {
        let at = self.pos;
        let b = self.be::<1>()?[0];
        let h = match Marker::from_u8(b) {
            Marker::FixPos(v) => Head::UInt(v as u64),
            Marker::FixNeg(v) => Head::NegInt(v as i64),
            Marker::Null => Head::Nil,
            Marker::True => Head::Bool(true),
            Marker::False => Head::Bool(false),
            Marker::U8 => Head::UInt(self.be::<1>()?[0] as u64),
            Marker::U16 => Head::UInt(u16::from_be_bytes(self.be()?) as u64),
            Marker::U32 => Head::UInt(u32::from_be_bytes(self.be()?) as u64),
            Marker::U64 => Head::UInt(u64::from_be_bytes(self.be()?)),
            Marker::I8 => Self::signed(i8::from_be_bytes(self.be()?) as i64),
            Marker::I16 => Self::signed(i16::from_be_bytes(self.be()?) as i64),
            Marker::I32 => Self::signed(i32::from_be_bytes(self.be()?) as i64),
            Marker::I64 => Self::signed(i64::from_be_bytes(self.be()?)),
            Marker::F32 => Head::F32(f32::from_be_bytes(self.be()?)),
            Marker::F64 => Head::F64(f64::from_be_bytes(self.be()?)),
            Marker::FixStr(n) => Head::Str(self.take(n as usize)?),
            Marker::Str8 => {
                let n = self.len8()?;
                Head::Str(self.take(n)?)
            }
            Marker::Str16 => {
                let n = self.len16()?;
                Head::Str(self.take(n)?)
            }
            Marker::Str32 => {
                let n = self.len32()?;
                Head::Str(self.take(n)?)
            }
            Marker::Bin8 => {
                let n = self.len8()?;
                Head::Bin(self.take(n)?)
            }
            Marker::Bin16 => {
                let n = self.len16()?;
                Head::Bin(self.take(n)?)
            }
            Marker::Bin32 => {
                let n = self.len32()?;
                Head::Bin(self.take(n)?)
            }
            Marker::FixArray(n) => Head::Array(n as usize),
            Marker::Array16 => Head::Array(self.len16()?),
            Marker::Array32 => Head::Array(self.len32()?),
            Marker::FixMap(n) => Head::Map(n as usize),
            Marker::Map16 => Head::Map(self.len16()?),
            Marker::Map32 => Head::Map(self.len32()?),
            Marker::FixExt1 => self.ext(1)?,
            Marker::FixExt2 => self.ext(2)?,
            Marker::FixExt4 => self.ext(4)?,
            Marker::FixExt8 => self.ext(8)?,
            Marker::FixExt16 => self.ext(16)?,
            Marker::Ext8 => {
                let n = self.len8()?;
                self.ext(n)?
            }
            Marker::Ext16 => {
                let n = self.len16()?;
                self.ext(n)?
            }
            Marker::Ext32 => {
                let n = self.len32()?;
                self.ext(n)?
            }
            Marker::Reserved => return Err(DecodeError::InvalidMarker { offset: at }),
        };
        match h {
            Head::Array(n) if n > self.remaining() => Err(DecodeError::Truncated { offset: at }),
            Head::Map(n) if n > self.remaining() / 2 => Err(DecodeError::Truncated { offset: at }),
            h => Ok(h),
        }
    }

    fn ext(&mut self, n: usize) -> Result<Head<'a>, DecodeError> {
        let ty = i8::from_be_bytes(self.be()?);
        Ok(Head::Ext(ty, self.take(n)?))
    }

    /// Skips one whole item.
    fn skip(&mut self, depth: usize) -> Result<(), DecodeError> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooDeep { offset: self.pos });
        }
        match self.head()? {
            Head::Array(n) => {
                for _ in 0..n {
                    self.skip(depth + 1)?;
                }
            }
            Head::Map(n) => {
                for _ in 0..2 * n {
                    self.skip(depth + 1)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn unexpected(
        &self,
        field: &'static str,
        expected: &'static str,
        h: Head,
        at: usize,
    ) -> DecodeError {
        DecodeError::UnexpectedType {
            field,
            expected,
            found: h.kind(),
            offset: at,
        }
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let at = self.pos;
        match self.head()? {
            Head::UInt(v) => Ok(v),
            Head::NegInt(_) => Err(DecodeError::OutOfRange { field, offset: at }),
            h => Err(self.unexpected(field, "int", h, at)),
        }
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let at = self.pos;
        u32::try_from(self.u64(field)?).map_err(|_| DecodeError::OutOfRange { field, offset: at })
    }

    fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        let at = self.pos;
        match self.head()? {
            Head::UInt(v) => {
                i64::try_from(v).map_err(|_| DecodeError::OutOfRange { field, offset: at })
            }
            Head::NegInt(v) => Ok(v),
            h => Err(self.unexpected(field, "int", h, at)),
        }
    }

    /// msgspec's `float` also accepts ints.
    fn f64(&mut self, field: &'static str) -> Result<f64, DecodeError> {
        let at = self.pos;
        match self.head()? {
            Head::F64(v) => Ok(v),
            Head::F32(v) => Ok(v as f64),
            Head::UInt(v) => Ok(v as f64),
            Head::NegInt(v) => Ok(v as f64),
            h => Err(self.unexpected(field, "float", h, at)),
        }
    }

    fn str(&mut self, field: &'static str) -> Result<&'a str, DecodeError> {
        let at = self.pos;
        match self.head()? {
            Head::Str(s) => {
                std::str::from_utf8(s).map_err(|_| DecodeError::InvalidUtf8 { field, offset: at })
            }
            h => Err(self.unexpected(field, "str", h, at)),
        }
    }

    fn is_nil(&mut self) -> Result<bool, DecodeError> {
        match self.buf.get(self.pos) {
            Some(&b) if b == Marker::Null.to_u8() => {
                self.pos += 1;
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Err(DecodeError::Truncated { offset: self.pos }),
        }
    }

    fn opt<T>(
        &mut self,
        read: impl FnOnce(&mut Self) -> Result<T, DecodeError>,
    ) -> Result<Option<T>, DecodeError> {
        if self.is_nil()? {
            Ok(None)
        } else {
            read(self).map(Some)
        }
    }

    fn array(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let at = self.pos;
        match self.head()? {
            Head::Array(n) => Ok(n),
            h => Err(self.unexpected(field, "array", h, at)),
        }
    }

    fn hash(&mut self, field: &'static str) -> Result<BlockHash, DecodeError> {
        let at = self.pos;
        match self.head()? {
            Head::UInt(v) => Ok(BlockHash::Int(v)),
            Head::NegInt(v) => Ok(BlockHash::NegInt(v)),
            Head::Bin(b) => Ok(BlockHash::Bytes(b.to_vec())),
            h => Err(self.unexpected(field, "int or bytes", h, at)),
        }
    }

    fn hashes(&mut self, field: &'static str) -> Result<Vec<BlockHash>, DecodeError> {
        let n = self.array(field)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.hash(field)?);
        }
        Ok(out)
    }

    fn value(&mut self, depth: usize) -> Result<Value, DecodeError> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooDeep { offset: self.pos });
        }
        let at = self.pos;
        Ok(match self.head()? {
            Head::Nil => Value::Nil,
            Head::Bool(b) => Value::Bool(b),
            Head::UInt(v) => Value::UInt(v),
            Head::NegInt(v) => Value::Int(v),
            Head::F32(v) => Value::Float(v as f64),
            Head::F64(v) => Value::Float(v),
            Head::Str(s) => Value::Str(
                std::str::from_utf8(s)
                    .map_err(|_| DecodeError::InvalidUtf8 {
                        field: "extra_keys",
                        offset: at,
                    })?
                    .to_owned(),
            ),
            Head::Bin(b) => Value::Bytes(b.to_vec()),
            Head::Ext(t, b) => Value::Ext(t, b.to_vec()),
            Head::Array(n) => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(depth + 1)?);
                }
                Value::Array(v)
            }
            Head::Map(n) => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = self.value(depth + 1)?;
                    v.push((k, self.value(depth + 1)?));
                }
                Value::Map(v)
            }
        })
    }
}

fn read_batch(r: &mut Reader) -> Result<EventBatch, DecodeError> {
    let at = r.pos;
    match r.head()? {
        Head::Array(n) => {
            if n < 2 {
                return Err(DecodeError::MissingField {
                    event: "EventBatch",
                    field: if n == 0 { "ts" } else { "events" },
                });
            }
            let ts = r.f64("ts")?;
            let (events, skipped) = read_events(r)?;
            let data_parallel_rank = if n >= 3 {
                r.opt(|r| r.u32("data_parallel_rank"))?
            } else {
                None
            };
            for _ in 3..n {
                r.skip(1)?;
            }
            Ok(EventBatch {
                ts,
                events,
                data_parallel_rank,
                skipped,
            })
        }
        Head::Map(n) => {
            let (mut ts, mut evs, mut dp) = (None, None, None);
            for _ in 0..n {
                let key_at = r.pos;
                match r.head()? {
                    Head::Str(b"ts") => ts = Some(r.f64("ts")?),
                    Head::Str(b"events") => evs = Some(read_events(r)?),
                    Head::Str(b"data_parallel_rank") => {
                        dp = r.opt(|r| r.u32("data_parallel_rank"))?
                    }
                    Head::Array(_) | Head::Map(_) => {
                        // A container key: rewind and skip it whole, then its value.
                        r.pos = key_at;
                        r.skip(1)?;
                        r.skip(1)?;
                    }
                    _ => r.skip(1)?,
                }
            }
            let ts = ts.ok_or(DecodeError::MissingField {
                event: "EventBatch",
                field: "ts",
            })?;
            let (events, skipped) = evs.ok_or(DecodeError::MissingField {
                event: "EventBatch",
                field: "events",
            })?;
            Ok(EventBatch {
                ts,
                events,
                data_parallel_rank: dp,
                skipped,
            })
        }
        h => Err(r.unexpected("EventBatch", "array or map", h, at)),
    }
}

fn read_events(r: &mut Reader) -> Result<(Vec<KvEvent>, Vec<SkippedEvent>), DecodeError> {
    let n = r.array("events")?;
    let mut events = Vec::with_capacity(n);
    let mut skipped = Vec::new();
    for index in 0..n {
        match read_event(r, index)? {
            Ok(ev) => events.push(ev),
            Err(tag) => skipped.push(SkippedEvent { index, tag }),
        }
    }
    Ok((events, skipped))
}

/// The fields of the known events, in BlockStored's declaration (= positional) order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    BlockHashes,
    ParentBlockHash,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    LoraName,
    ExtraKeys,
    GroupIdx,
    KvCacheSpecKind,
    KvCacheSpecSlidingWindow,
}

const STORED_FIELDS: [Field; 11] = [
    Field::BlockHashes,
    Field::ParentBlockHash,
    Field::TokenIds,
    Field::BlockSize,
    Field::LoraId,
    Field::Medium,
    Field::LoraName,
    Field::ExtraKeys,
    Field::GroupIdx,
    Field::KvCacheSpecKind,
    Field::KvCacheSpecSlidingWindow,
];
const REMOVED_FIELDS: [Field; 3] = [Field::BlockHashes, Field::Medium, Field::GroupIdx];

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::BlockHashes => "block_hashes",
            Field::ParentBlockHash => "parent_block_hash",
            Field::TokenIds => "token_ids",
            Field::BlockSize => "block_size",
            Field::LoraId => "lora_id",
            Field::Medium => "medium",
            Field::LoraName => "lora_name",
            Field::ExtraKeys => "extra_keys",
            Field::GroupIdx => "group_idx",
            Field::KvCacheSpecKind => "kv_cache_spec_kind",
            Field::KvCacheSpecSlidingWindow => "kv_cache_spec_sliding_window",
        }
    }

    fn by_name(name: &[u8]) -> Option<Field> {
        STORED_FIELDS
            .iter()
            .copied()
            .find(|f| f.name().as_bytes() == name)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
}

impl Kind {
    fn from_tag(tag: &str) -> Option<Kind> {
        match tag {
            "BlockStored" => Some(Kind::Stored),
            "BlockRemoved" => Some(Kind::Removed),
            "AllBlocksCleared" => Some(Kind::Cleared),
            _ => None,
        }
    }

    fn fields(self) -> &'static [Field] {
        match self {
            Kind::Stored => &STORED_FIELDS,
            Kind::Removed => &REMOVED_FIELDS,
            Kind::Cleared => &[],
        }
    }
}

/// Fields read so far; absent ones are `None`.
#[derive(Default)]
struct Acc {
    block_hashes: Option<Vec<BlockHash>>,
    parent_block_hash: Option<BlockHash>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<String>,
    lora_name: Option<String>,
    extra_keys: Option<Vec<ExtraKeys>>,
    group_idx: Option<u32>,
    kv_cache_spec_kind: Option<String>,
    kv_cache_spec_sliding_window: Option<u32>,
}

fn read_field(r: &mut Reader, acc: &mut Acc, f: Field) -> Result<(), DecodeError> {
    let name = f.name();
    match f {
        Field::BlockHashes => acc.block_hashes = Some(r.hashes(name)?),
        Field::ParentBlockHash => acc.parent_block_hash = r.opt(|r| r.hash(name))?,
        Field::TokenIds => {
            let n = r.array(name)?;
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(r.u32(name)?);
            }
            acc.token_ids = Some(v);
        }
        Field::BlockSize => acc.block_size = Some(r.u32(name)?),
        Field::LoraId => acc.lora_id = r.opt(|r| r.i64(name))?,
        Field::Medium => acc.medium = r.opt(|r| r.str(name).map(str::to_owned))?,
        Field::LoraName => acc.lora_name = r.opt(|r| r.str(name).map(str::to_owned))?,
        Field::ExtraKeys => {
            acc.extra_keys = r.opt(|r| {
                let n = r.array(name)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(r.opt(|r| {
                        let m = r.array(name)?;
                        let mut keys = Vec::with_capacity(m);
                        for _ in 0..m {
                            keys.push(r.value(4)?);
                        }
                        Ok(keys)
                    })?);
                }
                Ok(v)
            })?
        }
        Field::GroupIdx => acc.group_idx = r.opt(|r| r.u32(name))?,
        Field::KvCacheSpecKind => {
            acc.kv_cache_spec_kind = r.opt(|r| r.str(name).map(str::to_owned))?
        }
        Field::KvCacheSpecSlidingWindow => {
            acc.kv_cache_spec_sliding_window = r.opt(|r| r.u32(name))?
        }
    }
    Ok(())
}

fn build(kind: Kind, acc: Acc) -> Result<KvEvent, DecodeError> {
    Ok(match kind {
        Kind::Stored => {
            let missing = |field| DecodeError::MissingField {
                event: "BlockStored",
                field,
            };
            KvEvent::BlockStored(BlockStored {
                block_hashes: acc.block_hashes.ok_or(missing("block_hashes"))?,
                parent_block_hash: acc.parent_block_hash,
                token_ids: acc.token_ids.ok_or(missing("token_ids"))?,
                block_size: acc.block_size.ok_or(missing("block_size"))?,
                lora_id: acc.lora_id,
                medium: acc.medium,
                lora_name: acc.lora_name,
                extra_keys: acc.extra_keys,
                group_idx: acc.group_idx,
                kv_cache_spec_kind: acc.kv_cache_spec_kind,
                kv_cache_spec_sliding_window: acc.kv_cache_spec_sliding_window,
            })
        }
        Kind::Removed => KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: acc.block_hashes.ok_or(DecodeError::MissingField {
                event: "BlockRemoved",
                field: "block_hashes",
            })?,
            medium: acc.medium,
            group_idx: acc.group_idx,
        }),
        Kind::Cleared => KvEvent::AllBlocksCleared,
    })
}

/// Reads one event: `Ok(Ok(event))`, or `Ok(Err(tag))` for an unknown tag (skipped whole).
fn read_event(r: &mut Reader, index: usize) -> Result<Result<KvEvent, String>, DecodeError> {
    let at = r.pos;
    match r.head()? {
        Head::Array(n) => {
            if n == 0 {
                return Err(DecodeError::MissingTag { index, offset: at });
            }
            let tag_at = r.pos;
            let tag = r.str("type").map_err(|_| DecodeError::MissingTag {
                index,
                offset: tag_at,
            })?;
            let Some(kind) = Kind::from_tag(tag) else {
                let tag = tag.to_owned();
                for _ in 1..n {
                    r.skip(2)?;
                }
                return Ok(Err(tag));
            };
            let fields = kind.fields();
            let mut acc = Acc::default();
            for i in 1..n {
                match fields.get(i - 1) {
                    Some(&f) => read_field(r, &mut acc, f)?,
                    None => r.skip(2)?,
                }
            }
            build(kind, acc).map(Ok)
        }
        Head::Map(n) => {
            let body = r.pos;
            // msgspec writes the tag first; any other producer may put it anywhere.
            let mut tag = None;
            for _ in 0..n {
                let key_at = r.pos;
                if let Head::Str(b"type") = r.head()? {
                    let tag_at = r.pos;
                    tag = Some(r.str("type").map_err(|_| DecodeError::MissingTag {
                        index,
                        offset: tag_at,
                    })?);
                    break;
                }
                r.pos = key_at;
                r.skip(2)?;
                r.skip(2)?;
            }
            let Some(tag) = tag else {
                return Err(DecodeError::MissingTag { index, offset: at });
            };
            r.pos = body;
            let kind = Kind::from_tag(tag);
            let mut acc = Acc::default();
            for _ in 0..n {
                let key_at = r.pos;
                let field = match r.head()? {
                    Head::Str(name) => {
                        kind.and_then(|k| Field::by_name(name).filter(|f| k.fields().contains(f)))
                    }
                    Head::Array(_) | Head::Map(_) => {
                        r.pos = key_at;
                        r.skip(2)?;
                        None
                    }
                    _ => None,
                };
                match field {
                    Some(f) => read_field(r, &mut acc, f)?,
                    None => r.skip(2)?,
                }
            }
            match kind {
                Some(kind) => build(kind, acc).map(Ok),
                None => Ok(Err(tag.to_owned())),
            }
        }
        h => Err(r.unexpected("events[]", "array or map", h, at)),
    }
}

// ---------------------------------------------------------------------------------------------
// Encoding

/// Encodes `batch` in `layout`, byte for byte as vLLM's `msgspec.msgpack.Encoder` would encode
/// the same `KVEventBatch` (ints in their smallest msgpack form, `ts` as float64, strings as
/// fixstr/str8/str16/str32, bytes as bin8/16/32). [`EventBatch::skipped`] is not encoded.
pub fn encode(batch: &EventBatch, layout: Layout) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode_into(batch, layout, &mut out);
    out
}

/// As [`encode`], appending to `out`.
pub fn encode_into(batch: &EventBatch, layout: Layout, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    match layout {
        Layout::Positional | Layout::Map => {
            w.array(3);
            w.f64(batch.ts);
            w.events(&batch.events, layout == Layout::Positional);
            w.opt_uint(batch.data_parallel_rank.map(u64::from));
        }
        Layout::MapBatch => {
            w.map(2 + usize::from(batch.data_parallel_rank.is_some()));
            w.str("ts");
            w.f64(batch.ts);
            w.str("events");
            w.events(&batch.events, false);
            if let Some(dp) = batch.data_parallel_rank {
                w.str("data_parallel_rank");
                w.uint(u64::from(dp));
            }
        }
    }
}

/// Writes msgpack with rmp's encoders, which pick the smallest form as msgspec does. Writing to
/// a `Vec<u8>` cannot fail, so their `Result`s carry no information.
struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn uint(&mut self, v: u64) {
        let _ = rmp::encode::write_uint(self.0, v);
    }

    fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v as u64);
        } else {
            let _ = rmp::encode::write_sint(self.0, v);
        }
    }

    fn f64(&mut self, v: f64) {
        let _ = rmp::encode::write_f64(self.0, v);
    }

    fn nil(&mut self) {
        let _ = rmp::encode::write_nil(self.0);
    }

    fn str(&mut self, s: &str) {
        let _ = rmp::encode::write_str(self.0, s);
    }

    fn bin(&mut self, b: &[u8]) {
        let _ = rmp::encode::write_bin(self.0, b);
    }

    fn array(&mut self, n: usize) {
        let _ = rmp::encode::write_array_len(self.0, n as u32);
    }

    fn map(&mut self, n: usize) {
        let _ = rmp::encode::write_map_len(self.0, n as u32);
    }

    fn opt_uint(&mut self, v: Option<u64>) {
        match v {
            Some(v) => self.uint(v),
            None => self.nil(),
        }
    }

    fn opt_int(&mut self, v: Option<i64>) {
        match v {
            Some(v) => self.int(v),
            None => self.nil(),
        }
    }

    fn opt_str(&mut self, v: Option<&str>) {
        match v {
            Some(v) => self.str(v),
            None => self.nil(),
        }
    }

    fn hash(&mut self, h: &BlockHash) {
        match h {
            BlockHash::Int(v) => self.uint(*v),
            BlockHash::NegInt(v) => self.int(*v),
            BlockHash::Bytes(b) => self.bin(b),
        }
    }

    fn hashes(&mut self, hs: &[BlockHash]) {
        self.array(hs.len());
        for h in hs {
            self.hash(h);
        }
    }

    fn value(&mut self, v: &Value) {
        match v {
            Value::Nil => self.nil(),
            Value::Bool(b) => {
                let _ = rmp::encode::write_bool(self.0, *b);
            }
            Value::UInt(v) => self.uint(*v),
            Value::Int(v) => self.int(*v),
            Value::Float(v) => self.f64(*v),
            Value::Str(s) => self.str(s),
            Value::Bytes(b) => self.bin(b),
            Value::Array(vs) => {
                self.array(vs.len());
                for v in vs {
                    self.value(v);
                }
            }
            Value::Map(kvs) => {
                self.map(kvs.len());
                for (k, v) in kvs {
                    self.value(k);
                    self.value(v);
                }
            }
            Value::Ext(t, data) => {
                let _ = rmp::encode::write_ext_meta(self.0, data.len() as u32, *t);
                self.0.extend_from_slice(data);
            }
        }
    }

    fn extra_keys(&mut self, ek: Option<&[ExtraKeys]>) {
        let Some(ek) = ek else { return self.nil() };
        self.array(ek.len());
        for keys in ek {
            match keys {
                Some(keys) => {
                    self.array(keys.len());
                    for k in keys {
                        self.value(k);
                    }
                }
                None => self.nil(),
            }
        }
    }

    fn events(&mut self, events: &[KvEvent], positional: bool) {
        self.array(events.len());
        for ev in events {
            if positional {
                self.positional_event(ev);
            } else {
                self.map_event(ev);
            }
        }
    }

    fn positional_event(&mut self, ev: &KvEvent) {
        match ev {
            KvEvent::BlockStored(s) => {
                self.array(12);
                self.str(ev.tag());
                self.hashes(&s.block_hashes);
                match &s.parent_block_hash {
                    Some(h) => self.hash(h),
                    None => self.nil(),
                }
                self.array(s.token_ids.len());
                for &t in &s.token_ids {
                    self.uint(u64::from(t));
                }
                self.uint(u64::from(s.block_size));
                self.opt_int(s.lora_id);
                self.opt_str(s.medium.as_deref());
                self.opt_str(s.lora_name.as_deref());
                self.extra_keys(s.extra_keys.as_deref());
                self.opt_uint(s.group_idx.map(u64::from));
                self.opt_str(s.kv_cache_spec_kind.as_deref());
                self.opt_uint(s.kv_cache_spec_sliding_window.map(u64::from));
            }
            KvEvent::BlockRemoved(rm) => {
                self.array(4);
                self.str(ev.tag());
                self.hashes(&rm.block_hashes);
                self.opt_str(rm.medium.as_deref());
                self.opt_uint(rm.group_idx.map(u64::from));
            }
            KvEvent::AllBlocksCleared => {
                self.array(1);
                self.str(ev.tag());
            }
        }
    }

    fn map_event(&mut self, ev: &KvEvent) {
        match ev {
            KvEvent::BlockStored(s) => {
                let optional = [
                    s.extra_keys.is_some(),
                    s.group_idx.is_some(),
                    s.kv_cache_spec_kind.is_some(),
                    s.kv_cache_spec_sliding_window.is_some(),
                ];
                self.map(8 + optional.iter().filter(|&&b| b).count());
                self.str("type");
                self.str(ev.tag());
                self.str("block_hashes");
                self.hashes(&s.block_hashes);
                self.str("parent_block_hash");
                match &s.parent_block_hash {
                    Some(h) => self.hash(h),
                    None => self.nil(),
                }
                self.str("token_ids");
                self.array(s.token_ids.len());
                for &t in &s.token_ids {
                    self.uint(u64::from(t));
                }
                self.str("block_size");
                self.uint(u64::from(s.block_size));
                self.str("lora_id");
                self.opt_int(s.lora_id);
                self.str("medium");
                self.opt_str(s.medium.as_deref());
                self.str("lora_name");
                self.opt_str(s.lora_name.as_deref());
                if let Some(ek) = &s.extra_keys {
                    self.str("extra_keys");
                    self.extra_keys(Some(ek));
                }
                if let Some(g) = s.group_idx {
                    self.str("group_idx");
                    self.uint(u64::from(g));
                }
                if let Some(k) = &s.kv_cache_spec_kind {
                    self.str("kv_cache_spec_kind");
                    self.str(k);
                }
                if let Some(w) = s.kv_cache_spec_sliding_window {
                    self.str("kv_cache_spec_sliding_window");
                    self.uint(u64::from(w));
                }
            }
            KvEvent::BlockRemoved(rm) => {
                self.map(3 + usize::from(rm.group_idx.is_some()));
                self.str("type");
                self.str(ev.tag());
                self.str("block_hashes");
                self.hashes(&rm.block_hashes);
                self.str("medium");
                self.opt_str(rm.medium.as_deref());
                if let Some(g) = rm.group_idx {
                    self.str("group_idx");
                    self.uint(u64::from(g));
                }
            }
            KvEvent::AllBlocksCleared => {
                self.map(1);
                self.str("type");
                self.str(ev.tag());
            }
        }
    }
}

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
    fn minimal_ints() {
        let mut out = Vec::new();
        let mut w = Writer(&mut out);
        for v in [0i64, 127, 128, 255, 256, -1, -32, -33, -128, -129] {
            w.int(v);
        }
        assert_eq!(
            out,
            [
                0x00, 0x7f, 0xcc, 0x80, 0xcc, 0xff, 0xcd, 0x01, 0x00, 0xff, 0xe0, 0xd0, 0xdf, 0xd0,
                0x80, 0xd1, 0xff, 0x7f
            ]
        );
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
