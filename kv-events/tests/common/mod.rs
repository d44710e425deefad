//! Shared by the integration tests: the golden files of tests/kv-events/ and their expected
//! decoded content (expected.json, written by scripts/gen-kv-events.py).
#![allow(dead_code)]

use std::path::PathBuf;

use kvroute_kv_events::wire::{
    BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent, Layout, SkippedEvent, Value,
};
use serde_json::Value as Json;

pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/kv-events")
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub struct GoldenFile {
    pub layout: Layout,
    pub file: String,
    pub bytes: Vec<u8>,
}

pub struct Case {
    pub name: String,
    pub roundtrip: bool,
    pub files: Vec<GoldenFile>,
    pub expected: EventBatch,
    /// The expected `fold()` of every hash, in order (block hashes, then parent, per event).
    pub folds: Vec<(BlockHash, u64)>,
}

pub fn layout(name: &str) -> Layout {
    match name {
        "positional" => Layout::Positional,
        "map" => Layout::Map,
        "map_batch" => Layout::MapBatch,
        other => panic!("unknown layout {other}"),
    }
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex {s}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn f64_bits(s: &str) -> f64 {
    f64::from_bits(u64::from_str_radix(s, 16).unwrap())
}

fn hash(j: &Json, folds: &mut Vec<(BlockHash, u64)>) -> BlockHash {
    let h = if let Some(b) = j.get("bytes") {
        BlockHash::Bytes(hex(b.as_str().unwrap()))
    } else {
        let n = &j["int"];
        match n.as_u64() {
            Some(v) => BlockHash::Int(v),
            None => BlockHash::NegInt(n.as_i64().unwrap()),
        }
    };
    folds.push((h.clone(), j["fold"].as_u64().unwrap()));
    h
}

fn value(j: &Json) -> Value {
    if j.is_null() {
        return Value::Nil;
    }
    if let Some(bits) = j.get("bits") {
        return Value::Float(f64_bits(bits.as_str().unwrap()));
    }
    let (k, v) = j.as_object().unwrap().iter().next().unwrap();
    match k.as_str() {
        "bool" => Value::Bool(v.as_bool().unwrap()),
        "int" => match v.as_u64() {
            Some(u) => Value::UInt(u),
            None => Value::Int(v.as_i64().unwrap()),
        },
        "str" => Value::Str(v.as_str().unwrap().to_owned()),
        "bytes" => Value::Bytes(hex(v.as_str().unwrap())),
        "array" => Value::Array(v.as_array().unwrap().iter().map(value).collect()),
        other => panic!("unknown value kind {other}"),
    }
}

fn opt_str(j: &Json) -> Option<String> {
    j.as_str().map(str::to_owned)
}

fn opt_u32(j: &Json) -> Option<u32> {
    j.as_u64().map(|v| u32::try_from(v).unwrap())
}

fn event(j: &Json, folds: &mut Vec<(BlockHash, u64)>) -> KvEvent {
    let hashes = |j: &Json, folds: &mut Vec<(BlockHash, u64)>| -> Vec<BlockHash> {
        j.as_array()
            .unwrap()
            .iter()
            .map(|h| hash(h, folds))
            .collect()
    };
    match j["type"].as_str().unwrap() {
        "BlockStored" => {
            let block_hashes = hashes(&j["block_hashes"], folds);
            let parent = &j["parent_block_hash"];
            KvEvent::BlockStored(BlockStored {
                block_hashes,
                parent_block_hash: if parent.is_null() {
                    None
                } else {
                    Some(hash(parent, folds))
                },
                token_ids: j["token_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| u32::try_from(t.as_u64().unwrap()).unwrap())
                    .collect(),
                block_size: u32::try_from(j["block_size"].as_u64().unwrap()).unwrap(),
                lora_id: j["lora_id"].as_i64(),
                medium: opt_str(&j["medium"]),
                lora_name: opt_str(&j["lora_name"]),
                extra_keys: j["extra_keys"].as_array().map(|ek| {
                    ek.iter()
                        .map(|keys| keys.as_array().map(|ks| ks.iter().map(value).collect()))
                        .collect()
                }),
                group_idx: opt_u32(&j["group_idx"]),
                kv_cache_spec_kind: opt_str(&j["kv_cache_spec_kind"]),
                kv_cache_spec_sliding_window: opt_u32(&j["kv_cache_spec_sliding_window"]),
            })
        }
        "BlockRemoved" => KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes(&j["block_hashes"], folds),
            medium: opt_str(&j["medium"]),
            group_idx: opt_u32(&j["group_idx"]),
        }),
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        other => panic!("unknown event type {other}"),
    }
}

pub fn cases() -> Vec<Case> {
    let dir = golden_dir();
    let doc: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let e = &c["expected"];
            let mut folds = Vec::new();
            let expected = EventBatch {
                ts: f64_bits(e["ts_bits"].as_str().unwrap()),
                events: e["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|ev| event(ev, &mut folds))
                    .collect(),
                data_parallel_rank: opt_u32(&e["data_parallel_rank"]),
                skipped: e["skipped"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| SkippedEvent {
                        index: s["index"].as_u64().unwrap() as usize,
                        tag: s["type"].as_str().unwrap().to_owned(),
                    })
                    .collect(),
            };
            let files = c["files"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(l, f)| {
                    let file = f["file"].as_str().unwrap().to_owned();
                    let bytes = std::fs::read(dir.join(&file)).unwrap();
                    assert_eq!(bytes.len() as u64, f["len"].as_u64().unwrap(), "{file}");
                    GoldenFile {
                        layout: layout(l),
                        file,
                        bytes,
                    }
                })
                .collect();
            Case {
                name: c["name"].as_str().unwrap().to_owned(),
                roundtrip: c["roundtrip"].as_bool().unwrap(),
                files,
                expected,
                folds,
            }
        })
        .collect()
}
