//! A decoded vLLM event batch ([`kvroute_kv_events::EventBatch`]) as the core's engine events
//! ([`kvroute_core::KvEvent`], which borrow their slices): [`Converted::new`] owns the folded
//! hashes, [`Converted::events`] lends the events.
//!
//! Extra keys (vLLM's per-block tuples: the LoRA name, then multimodal `(identifier, offset)`
//! pairs, then the cache salt on a prompt's first block, then a prompt-embeds digest): the
//! LoRA name is the event's `lora_name`, the salt keys the first block as kvroute's token keys
//! do; a block with anything else (multimodal inputs, prompt embeddings, a string that is
//! neither) cannot be keyed as kvroute keys requests, so it and the blocks after it are left
//! unkeyed (`unkeyable_from`), and counted as such by the core.

use kvroute_core::{EngineBlockHash, KvEvent, Medium, StoredBlocks};
use kvroute_kv_events::wire::{self, Value};

/// The GPU medium as vLLM names it (`MEDIUM_GPU`); no medium also means the GPU.
const GPU: &str = "GPU";

fn medium(m: Option<&str>) -> Medium {
    match m {
        None => Medium::Gpu,
        Some(m) if m.eq_ignore_ascii_case(GPU) => Medium::Gpu,
        Some(_) => Medium::Other,
    }
}

fn hashes(h: &[wire::BlockHash]) -> Vec<EngineBlockHash> {
    h.iter().map(|h| EngineBlockHash(h.fold())).collect()
}

/// What the extra keys of a stored run say: its cache salt, and the first block kvroute cannot
/// key.
fn read_extra_keys(s: &wire::BlockStored) -> (Option<String>, Option<usize>) {
    let Some(per_block) = &s.extra_keys else {
        return (None, None);
    };
    let mut salt = None;
    for (i, keys) in per_block.iter().enumerate() {
        let Some(keys) = keys else { continue };
        let mut rest = keys.as_slice();
        if let (Some(Value::Str(first)), Some(lora)) = (rest.first(), s.lora_name.as_deref()) {
            if first == lora {
                rest = &rest[1..];
            }
        }
        match rest {
            [] => {}
            // The salt: a prompt's first block only.
            [Value::Str(v)] if i == 0 && s.parent_block_hash.is_none() => salt = Some(v.clone()),
            _ => return (salt, Some(i)),
        }
    }
    (salt, None)
}

/// One stored run with its owned parts.
#[derive(Debug)]
struct Stored {
    hashes: Vec<EngineBlockHash>,
    parent: Option<EngineBlockHash>,
    salt: Option<String>,
    unkeyable_from: Option<usize>,
}

#[derive(Debug)]
enum Owned {
    Stored(Stored),
    Removed(Vec<EngineBlockHash>),
    Cleared,
}

/// A batch's events with their hashes folded to 64 bits.
#[derive(Debug)]
pub struct Converted<'b> {
    batch: &'b wire::EventBatch,
    owned: Vec<Owned>,
}

impl<'b> Converted<'b> {
    /// Folds the hashes and reads the extra keys of `batch`'s events.
    pub fn new(batch: &'b wire::EventBatch) -> Self {
        let owned = batch
            .events
            .iter()
            .map(|e| match e {
                wire::KvEvent::BlockStored(s) => {
                    let (salt, unkeyable_from) = read_extra_keys(s);
                    Owned::Stored(Stored {
                        hashes: hashes(&s.block_hashes),
                        parent: s
                            .parent_block_hash
                            .as_ref()
                            .map(|p| EngineBlockHash(p.fold())),
                        salt,
                        unkeyable_from,
                    })
                }
                wire::KvEvent::BlockRemoved(r) => Owned::Removed(hashes(&r.block_hashes)),
                wire::KvEvent::AllBlocksCleared => Owned::Cleared,
            })
            .collect();
        Converted { batch, owned }
    }

    /// The core's events, in the batch's order.
    pub fn events(&self) -> Vec<KvEvent<'_>> {
        self.batch
            .events
            .iter()
            .zip(&self.owned)
            .map(|(e, o)| match (e, o) {
                (wire::KvEvent::BlockStored(s), Owned::Stored(st)) => {
                    KvEvent::Stored(StoredBlocks {
                        block_hashes: &st.hashes,
                        parent: st.parent,
                        token_ids: &s.token_ids,
                        block_size: s.block_size,
                        lora_name: s.lora_name.as_deref(),
                        cache_salt: st.salt.as_deref(),
                        unkeyable_from: st.unkeyable_from,
                        medium: medium(s.medium.as_deref()),
                        group: s.group_idx.unwrap_or(0),
                    })
                }
                (wire::KvEvent::BlockRemoved(r), Owned::Removed(h)) => KvEvent::Removed {
                    block_hashes: h,
                    medium: medium(r.medium.as_deref()),
                    group: r.group_idx.unwrap_or(0),
                },
                // Built from the same list in the same order: the remaining pair is a clear.
                _ => KvEvent::AllCleared,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::{BlockHash, BlockRemoved, BlockStored, EventBatch};

    fn stored(extra: Option<Vec<Option<Vec<Value>>>>, lora: Option<&str>) -> BlockStored {
        BlockStored {
            block_hashes: vec![BlockHash::from(7u64), BlockHash::Bytes(vec![0xff; 32])],
            parent_block_hash: None,
            token_ids: (0..8).collect(),
            block_size: 4,
            lora_name: lora.map(str::to_owned),
            extra_keys: extra,
            ..Default::default()
        }
    }

    fn one(batch: &EventBatch) -> String {
        format!("{:?}", Converted::new(batch).events())
    }

    #[test]
    fn hashes_fold_and_fields_carry_over() {
        let mut s = stored(None, None);
        s.medium = Some("GPU".into());
        let batch = EventBatch::new(
            0.0,
            vec![
                wire::KvEvent::BlockStored(s),
                wire::KvEvent::BlockRemoved(BlockRemoved {
                    block_hashes: vec![BlockHash::from(7u64)],
                    medium: Some("CPU".into()),
                    group_idx: Some(1),
                }),
                wire::KvEvent::AllBlocksCleared,
            ],
        );
        let c = Converted::new(&batch);
        let ev = c.events();
        let KvEvent::Stored(st) = ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!(
            st.block_hashes,
            &[EngineBlockHash(7), EngineBlockHash(u64::MAX)]
        );
        assert_eq!((st.parent, st.medium, st.group), (None, Medium::Gpu, 0));
        assert_eq!(st.token_ids.len(), 8);
        assert!(matches!(
            ev[1],
            KvEvent::Removed {
                medium: Medium::Other,
                group: 1,
                ..
            }
        ));
        assert!(matches!(ev[2], KvEvent::AllCleared));
    }

    #[test]
    fn extra_keys_give_the_salt_and_stop_keying_at_what_kvroute_cannot_reproduce() {
        let salt = |v: &str| Some(vec![Value::Str(v.into())]);
        // The salt on the first block, with the LoRA name before it.
        let b = EventBatch::new(
            0.0,
            vec![wire::KvEvent::BlockStored(stored(
                Some(vec![
                    Some(vec![Value::Str("ad".into()), Value::Str("s1".into())]),
                    Some(vec![Value::Str("ad".into())]),
                ]),
                Some("ad"),
            ))],
        );
        let text = one(&b);
        assert!(text.contains("cache_salt: Some(\"s1\")"), "{text}");
        assert!(text.contains("unkeyable_from: None"), "{text}");
        assert!(text.contains("lora_name: Some(\"ad\")"), "{text}");
        // A multimodal pair on block 1.
        let mm = Some(vec![Value::Array(vec![
            Value::Str("img".into()),
            Value::UInt(0),
        ])]);
        let b = EventBatch::new(
            0.0,
            vec![wire::KvEvent::BlockStored(stored(
                Some(vec![None, mm]),
                None,
            ))],
        );
        assert!(one(&b).contains("unkeyable_from: Some(1)"));
        // A string on a later block is no salt: unkeyable there.
        let b = EventBatch::new(
            0.0,
            vec![wire::KvEvent::BlockStored(stored(
                Some(vec![salt("s"), salt("x")]),
                None,
            ))],
        );
        let text = one(&b);
        assert!(
            text.contains("cache_salt: Some(\"s\")") && text.contains("unkeyable_from: Some(1)")
        );
        // Prompt-embeds digests are bytes.
        let b = EventBatch::new(
            0.0,
            vec![wire::KvEvent::BlockStored(stored(
                Some(vec![Some(vec![Value::Bytes(vec![1; 32])])]),
                None,
            ))],
        );
        assert!(one(&b).contains("unkeyable_from: Some(0)"));
    }
}
