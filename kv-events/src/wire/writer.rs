//! [`encode`]: a batch in one [`Layout`], byte-identical to msgspec.

use super::*;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
