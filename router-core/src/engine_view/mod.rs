//! Engine views: what each engine's KV cache holds, as the engine itself publishes it (vLLM's
//! KV-cache events: blocks stored, blocks removed, all blocks cleared), keyed by kvroute's
//! token-block keys so that a request's keys match it directly.
//!
//! ## Contract
//! - **Keys are recomputed.** Engine block hashes are opaque (vLLM's are random per process
//!   unless `PYTHONHASHSEED` is set). A stored block's key is [`crate::TokenKeyConfig`]'s key of
//!   its tokens after its parent's key, with the event's LoRA name on every block and its cache
//!   salt on a prompt's first block: the key a request with the same tokens gets. A block whose
//!   parent the view does not hold, or whose extra keys kvroute cannot reproduce (multimodal
//!   inputs, prompt embeddings), is not keyed (counted as `unkeyed`): no request could match it.
//! - **Only the GPU cache of the first KV-cache group counts**: blocks of another medium (CPU
//!   offload) or group are ignored (counted).
//! - **Sequence numbers.** Each pod's batches carry the publisher's sequence number. A live batch
//!   after a gap is not applied: [`KvApplied::Gap`] asks the shell to replay from the first
//!   missing number ([`KvSource::Replay`]), or to give up with [`crate::Router::accept_kv_gap`], which
//!   marks the view stale. A live batch numbered below the next expected one means the
//!   publisher (and so the engine) restarted: the view is cleared and starts again.
//! - **Stale views are not used.** A view is *complete* while every event since the engine's
//!   cache was last empty has been applied (the publisher's sequence started at 0, a gap was
//!   replayed, or an all-blocks-cleared event arrived). Strategies match a pod against its view
//!   only while the view is complete, not suspended and keyed at the request's block size;
//!   otherwise against the router-side index, and the decision says which (see
//!   [`crate::MatchView`]).
//! - **Awaited blocks.** A token-keyed request routed to a pod on its view with full blocks the
//!   view did not hold will make the engine store blocks: [`ViewStats::awaiting_since`] is when
//!   the oldest such request was routed since the last applied batch.
//! - **Suspended views.** A shell that suspects the events stopped (blocks awaited for too
//!   long) suspends the view ([`crate::Router::suspend_kv_view`]): it is kept
//!   and still fed, but not used, until the next batch is applied.

mod blocks;

use crate::hash::BlockHash;
use crate::ids::PodId;
use crate::time::Timestamp;
use crate::token_keys::{BlockExtras, TokenKeyConfig};
use blocks::PodBlocks;

/// An engine's block hash as published, opaque to kvroute. Shells fold a hash published as
/// bytes into 64 bits (any fixed function: it is only compared with itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EngineBlockHash(pub u64);

/// Where the engine stored blocks (vLLM's `medium`; absent means the GPU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Medium {
    /// The GPU cache (vLLM: `"GPU"` or no medium).
    #[default]
    Gpu,
    /// Anything else (a CPU or disk offload tier): ignored by the view.
    Other,
}

/// Blocks the engine stored (vLLM's `BlockStored`).
#[derive(Clone, Copy, Debug, Default)]
pub struct StoredBlocks<'a> {
    /// The blocks' engine hashes, in prompt order.
    pub block_hashes: &'a [EngineBlockHash],
    /// The engine hash of the block before the first one; `None` for a prompt's first block.
    pub parent: Option<EngineBlockHash>,
    /// The blocks' tokens, `block_size` per block.
    pub token_ids: &'a [u32],
    /// Tokens per block.
    pub block_size: u32,
    /// The LoRA adapter the blocks were computed with.
    pub lora_name: Option<&'a str>,
    /// The request's cache salt (keys the first block when `parent` is `None`).
    pub cache_salt: Option<&'a str>,
    /// The index of the first block whose extra keys kvroute cannot reproduce (multimodal
    /// inputs, prompt embeddings); it and the blocks after it are not keyed.
    pub unkeyable_from: Option<usize>,
    /// Where they were stored.
    pub medium: Medium,
    /// The KV-cache group (vLLM's `group_idx`; absent means 0).
    pub group: u32,
}

/// One engine event, decoded by the shell.
#[derive(Clone, Copy, Debug)]
pub enum KvEvent<'a> {
    /// Blocks stored.
    Stored(StoredBlocks<'a>),
    /// Blocks removed (evicted).
    Removed {
        /// Their engine hashes.
        block_hashes: &'a [EngineBlockHash],
        /// Where they were removed from.
        medium: Medium,
        /// The KV-cache group.
        group: u32,
    },
    /// Every block removed (vLLM's `AllBlocksCleared`, e.g. a cache reset).
    AllCleared,
}

/// How a batch reached the shell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSource {
    /// The publisher's live stream.
    Live,
    /// The publisher's replay of its buffered batches (after a gap).
    Replay,
}

/// What became of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvApplied {
    /// Applied.
    Applied(BatchCounts),
    /// Already applied (a replay overlapping what arrived live); ignored.
    Duplicate,
    /// Not applied: batches from `expected` are missing. Replay from `expected`, then feed this
    /// batch again as [`KvSource::Replay`] (a duplicate if the replay covered it); or call
    /// [`crate::Router::accept_kv_gap`] (the view becomes stale) and feed it again.
    Gap {
        /// The first missing sequence number.
        expected: u64,
    },
}

/// Counts of one applied batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchCounts {
    /// Blocks stored and keyed.
    pub stored: u32,
    /// Blocks removed that the view held.
    pub removed: u32,
    /// Stored blocks not keyed (unknown parent, unreproducible extra keys).
    pub unkeyed: u32,
    /// Blocks of another medium or group, ignored.
    pub ignored: u32,
    /// Whether the batch restarted the view (a publisher restart or an all-blocks-cleared).
    pub reset: bool,
}

/// A pod's engine view as reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ViewStats {
    /// Every event since the cache was last empty was applied and no gap is pending: strategies
    /// use the view unless it is [`ViewStats::suspended`].
    pub complete: bool,
    /// A gap waits for a replay or [`crate::Router::accept_kv_gap`].
    pub gap_pending: bool,
    /// Suspended by the shell ([`crate::Router::suspend_kv_view`]) until the next batch.
    pub suspended: bool,
    /// When the oldest request routed on the view with blocks it did not hold was routed,
    /// since the last applied batch (the engine owes a batch since then).
    pub awaiting_since: Option<Timestamp>,
    /// Engine blocks held.
    pub blocks: u64,
    /// The block size the events are keyed at (0 before any stored block).
    pub block_size: u32,
    /// Bytes of memory the view holds.
    pub memory_bytes: u64,
    /// The next expected sequence number, once a batch was applied.
    pub next_seq: Option<u64>,
    /// When the last batch arrived (applied or not).
    pub last_batch: Option<Timestamp>,
    /// Totals since the view was created.
    pub stored: u64,
    /// Blocks removed.
    pub removed: u64,
    /// Stored blocks not keyed.
    pub unkeyed: u64,
    /// Blocks of another medium or group.
    pub ignored: u64,
    /// Gaps detected.
    pub gaps: u64,
    /// Times the view was emptied (restart, clear).
    pub resets: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Nothing applied yet: sequence 0 makes the view complete; anything else is a gap.
    Start,
    /// After an accepted gap: any number is applied.
    Any,
    /// The next number expected.
    Seq(u64),
}

#[derive(Debug)]
struct PodView {
    blocks: PodBlocks,
    block_size: u32,
    next: Next,
    complete: bool,
    gap_pending: bool,
    suspended: bool,
    awaiting_since: Option<Timestamp>,
    stats: ViewStats,
}

impl PodView {
    fn new(seed: u64) -> Self {
        PodView {
            blocks: PodBlocks::new(seed),
            block_size: 0,
            next: Next::Start,
            complete: false,
            gap_pending: false,
            suspended: false,
            awaiting_since: None,
            stats: ViewStats::default(),
        }
    }

    fn reset(&mut self) {
        self.blocks.clear();
        self.stats.resets += 1;
    }
}

/// Every pod's engine view. Single owner, inside the [`crate::Router`].
#[derive(Debug, Default)]
pub(crate) struct EngineViews {
    // invariant: indexed by pod index; None for a pod without a view.
    views: Vec<Option<PodView>>,
    seed: u64,
    scratch: Vec<u8>,
    keys: Vec<u64>,
    gone: Gone,
}

/// What the last applied batch says the engine no longer holds, for the router-side index.
#[derive(Debug, Default)]
pub(crate) struct Gone {
    /// Keys the engine evicted (no engine block carries them any more).
    pub(crate) keys: Vec<BlockHash>,
    /// The engine's cache was emptied (cleared, restarted, block size changed).
    pub(crate) all: bool,
}

impl EngineViews {
    /// No views; `seed` is the router's hash seed (keys are [`TokenKeyConfig`]s of it).
    pub(crate) fn new(seed: u64) -> Self {
        EngineViews {
            seed,
            ..EngineViews::default()
        }
    }

    /// Applies one batch of `pod`'s events (see the module docs for sequence numbers).
    pub(crate) fn apply(
        &mut self,
        pod: PodId,
        source: KvSource,
        seq: u64,
        events: &[KvEvent<'_>],
        now: Timestamp,
    ) -> KvApplied {
        let i = pod.index();
        if self.views.len() <= i {
            self.views.resize_with(i + 1, || None);
        }
        let seed = self.seed;
        let view = self.views[i].get_or_insert_with(|| PodView::new(seed));
        view.stats.last_batch = Some(now);
        let mut counts = BatchCounts::default();
        match view.next {
            Next::Seq(next) if seq < next => {
                if source == KvSource::Replay {
                    return KvApplied::Duplicate;
                }
                // A lower live number: a new publisher, so a new engine with an empty cache.
                view.reset();
                self.gone.all = true;
                counts.reset = true;
                view.next = Next::Start;
                view.complete = false;
                view.gap_pending = false;
                if seq != 0 {
                    view.gap_pending = true;
                    view.stats.gaps += 1;
                    return KvApplied::Gap { expected: 0 };
                }
                view.complete = true;
            }
            Next::Seq(next) if seq > next => {
                if !view.gap_pending {
                    view.gap_pending = true;
                    view.stats.gaps += 1;
                }
                return KvApplied::Gap { expected: next };
            }
            Next::Start if seq != 0 => {
                if !view.gap_pending {
                    view.gap_pending = true;
                    view.stats.gaps += 1;
                }
                return KvApplied::Gap { expected: 0 };
            }
            Next::Start => view.complete = true,
            Next::Seq(_) | Next::Any => {}
        }
        view.gap_pending = false;
        view.suspended = false;
        view.awaiting_since = None;
        view.next = Next::Seq(seq.saturating_add(1));
        for event in events {
            apply_event(
                view,
                seed,
                event,
                &mut counts,
                &mut self.scratch,
                &mut self.keys,
                &mut self.gone,
            );
        }
        view.stats.stored += u64::from(counts.stored);
        view.stats.removed += u64::from(counts.removed);
        view.stats.unkeyed += u64::from(counts.unkeyed);
        view.stats.ignored += u64::from(counts.ignored);
        KvApplied::Applied(counts)
    }

    /// What the batches applied since the last call say the engine no longer holds (then
    /// forgotten here).
    pub(crate) fn take_gone(&mut self) -> Gone {
        std::mem::take(&mut self.gone)
    }

    /// Gives up on replaying `pod`'s pending gap: the view is stale (not used) until the engine
    /// restarts or clears its cache, and the next batch is applied whatever its number.
    pub(crate) fn accept_gap(&mut self, pod: PodId) {
        if let Some(Some(view)) = self.views.get_mut(pod.index()) {
            view.complete = false;
            view.gap_pending = false;
            view.next = Next::Any;
        }
    }

    /// Stops using `pod`'s view until its next applied batch; false if it has none.
    pub(crate) fn suspend(&mut self, pod: PodId) -> bool {
        match self.views.get_mut(pod.index()) {
            Some(Some(view)) => {
                view.suspended = true;
                true
            }
            _ => false,
        }
    }

    /// A request was routed to `pod` on its view with blocks the view did not hold.
    pub(crate) fn await_blocks(&mut self, pod: PodId, now: Timestamp) {
        if let Some(Some(view)) = self.views.get_mut(pod.index()) {
            view.awaiting_since.get_or_insert(now);
        }
    }

    /// Drops `pod`'s view (the pod stopped publishing, or was removed).
    pub(crate) fn remove(&mut self, pod: PodId) {
        if let Some(v) = self.views.get_mut(pod.index()) {
            *v = None;
        }
    }

    /// `pod`'s view, if it has one.
    pub(crate) fn stats(&self, pod: PodId) -> Option<ViewStats> {
        let view = self.views.get(pod.index())?.as_ref()?;
        Some(ViewStats {
            complete: view.complete && !view.gap_pending,
            gap_pending: view.gap_pending,
            suspended: view.suspended,
            awaiting_since: view.awaiting_since,
            blocks: view.blocks.len() as u64,
            block_size: view.block_size,
            memory_bytes: view.blocks.memory_bytes() as u64,
            next_seq: match view.next {
                Next::Seq(n) => Some(n),
                Next::Start | Next::Any => None,
            },
            ..view.stats
        })
    }

    /// The leading blocks of `keys` (token keys at `block_tokens`) that `pod`'s engine holds, if
    /// its view is usable for them: complete, no gap pending, keyed at that block size (or
    /// empty).
    pub(crate) fn leading(&self, pod: PodId, keys: &[BlockHash], block_tokens: u32) -> Option<u32> {
        let view = self.views.get(pod.index())?.as_ref()?;
        if !view.complete || view.gap_pending || view.suspended {
            return None;
        }
        if view.block_size != block_tokens {
            // Keyed at another block size: it cannot answer, unless it holds nothing at all.
            return (view.blocks.len() == 0).then_some(0);
        }
        Some(view.blocks.leading_held(keys) as u32)
    }
}

fn apply_event(
    view: &mut PodView,
    seed: u64,
    event: &KvEvent<'_>,
    counts: &mut BatchCounts,
    scratch: &mut Vec<u8>,
    keys: &mut Vec<u64>,
    gone: &mut Gone,
) {
    match *event {
        KvEvent::AllCleared => {
            view.reset();
            gone.all = true;
            view.complete = true;
            counts.reset = true;
        }
        KvEvent::Removed {
            block_hashes,
            medium,
            group,
        } => {
            if medium != Medium::Gpu || group != 0 {
                counts.ignored += block_hashes.len() as u32;
                return;
            }
            for h in block_hashes {
                let Some(key) = view.blocks.key_of(h.0) else {
                    continue;
                };
                view.blocks.remove(h.0);
                counts.removed += 1;
                if !view.blocks.holds(key) {
                    gone.keys.push(BlockHash(key));
                }
            }
        }
        KvEvent::Stored(s) => {
            let n = s.block_hashes.len() as u32;
            if s.medium != Medium::Gpu || s.group != 0 {
                counts.ignored += n;
                return;
            }
            let Ok(config) = TokenKeyConfig::new(s.block_size, seed) else {
                counts.unkeyed += n;
                return;
            };
            if view.block_size != s.block_size {
                // The engine's block size changed (it restarted with another): old keys are
                // of no use.
                if view.block_size != 0 {
                    view.reset();
                    gone.all = true;
                    counts.reset = true;
                }
                view.block_size = s.block_size;
            }
            let parent = match s.parent {
                None => Some(config.root()),
                Some(p) => view.blocks.key_of(p.0),
            };
            let block = s.block_size as usize;
            let keyable = s
                .unkeyable_from
                .unwrap_or(usize::MAX)
                .min(s.token_ids.len() / block)
                .min(s.block_hashes.len());
            let Some(mut parent) = parent else {
                counts.unkeyed += n;
                return;
            };
            let extras = BlockExtras {
                lora: s.lora_name,
                cache_salt: s.cache_salt,
            };
            keys.clear();
            for (i, tokens) in s.token_ids.chunks_exact(block).take(keyable).enumerate() {
                let first = i == 0 && s.parent.is_none();
                parent = config.block_key(parent, first, tokens, extras, scratch);
                keys.push(parent);
            }
            // The first block continues the held parent's key (none for a prompt's first).
            let mut held_parent = s.parent.and_then(|p| view.blocks.key_of(p.0));
            let mut stored = 0;
            for (h, &k) in s.block_hashes.iter().zip(keys.iter()) {
                if view.blocks.insert(h.0, k, held_parent) {
                    stored += 1;
                }
                held_parent = Some(k);
            }
            counts.stored += stored;
            counts.unkeyed += n - stored;
        }
    }
}

#[cfg(test)]
mod tests;
