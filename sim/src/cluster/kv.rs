//! [`ClusterConfig::kv_events`]: the engines' KV events, published into the router's engine
//! views.

use std::collections::HashSet;

use kvroute_core::{EngineBlockHash, KvEvent, KvSource, Medium, StoredBlocks};

use super::{ts, Cluster};
use crate::engine::{block_hashes, BlockEvent};

/// An engine's prefix cache as its published events describe it: the blocks stored and not
/// removed since, by the engine's own block hash.
#[derive(Clone, Debug, Default)]
pub(super) struct PublishedCache {
    blocks: HashSet<u64>,
}

impl PublishedCache {
    fn apply(&mut self, event: &BlockEvent) {
        match event {
            BlockEvent::Stored { hash, .. } => {
                self.blocks.insert(*hash);
            }
            BlockEvent::Removed { hash } => {
                self.blocks.remove(hash);
            }
            BlockEvent::Cleared => self.blocks.clear(),
        }
    }

    /// The prompt tokens these blocks cover from the start of `tokens`, counted as the engine
    /// counts a hit (whole blocks, and never the prompt's last token).
    pub(super) fn cached_prefix_tokens(&self, tokens: &[u32], block_size: u32) -> u32 {
        let Some(last) = tokens.len().checked_sub(1) else {
            return 0;
        };
        let blocks = last / block_size.max(1) as usize;
        let hashes = block_hashes(&tokens[..blocks * block_size as usize], block_size);
        let held = hashes
            .iter()
            .take_while(|h| self.blocks.contains(h))
            .count();
        held as u32 * block_size
    }
}

impl Cluster {
    /// [`ClusterConfig::kv_events`]: applies engine `e`'s events since its last batch to the
    /// router as one batch (nothing when there are none), as a subscriber would at `t`.
    pub(super) fn publish_kv_events(&mut self, e: usize, t: u64) {
        self.kv_scratch.clear();
        self.engines[e].drain_kv_events(&mut self.kv_scratch);
        if self.kv_scratch.is_empty() {
            return;
        }
        for event in &self.kv_scratch {
            self.published[e].apply(event);
        }
        let block_size = self.config.engine.block_size;
        let hashes: Vec<EngineBlockHash> = self
            .kv_scratch
            .iter()
            .map(|ev| match ev {
                BlockEvent::Stored { hash, .. } | BlockEvent::Removed { hash } => {
                    EngineBlockHash(*hash)
                }
                BlockEvent::Cleared => EngineBlockHash(0),
            })
            .collect();
        let events: Vec<KvEvent<'_>> = self
            .kv_scratch
            .iter()
            .zip(hashes.chunks(1))
            .map(|(ev, hash)| match ev {
                BlockEvent::Stored { parent, tokens, .. } => KvEvent::Stored(StoredBlocks {
                    block_hashes: hash,
                    parent: parent.map(EngineBlockHash),
                    token_ids: tokens,
                    block_size,
                    ..StoredBlocks::default()
                }),
                BlockEvent::Removed { .. } => KvEvent::Removed {
                    block_hashes: hash,
                    medium: Medium::Gpu,
                    group: 0,
                },
                BlockEvent::Cleared => KvEvent::AllCleared,
            })
            .collect();
        let seq = self.kv_seq[e];
        self.kv_seq[e] += 1;
        // Every batch is numbered in order and the pod exists: always applied.
        let _ = self
            .router
            .apply_kv_events(self.pod_ids[e], KvSource::Live, seq, &events, ts(t));
    }
}
