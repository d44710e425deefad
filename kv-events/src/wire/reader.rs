//! [`decode`]: every msgpack layout vLLM has used, into [`EventBatch`].

use rmp::Marker;

use super::*;

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
