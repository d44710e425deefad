//! The KV block pool with prefix caching, as vLLM V1 keeps it.
//!
//! Contract:
//! - The pool has `capacity` blocks. A block is either private to one request (a partial block,
//!   a decode block, or a duplicate of a block another request computed first), or *cached*:
//!   named by the chained hash of the prompt prefix it ends, shared by reference count.
//! - `used = private + cached`. A cached block with no reference is *evictable*: it still
//!   counts as used, but [`BlockPool::reserve`] evicts evictable blocks least recently released
//!   first when the free blocks do not suffice.
//! - Releasing a request's cached blocks stamps them from its last block to its first, so the
//!   tail of a prompt is evicted before its head (vLLM frees blocks in reverse order).

use std::collections::{BTreeMap, HashMap};

use super::BlockEvent;

#[derive(Clone, Copy, Debug)]
struct Cached {
    refs: u32,
    // The LRU stamp while `refs == 0`.
    stamp: u64,
}

/// The block pool of one engine.
#[derive(Debug)]
pub(crate) struct BlockPool {
    capacity: u32,
    private: u32,
    cached: HashMap<u64, Cached>,
    // Evictable blocks by release stamp (oldest first).
    lru: BTreeMap<u64, u64>,
    next_stamp: u64,
    evictions: u64,
    // The KV events not yet drained, when they are recorded (stores are logged by the engine,
    // which knows the tokens).
    log: Option<Vec<BlockEvent>>,
}

impl BlockPool {
    pub(crate) fn new(capacity: u32) -> Self {
        BlockPool {
            capacity,
            private: 0,
            cached: HashMap::new(),
            lru: BTreeMap::new(),
            next_stamp: 0,
            evictions: 0,
            log: None,
        }
    }

    /// Starts or stops recording KV events (see [`BlockEvent`]).
    pub(crate) fn record_events(&mut self, on: bool) {
        self.log = on.then(Vec::new);
    }

    /// Whether KV events are recorded.
    pub(crate) fn recording(&self) -> bool {
        self.log.is_some()
    }

    /// Appends an event to the log, if one is kept.
    pub(crate) fn log(&mut self, event: BlockEvent) {
        if let Some(log) = &mut self.log {
            log.push(event);
        }
    }

    /// Moves the recorded events to `out`.
    pub(crate) fn drain_events(&mut self, out: &mut Vec<BlockEvent>) {
        if let Some(log) = &mut self.log {
            out.append(log);
        }
    }

    /// Blocks neither private nor cached.
    fn free(&self) -> u32 {
        self.capacity - self.private - self.cached.len() as u32
    }

    /// Blocks a reservation could obtain (free + evictable).
    pub(crate) fn available(&self) -> u32 {
        self.free() + self.lru.len() as u32
    }

    /// Blocks held by requests (private + referenced cached): vLLM's KV usage numerator.
    pub(crate) fn in_use(&self) -> u32 {
        self.private + (self.cached.len() - self.lru.len()) as u32
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    pub(crate) fn evictions(&self) -> u64 {
        self.evictions
    }

    /// How many leading hashes are cached.
    pub(crate) fn longest_prefix(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Takes a reference on each of these cached blocks (which must be cached).
    pub(crate) fn acquire(&mut self, hashes: &[u64]) {
        for h in hashes {
            if let Some(c) = self.cached.get_mut(h) {
                if c.refs == 0 {
                    self.lru.remove(&c.stamp);
                }
                c.refs += 1;
            }
        }
    }

    /// Drops one reference on each block, stamping newly unreferenced ones tail first.
    pub(crate) fn release(&mut self, hashes: &[u64]) {
        for h in hashes.iter().rev() {
            if let Some(c) = self.cached.get_mut(h) {
                c.refs = c.refs.saturating_sub(1);
                if c.refs == 0 {
                    c.stamp = self.next_stamp;
                    self.next_stamp += 1;
                    self.lru.insert(c.stamp, *h);
                }
            }
        }
    }

    /// Allocates `n` private blocks, evicting as needed. Returns false (and changes nothing)
    /// if fewer than `n` blocks are available.
    pub(crate) fn reserve(&mut self, n: u32) -> bool {
        if n > self.available() {
            return false;
        }
        while self.free() < n {
            let Some((_, h)) = self.lru.pop_first() else {
                return false;
            };
            self.cached.remove(&h);
            self.evictions += 1;
            self.log(BlockEvent::Removed { hash: h });
        }
        self.private += n;
        true
    }

    /// Frees `n` private blocks.
    pub(crate) fn free_private(&mut self, n: u32) {
        self.private = self.private.saturating_sub(n);
    }

    /// Turns one of the caller's private blocks into the cached block `hash`, referenced once.
    /// Returns false (the block stays private) if `hash` is already cached.
    pub(crate) fn promote(&mut self, hash: u64) -> bool {
        if self.cached.contains_key(&hash) || self.private == 0 {
            return false;
        }
        self.private -= 1;
        self.cached.insert(hash, Cached { refs: 1, stamp: 0 });
        true
    }

    /// Caches these blocks unreferenced (warming an engine), evicting as needed; stops when
    /// the pool is full of referenced blocks. Calls `stored` with the position of each block
    /// newly cached. Returns how many blocks are now cached.
    pub(crate) fn prime(
        &mut self,
        hashes: &[u64],
        mut stored: impl FnMut(&mut Self, usize),
    ) -> usize {
        for (i, h) in hashes.iter().enumerate() {
            if self.cached.contains_key(h) {
                continue;
            }
            if !self.reserve(1) || !self.promote(*h) {
                return i;
            }
            stored(self, i);
            self.release(std::slice::from_ref(h));
        }
        hashes.len()
    }

    /// Whether [`BlockPool::reset`] would succeed now: no cached block is referenced.
    pub(crate) fn can_reset(&self) -> bool {
        self.lru.len() == self.cached.len()
    }

    /// Forgets every unreferenced cached block. Returns false, changing nothing, while any
    /// cached block is referenced (as vLLM refuses to reset with requests running).
    pub(crate) fn reset(&mut self) -> bool {
        if !self.can_reset() {
            return false;
        }
        self.cached.clear();
        self.lru.clear();
        self.log(BlockEvent::Cleared);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_is_lru_and_tail_first() {
        let mut p = BlockPool::new(4);
        assert_eq!(p.prime(&[1, 2, 3], |_, _| {}), 3);
        assert_eq!(p.available(), 4);
        assert_eq!(p.in_use(), 0);
        // Primed 1,2,3 in order each released right away: 1 is the oldest.
        assert!(p.reserve(2));
        assert_eq!(p.longest_prefix(&[1, 2, 3]), 0);
        assert_eq!(p.longest_prefix(&[2, 3]), 2);
        assert_eq!(p.evictions(), 1);
        p.acquire(&[3]);
        assert!(p.reserve(1)); // evicts 2, not the referenced 3
        assert!(!p.reserve(1));
        assert_eq!(p.in_use(), 4);
        assert!(!p.reset());
        p.release(&[3]);
        assert!(p.reset());
    }

    #[test]
    fn promote_refuses_duplicates() {
        let mut p = BlockPool::new(3);
        assert!(p.reserve(2));
        assert!(p.promote(7));
        assert!(!p.promote(7));
        assert_eq!(p.in_use(), 2);
        p.release(&[7]);
        p.free_private(1);
        assert_eq!(p.in_use(), 0);
        assert_eq!(p.available(), 3);
    }
}
