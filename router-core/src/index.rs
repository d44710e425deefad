//! The prefix index: block hash → (model, pod) → last write time (AIBrix v0.7.0's
//! `pkg/utils/prefixcacheindexer/hash.go`).
//!
//! - One entry per block hash, holding the `(model, pod)` pairs routed a prompt containing that
//!   prefix, each with the time it was last written.
//! - Capacity is counted in blocks across all models and pods. Inserting a new block at capacity
//!   evicts the least recently *written* block. Lookups never refresh recency.
//! - A pair older than the TTL is ignored by lookups; a block whose every pair is older than the
//!   TTL is dropped by [`PrefixIndex::expire`], which walks from the least recently written
//!   block and stops at the first live one. (A purge that removes a block's newest pair leaves
//!   the block where that write put it, so it may outlive its TTL there until the blocks
//!   written before it have expired: lookups ignore it all the same, but it takes capacity.)
//!   (AIBrix keeps per-pod times but never uses them, so a pod's stale entry stays matchable
//!   while another pod keeps the block alive; kvroute expires each pair on its own.)
//!
//! Layout: a slab of 40-byte entries linked into an intrusive LRU list, plus a `HashTable` of
//! `u32` slab slots keyed by the (seeded) hash of the block hash. About 48 bytes per block.

use hashbrown::HashTable;
use smallvec::SmallVec;

use crate::hash::BlockHash;
use crate::ids::{ModelId, PodId};
use crate::time::Timestamp;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Holder {
    model: ModelId,
    pod: PodId,
    written: Timestamp,
}

#[derive(Debug)]
struct Entry {
    hash: u64,
    // invariant: `prev` is the next more recently written entry (NIL at the head), `next` the
    // next older one (NIL at the tail). Free slots have both NIL and no holders.
    prev: u32,
    next: u32,
    holders: SmallVec<[Holder; 1]>,
}

impl Entry {
    fn last_written(&self) -> Timestamp {
        self.holders
            .iter()
            .map(|h| h.written)
            .max()
            .unwrap_or(Timestamp::ZERO)
    }
}

/// Counters of the prefix index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Blocks currently indexed.
    pub blocks: u64,
    /// Capacity in blocks.
    pub capacity: u64,
    /// New blocks inserted.
    pub inserted: u64,
    /// Blocks evicted to make room (capacity LRU).
    pub evicted: u64,
    /// Blocks dropped because every pair in them outlived the TTL.
    pub expired: u64,
    /// Blocks dropped because their last pod was removed.
    pub purged: u64,
}

/// The prefix index. Single owner, `&mut self` for every change; see the module docs.
#[derive(Debug)]
pub struct PrefixIndex {
    table: HashTable<u32>,
    hasher: ahash::RandomState,
    entries: Vec<Entry>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
    // invariant: live == entries.len() - free.len() == table.len() <= capacity
    live: usize,
    capacity: usize,
    ttl_ms: u64,
    // scratch for `longest_matches`: candidate position by pod index, NIL when not a candidate.
    position: Vec<u32>,
    // scratch: the slots `longest_matches` found, by block, reused by the next `insert`.
    walked: Vec<u32>,
    stats: IndexStats,
}

impl PrefixIndex {
    /// An empty index holding at most `capacity` blocks, each pod's entry valid `ttl_ms` after
    /// its last write. `hasher_seed` keys the hash table (any value; fixed for determinism).
    pub fn new(capacity: usize, ttl_ms: u64, hasher_seed: u64) -> Self {
        let k = |i: u64| crate::hash::mix64(hasher_seed.wrapping_add(i));
        PrefixIndex {
            table: HashTable::new(),
            hasher: ahash::RandomState::with_seeds(k(1), k(2), k(3), k(4)),
            entries: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            live: 0,
            capacity: capacity.max(1),
            ttl_ms: ttl_ms.max(1),
            position: Vec::new(),
            walked: Vec::new(),
            stats: IndexStats::default(),
        }
    }

    /// Blocks currently indexed.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no block is indexed.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Counters.
    pub fn stats(&self) -> IndexStats {
        IndexStats {
            blocks: self.live as u64,
            capacity: self.capacity as u64,
            ..self.stats
        }
    }

    /// Changes the capacity (evicting the oldest blocks if it shrinks) and the TTL.
    pub fn set_limits(&mut self, capacity: usize, ttl_ms: u64) {
        self.capacity = capacity.max(1);
        self.ttl_ms = ttl_ms.max(1);
        while self.live > self.capacity {
            self.remove_slot(self.tail);
            self.stats.evicted += 1;
        }
    }

    fn find(&self, hash: BlockHash) -> Option<u32> {
        let entries = &self.entries;
        self.table
            .find(self.hasher.hash_one(hash.0), |&slot| {
                entries[slot as usize].hash == hash.0
            })
            .copied()
    }

    /// For each pod of `pods`, the number of leading blocks of `hashes` it holds for `model`
    /// (contiguous from the first block), written to `out` in the same order.
    ///
    /// This is AIBrix's walk (`seqSearchPrefix`): it stops at the first block no remaining pod
    /// holds, so its cost is bounded by the longest match, not by the prompt. Pods must be
    /// distinct.
    pub fn longest_matches(
        &mut self,
        model: ModelId,
        hashes: &[BlockHash],
        pods: &[PodId],
        now: Timestamp,
        out: &mut Vec<u32>,
    ) {
        self.longest_matches_within(model, hashes, pods, now, self.ttl_ms, out);
    }

    /// [`PrefixIndex::longest_matches`] counting only the entries written less than
    /// `max_age_ms` before `now` (and within the TTL).
    pub fn longest_matches_within(
        &mut self,
        model: ModelId,
        hashes: &[BlockHash],
        pods: &[PodId],
        now: Timestamp,
        max_age_ms: u64,
        out: &mut Vec<u32>,
    ) {
        let max_age_ms = max_age_ms.min(self.ttl_ms);
        self.walked.clear();
        out.clear();
        out.resize(pods.len(), 0);
        if pods.is_empty() || hashes.is_empty() {
            return;
        }
        let needed = pods.iter().map(|p| p.index() + 1).max().unwrap_or(0);
        if self.position.len() < needed {
            self.position.resize(needed, NIL);
        }
        for (i, p) in pods.iter().enumerate() {
            self.position[p.index()] = i as u32;
        }
        for (depth, &hash) in hashes.iter().enumerate() {
            let Some(slot) = self.find(hash) else { break };
            self.walked.push(slot);
            let mut extended = 0usize;
            for h in &self.entries[slot as usize].holders {
                if h.model != model || now.millis_since(h.written) >= max_age_ms {
                    continue;
                }
                let Some(&pos) = self.position.get(h.pod.index()) else {
                    continue;
                };
                if pos != NIL && out[pos as usize] == depth as u32 {
                    out[pos as usize] = depth as u32 + 1;
                    extended += 1;
                }
            }
            if extended == 0 {
                break;
            }
        }
        for p in pods {
            self.position[p.index()] = NIL;
        }
    }

    /// The number of leading blocks of `hashes` that `pod` holds for `model`.
    pub fn matched_blocks(
        &mut self,
        model: ModelId,
        pod: PodId,
        hashes: &[BlockHash],
        now: Timestamp,
    ) -> u32 {
        let mut out = Vec::with_capacity(1);
        self.longest_matches(model, hashes, &[pod], now, &mut out);
        out[0]
    }

    /// Records that `pod` was sent a prompt with these block hashes for `model` at `now`: every
    /// block gets `(model, pod) → now` and becomes the most recently written.
    pub fn insert(&mut self, model: ModelId, pod: PodId, hashes: &[BlockHash], now: Timestamp) {
        // Last block first, so that the prompt's leading blocks (shared by the most prompts, and
        // needed for any contiguous match) end up the most recently written.
        for (i, &hash) in hashes.iter().enumerate().rev() {
            match self.walked_slot(i, hash).or_else(|| self.find(hash)) {
                Some(slot) => {
                    self.touch(slot, model, pod, now);
                    self.unlink(slot);
                    self.push_head(slot);
                }
                None => {
                    if self.live >= self.capacity {
                        self.remove_slot(self.tail);
                        self.stats.evicted += 1;
                    }
                    let slot = self.alloc(
                        hash.0,
                        Holder {
                            model,
                            pod,
                            written: now,
                        },
                    );
                    let hasher = &self.hasher;
                    let entries = &self.entries;
                    self.table
                        .insert_unique(hasher.hash_one(hash.0), slot, |&s| {
                            hasher.hash_one(entries[s as usize].hash)
                        });
                    self.push_head(slot);
                    self.live += 1;
                    self.stats.inserted += 1;
                }
            }
        }
        self.walked.clear();
    }

    /// The slot the last [`PrefixIndex::longest_matches`] found for block `i`, if it still
    /// holds `hash` (an eviction since may have reused it).
    fn walked_slot(&self, i: usize, hash: BlockHash) -> Option<u32> {
        let slot = *self.walked.get(i)?;
        let e = &self.entries[slot as usize];
        (e.hash == hash.0 && !e.holders.is_empty()).then_some(slot)
    }

    /// Sets `(model, pod) → now` in the entry and drops pairs that outlived the TTL.
    fn touch(&mut self, slot: u32, model: ModelId, pod: PodId, now: Timestamp) {
        let ttl = self.ttl_ms;
        let holders = &mut self.entries[slot as usize].holders;
        if let [only] = holders.as_mut_slice() {
            if only.model == model && only.pod == pod {
                only.written = now;
                return;
            }
        }
        if holders.iter().any(|h| now.millis_since(h.written) >= ttl) {
            holders.retain(|h| {
                now.millis_since(h.written) < ttl || (h.model == model && h.pod == pod)
            });
        }
        match holders
            .iter_mut()
            .find(|h| h.model == model && h.pod == pod)
        {
            Some(h) => h.written = now,
            None => holders.push(Holder {
                model,
                pod,
                written: now,
            }),
        }
    }

    /// Drops every block whose pairs all outlived the TTL at `now`, oldest first.
    pub fn expire(&mut self, now: Timestamp) {
        while self.tail != NIL {
            let last = self.entries[self.tail as usize].last_written();
            if now.millis_since(last) < self.ttl_ms {
                break;
            }
            self.remove_slot(self.tail);
            self.stats.expired += 1;
        }
    }

    /// When [`PrefixIndex::expire`] next has work to do, if ever.
    pub fn next_expiry(&self) -> Option<Timestamp> {
        (self.tail != NIL).then(|| {
            self.entries[self.tail as usize]
                .last_written()
                .add_millis(self.ttl_ms)
        })
    }

    /// Removes `pod` from every block (for every model, or only for `model`); blocks left
    /// without a pod are dropped. Costs a walk of the whole index.
    pub fn purge_pod(&mut self, pod: PodId, model: Option<ModelId>) {
        self.purge_where(|h| h.pod == pod && model.is_none_or(|m| m == h.model));
    }

    /// Removes `pod` (for every model) from the blocks `hashes` (its engine evicted them);
    /// blocks left without a pod are dropped.
    pub fn forget(&mut self, pod: PodId, hashes: &[BlockHash]) {
        self.walked.clear();
        for &hash in hashes {
            let Some(slot) = self.find(hash) else {
                continue;
            };
            let holders = &mut self.entries[slot as usize].holders;
            holders.retain(|h| h.pod != pod);
            if holders.is_empty() {
                self.remove_slot(slot);
                self.stats.purged += 1;
            }
        }
    }

    /// Removes every entry of `model`, whatever pod holds it (the model was removed).
    pub fn purge_model(&mut self, model: ModelId) {
        self.purge_where(|h| h.model == model);
    }

    /// Removes the holders `drop` selects, and the blocks left with none. Walks the index.
    fn purge_where(&mut self, drop: impl Fn(&Holder) -> bool) {
        let mut slot = self.head;
        while slot != NIL {
            let next = self.entries[slot as usize].next;
            let holders = &mut self.entries[slot as usize].holders;
            holders.retain(|h| !drop(h));
            if holders.is_empty() {
                self.remove_slot(slot);
                self.stats.purged += 1;
            }
            slot = next;
        }
    }

    /// Drops every block (used when the hash configuration changes).
    pub fn clear(&mut self) {
        self.walked.clear();
        self.table.clear();
        self.entries.clear();
        self.free.clear();
        self.head = NIL;
        self.tail = NIL;
        self.live = 0;
    }

    fn alloc(&mut self, hash: u64, holder: Holder) -> u32 {
        let mut holders = SmallVec::new();
        holders.push(holder);
        let entry = Entry {
            hash,
            prev: NIL,
            next: NIL,
            holders,
        };
        if let Some(slot) = self.free.pop() {
            self.entries[slot as usize] = entry;
            return slot;
        }
        if self.entries.len() == self.entries.capacity() {
            // Grow by doubling but never past the capacity, so a full index wastes no slab space.
            let target = (self.entries.len() * 2).clamp(64, self.capacity.max(64));
            self.entries.reserve_exact(target - self.entries.len());
        }
        self.entries.push(entry);
        (self.entries.len() - 1) as u32
    }

    fn remove_slot(&mut self, slot: u32) {
        debug_assert!(slot != NIL);
        self.unlink(slot);
        let hash = self.entries[slot as usize].hash;
        match self
            .table
            .find_entry(self.hasher.hash_one(hash), |&s| s == slot)
        {
            Ok(e) => {
                e.remove();
            }
            Err(_) => debug_assert!(false, "slot {slot} missing from the hash table"),
        }
        let e = &mut self.entries[slot as usize];
        e.holders = SmallVec::new();
        e.hash = 0;
        self.free.push(slot);
        self.live -= 1;
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next) = {
            let e = &self.entries[slot as usize];
            (e.prev, e.next)
        };
        if prev != NIL {
            self.entries[prev as usize].next = next;
        } else if self.head == slot {
            self.head = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        } else if self.tail == slot {
            self.tail = prev;
        }
        let e = &mut self.entries[slot as usize];
        e.prev = NIL;
        e.next = NIL;
    }

    fn push_head(&mut self, slot: u32) {
        let old = self.head;
        {
            let e = &mut self.entries[slot as usize];
            e.prev = NIL;
            e.next = old;
        }
        if old != NIL {
            self.entries[old as usize].prev = slot;
        } else {
            self.tail = slot;
        }
        self.head = slot;
    }

    /// Checks the structural invariants (LRU list ↔ hash table ↔ slab). For tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut count = 0usize;
        let mut slot = self.head;
        let mut prev = NIL;
        while slot != NIL {
            let e = &self.entries[slot as usize];
            if e.prev != prev {
                return Err(format!("slot {slot}: prev {} != {prev}", e.prev));
            }
            if e.holders.is_empty() {
                return Err(format!("slot {slot} is linked but has no holders"));
            }
            if self.find(BlockHash(e.hash)) != Some(slot) {
                return Err(format!("slot {slot} not found by its hash"));
            }
            count += 1;
            if count > self.entries.len() {
                return Err("LRU list has a cycle".into());
            }
            prev = slot;
            slot = e.next;
        }
        if prev != self.tail {
            return Err("tail does not end the list".into());
        }
        if count != self.live || self.table.len() != self.live || self.live > self.capacity {
            return Err(format!(
                "counts disagree: list {count}, live {}, table {}, capacity {}",
                self.live,
                self.table.len(),
                self.capacity
            ));
        }
        if self.entries.len() - self.free.len() != self.live {
            return Err("free list and live count disagree".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: ModelId = ModelId(0);
    const A: PodId = PodId(0);
    const B: PodId = PodId(1);
    const C: PodId = PodId(2);

    fn hs(n: u64) -> Vec<BlockHash> {
        (1..=n).map(BlockHash).collect()
    }
    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn contiguous_matches_per_pod() {
        let mut ix = PrefixIndex::new(100, 1000, 0);
        let h = hs(7);
        ix.insert(M, A, &h[..5], t(0));
        ix.insert(M, B, &h, t(0));
        let mut out = Vec::new();
        ix.longest_matches(M, &h, &[A, B, C], t(1), &mut out);
        assert_eq!(out, vec![5, 7, 0]);
        // A gap breaks contiguity: C holds blocks 2.. but not block 1.
        ix.insert(M, C, &h[1..], t(1));
        ix.longest_matches(M, &h, &[C], t(1), &mut out);
        assert_eq!(out, vec![0]);
        ix.check_invariants().unwrap();
    }

    #[test]
    fn models_are_separate() {
        let mut ix = PrefixIndex::new(100, 1000, 0);
        ix.insert(ModelId(1), A, &hs(3), t(0));
        assert_eq!(ix.matched_blocks(M, A, &hs(3), t(0)), 0);
        assert_eq!(ix.matched_blocks(ModelId(1), A, &hs(3), t(0)), 3);
    }

    #[test]
    fn capacity_evicts_least_recently_written_and_lookups_do_not_refresh() {
        let mut ix = PrefixIndex::new(3, 1000, 0);
        ix.insert(M, A, &[BlockHash(1)], t(0));
        ix.insert(M, A, &[BlockHash(2)], t(1));
        ix.insert(M, A, &[BlockHash(3)], t(2));
        // A lookup of block 1 must not save it.
        assert_eq!(ix.matched_blocks(M, A, &[BlockHash(1)], t(3)), 1);
        ix.insert(M, A, &[BlockHash(4)], t(4));
        assert_eq!(ix.matched_blocks(M, A, &[BlockHash(1)], t(4)), 0);
        // A write does refresh: rewrite 2, then insert 5 evicts 3.
        ix.insert(M, B, &[BlockHash(2)], t(5));
        ix.insert(M, A, &[BlockHash(5)], t(6));
        assert_eq!(ix.matched_blocks(M, A, &[BlockHash(2)], t(6)), 1);
        assert_eq!(ix.matched_blocks(M, A, &[BlockHash(3)], t(6)), 0);
        assert_eq!(ix.stats().evicted, 2);
        ix.check_invariants().unwrap();
    }

    #[test]
    fn ttl_expires_pairs_and_blocks() {
        let mut ix = PrefixIndex::new(100, 10, 0);
        ix.insert(M, A, &hs(2), t(0));
        ix.insert(M, B, &hs(1), t(5));
        assert_eq!(ix.next_expiry(), Some(t(10)));
        // At 10 A's pairs are stale; block 1 survives through B.
        assert_eq!(ix.matched_blocks(M, A, &hs(2), t(10)), 0);
        assert_eq!(ix.matched_blocks(M, B, &hs(2), t(10)), 1);
        ix.expire(t(10));
        assert_eq!(ix.len(), 1);
        assert_eq!(ix.next_expiry(), Some(t(15)));
        ix.expire(t(15));
        assert!(ix.is_empty());
        assert_eq!(ix.stats().expired, 2);
        assert_eq!(ix.next_expiry(), None);
        ix.check_invariants().unwrap();
    }

    #[test]
    fn forget_removes_a_pod_from_some_blocks() {
        let mut idx = PrefixIndex::new(100, 60_000, 1);
        let (a, b, m) = (PodId(0), PodId(1), ModelId(0));
        idx.insert(m, a, &hs(4), t(0));
        idx.insert(m, b, &hs(2), t(0));
        idx.forget(a, &hs(2));
        assert_eq!(idx.matched_blocks(m, a, &hs(4), t(1)), 0);
        assert_eq!(idx.matched_blocks(m, b, &hs(4), t(1)), 2);
        assert_eq!(idx.len(), 4, "blocks 0-1 keep b, 2-3 keep a");
        idx.forget(b, &hs(2));
        assert_eq!(idx.len(), 2);
        idx.check_invariants().unwrap();
    }

    #[test]
    fn purge_removes_a_pod_everywhere() {
        let mut ix = PrefixIndex::new(100, 1000, 0);
        ix.insert(M, A, &hs(4), t(0));
        ix.insert(M, B, &hs(2), t(0));
        ix.purge_pod(A, None);
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.matched_blocks(M, A, &hs(4), t(0)), 0);
        assert_eq!(ix.matched_blocks(M, B, &hs(4), t(0)), 2);
        assert_eq!(ix.stats().purged, 2);
        ix.check_invariants().unwrap();
    }

    #[test]
    fn shrinking_capacity_evicts_oldest() {
        let mut ix = PrefixIndex::new(10, 1000, 0);
        ix.insert(M, A, &hs(10), t(0));
        ix.set_limits(4, 1000);
        assert_eq!(ix.len(), 4);
        ix.check_invariants().unwrap();
    }
}
