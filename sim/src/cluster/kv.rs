//! [`ClusterConfig::kv_events`]: the engines' KV events, published into the router's engine
//! views.

use kvroute_core::{EngineBlockHash, KvEvent, KvSource, Medium, StoredBlocks};

use super::{ts, Cluster};
use crate::engine::BlockEvent;

impl Cluster {
    /// [`ClusterConfig::kv_events`]: applies engine `e`'s events since its last batch to the
    /// router as one batch (nothing when there are none), as a subscriber would at `t`.
    pub(super) fn publish_kv_events(&mut self, e: usize, t: u64) {
        self.kv_scratch.clear();
        self.engines[e].drain_kv_events(&mut self.kv_scratch);
        if self.kv_scratch.is_empty() {
            return;
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
