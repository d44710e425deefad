//! One pod's engine view as data: the engine's block hashes it holds, each with kvroute's key
//! for the same block, and the set of keys (with how many engine blocks carry each, and the
//! key each one continues).
//!
//! Layout (bounded memory: about 53 bytes per block at a million blocks, measured by
//! `memory_per_block_at_a_million`): two slabs of 16-byte records with free lists, and two
//! `HashTable<u32>`s of slab slots (one keyed by the engine hash, one by kvroute's key), so a
//! table bucket is 5 bytes. An engine hash maps to one key; two engine hashes may map to the
//! same key (an engine keying something kvroute does not), hence the count.
//!
//! **Prefix closure.** A block is keyed only after its parent (the view holds the parent, or
//! it is a prompt's first block), so the held keys are closed under "parent of" until a
//! removal takes out a key whose children stay. Each key record links to its parent's record
//! and counts its children; a removed key with children stays as a *tombstone* (not held) until
//! they go, and [`PodBlocks::prefix_closed`] is true while there is none. While it is true, a
//! request's leading held keys can be found by binary search (see
//! [`PodBlocks::leading_held`]), at any prompt length; otherwise they are walked one by one.

use hashbrown::HashTable;

use crate::hash::BlockHash;

const NONE: u32 = u32::MAX;
/// A record whose parent's child count was full: it has a parent that does not know it (it
/// counts as a hole until it goes).
const UNLINKED: u32 = u32::MAX - 1;

#[derive(Clone, Copy, Debug)]
struct Block {
    engine: u64,
    // index into `keys`; NONE for a free slot.
    key: u32,
}

#[derive(Clone, Copy, Debug)]
struct KeyRecord {
    key: u64,
    // engine blocks with this key; 0 for a tombstone or a free slot.
    blocks: u16,
    // records whose `parent` is this one; 0 for a free slot.
    children: u16,
    // the parent's record; NONE for a prompt's first block (and a free slot), or UNLINKED.
    parent: u32,
}

const FREE_KEY: KeyRecord = KeyRecord {
    key: 0,
    blocks: 0,
    children: 0,
    parent: NONE,
};

/// A key's table hash: the key itself. Keys are seeded XXH64 outputs (uniform, and not
/// choosable by a client who does not know the seed), so hashing them again buys nothing.
fn key_hash(key: u64) -> u64 {
    key
}

/// The blocks of one engine, keyed both ways. Single owner; see the module docs.
#[derive(Debug)]
pub(crate) struct PodBlocks {
    hasher: ahash::RandomState,
    blocks: Vec<Block>,
    free_blocks: Vec<u32>,
    keys: Vec<KeyRecord>,
    free_keys: Vec<u32>,
    by_engine: HashTable<u32>,
    // held keys and tombstones
    by_key: HashTable<u32>,
    // tombstones plus unlinked records: 0 while the held keys are prefix-closed
    holes: u32,
}

impl PodBlocks {
    /// An empty set; `seed` keys the tables' hasher (fixed for determinism).
    pub(crate) fn new(seed: u64) -> Self {
        let k = |i: u64| crate::hash::mix64(seed.wrapping_add(i));
        PodBlocks {
            hasher: ahash::RandomState::with_seeds(k(11), k(12), k(13), k(14)),
            blocks: Vec::new(),
            free_blocks: Vec::new(),
            keys: Vec::new(),
            free_keys: Vec::new(),
            by_engine: HashTable::new(),
            by_key: HashTable::new(),
            holes: 0,
        }
    }

    /// Engine blocks held.
    pub(crate) fn len(&self) -> usize {
        self.by_engine.len()
    }

    /// Bytes allocated (slabs at capacity and both tables).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<Block>()
            + self.keys.capacity() * std::mem::size_of::<KeyRecord>()
            + (self.free_blocks.capacity() + self.free_keys.capacity()) * 4
            + self.by_engine.allocation_size()
            + self.by_key.allocation_size()
    }

    /// kvroute's key of the engine block, if held.
    pub(crate) fn key_of(&self, engine: u64) -> Option<u64> {
        self.find_block(engine)
            .map(|b| self.keys[self.blocks[b as usize].key as usize].key)
    }

    /// Whether some engine block carries this key.
    pub(crate) fn holds(&self, key: u64) -> bool {
        self.find_key(key)
            .is_some_and(|k| self.keys[k as usize].blocks > 0)
    }

    /// Whether every held key's parent key is held (see the module docs).
    pub(crate) fn prefix_closed(&self) -> bool {
        self.holes == 0
    }

    /// How many of `keys` (a request's chained keys, in prompt order) are held before the
    /// first that is not: by binary search while the view is prefix-closed (a held key's
    /// ancestors are then held), else walking them.
    pub(crate) fn leading_held(&self, keys: &[BlockHash]) -> usize {
        match keys.split_first() {
            Some((first, rest)) if self.holds(first.0) => {
                if self.prefix_closed() {
                    1 + rest.partition_point(|k| self.holds(k.0))
                } else {
                    1 + rest.iter().take_while(|k| self.holds(k.0)).count()
                }
            }
            _ => 0,
        }
    }

    /// Records that the engine holds block `engine` with key `key`, continuing `parent`'s key
    /// (`None` for a prompt's first block; otherwise a key this view holds). A block stored
    /// again keeps one record, with the latest key. False, recording nothing, when 65,535
    /// engine blocks already carry the key.
    pub(crate) fn insert(&mut self, engine: u64, key: u64, parent: Option<u64>) -> bool {
        let existing = self.find_block(engine);
        if let Some(b) = existing {
            if self.keys[self.blocks[b as usize].key as usize].key == key {
                return true;
            }
        }
        let Some(k) = self.acquire_key(key, parent) else {
            return false;
        };
        if let Some(b) = existing {
            let old = std::mem::replace(&mut self.blocks[b as usize].key, k);
            self.release_key(old);
            return true;
        }
        let block = Block { engine, key: k };
        let slot = match self.free_blocks.pop() {
            Some(s) => {
                self.blocks[s as usize] = block;
                s
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as u32
            }
        };
        let (hasher, blocks) = (&self.hasher, &self.blocks);
        self.by_engine
            .insert_unique(hasher.hash_one(engine), slot, |&s| {
                hasher.hash_one(blocks[s as usize].engine)
            });
        true
    }

    /// Forgets the engine block; false if it was not held.
    pub(crate) fn remove(&mut self, engine: u64) -> bool {
        let hash = self.hasher.hash_one(engine);
        let blocks = &self.blocks;
        let Ok(entry) = self
            .by_engine
            .find_entry(hash, |&s| blocks[s as usize].engine == engine)
        else {
            return false;
        };
        let (slot, _) = entry.remove();
        let k = self.blocks[slot as usize].key;
        self.blocks[slot as usize].key = NONE;
        self.free_blocks.push(slot);
        self.release_key(k);
        true
    }

    /// Forgets every block and returns the memory.
    pub(crate) fn clear(&mut self) {
        *self = PodBlocks {
            hasher: self.hasher.clone(),
            ..PodBlocks::new(0)
        };
    }

    fn find_block(&self, engine: u64) -> Option<u32> {
        self.by_engine
            .find(self.hasher.hash_one(engine), |&s| {
                self.blocks[s as usize].engine == engine
            })
            .copied()
    }

    /// The record of `key`, held or a tombstone.
    fn find_key(&self, key: u64) -> Option<u32> {
        self.by_key
            .find(key_hash(key), |&s| self.keys[s as usize].key == key)
            .copied()
    }

    /// One more engine block carries `key`: its record (revived if a tombstone, created
    /// linked to `parent`'s if new); `None` if the count is full.
    fn acquire_key(&mut self, key: u64, parent: Option<u64>) -> Option<u32> {
        if let Some(k) = self.find_key(key) {
            let record = &mut self.keys[k as usize];
            if record.blocks == u16::MAX {
                return None;
            }
            if record.blocks == 0 {
                self.holes -= 1; // a tombstone held again
            }
            record.blocks += 1;
            return Some(k);
        }
        let link = match parent.map(|p| self.find_key(p)) {
            None => NONE,
            Some(Some(p)) if self.keys[p as usize].children < u16::MAX => {
                self.keys[p as usize].children += 1;
                p
            }
            // A full child count (or, against the caller's contract, a parent not held): the
            // view cannot tell when this record loses its parent, so it is a hole for its life.
            Some(_) => {
                self.holes += 1;
                UNLINKED
            }
        };
        let record = KeyRecord {
            key,
            blocks: 1,
            children: 0,
            parent: link,
        };
        let slot = match self.free_keys.pop() {
            Some(s) => {
                self.keys[s as usize] = record;
                s
            }
            None => {
                self.keys.push(record);
                (self.keys.len() - 1) as u32
            }
        };
        let keys = &self.keys;
        self.by_key
            .insert_unique(key_hash(key), slot, |&s| key_hash(keys[s as usize].key));
        Some(slot)
    }

    /// One engine block fewer carries record `k`'s key.
    fn release_key(&mut self, k: u32) {
        let record = &mut self.keys[k as usize];
        record.blocks -= 1;
        if record.blocks > 0 {
            return;
        }
        if record.children > 0 {
            self.holes += 1; // a tombstone until its children go
            return;
        }
        self.free_key(k);
    }

    /// Frees record `k` (no blocks, no children), then its parent if that was a tombstone
    /// left with no children, and so on up.
    fn free_key(&mut self, mut k: u32) {
        loop {
            let KeyRecord { key, parent, .. } = self.keys[k as usize];
            let keys = &self.keys;
            if let Ok(entry) = self
                .by_key
                .find_entry(key_hash(key), |&s| keys[s as usize].key == key)
            {
                entry.remove();
            }
            self.keys[k as usize] = FREE_KEY;
            self.free_keys.push(k);
            match parent {
                NONE => return,
                UNLINKED => {
                    self.holes -= 1;
                    return;
                }
                p => {
                    let up = &mut self.keys[p as usize];
                    up.children -= 1;
                    if up.children > 0 || up.blocks > 0 {
                        return;
                    }
                    self.holes -= 1; // the tombstone goes
                    k = p;
                }
            }
        }
    }

    /// Checks the layout's invariants (tests).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let live_blocks = self.blocks.iter().filter(|b| b.key != NONE).count();
        if live_blocks != self.by_engine.len()
            || self.blocks.len() - self.free_blocks.len() != live_blocks
        {
            return Err("block slab and table disagree".into());
        }
        let mut blocks = vec![0u32; self.keys.len()];
        for b in self.blocks.iter().filter(|b| b.key != NONE) {
            blocks[b.key as usize] += 1;
            if self
                .find_block(b.engine)
                .map(|s| self.blocks[s as usize].engine)
                != Some(b.engine)
            {
                return Err(format!(
                    "block {:#x} not found by its engine hash",
                    b.engine
                ));
            }
        }
        let free: std::collections::BTreeSet<u32> = self.free_keys.iter().copied().collect();
        let mut children = vec![0u32; self.keys.len()];
        let (mut live, mut holes) = (0, 0);
        for (i, r) in self.keys.iter().enumerate() {
            if free.contains(&(i as u32)) {
                continue;
            }
            live += 1;
            match r.parent {
                NONE => {}
                UNLINKED => holes += 1,
                p => children[p as usize] += 1,
            }
            if r.blocks == 0 {
                holes += 1;
            }
        }
        for (i, r) in self.keys.iter().enumerate() {
            let is_free = free.contains(&(i as u32));
            if u32::from(r.blocks) != blocks[i] || u32::from(r.children) != children[i] {
                return Err(format!(
                    "key slot {i}: blocks {} children {} but {} blocks {} children",
                    r.blocks, r.children, blocks[i], children[i]
                ));
            }
            if is_free != (r.blocks == 0 && r.children == 0) {
                return Err(format!("key slot {i}: free list disagrees"));
            }
            if !is_free && self.find_key(r.key) != Some(i as u32) {
                return Err(format!("key {:#x} not found", r.key));
            }
        }
        if self.by_key.len() != live {
            return Err("key table size".into());
        }
        if self.holes != holes {
            return Err(format!("holes {} but {holes} counted", self.holes));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn insert_remove_and_shared_keys() {
        let mut b = PodBlocks::new(1);
        b.insert(10, 100, None);
        b.insert(11, 101, None);
        b.insert(12, 100, None); // another engine hash, same kvroute key
        assert_eq!(b.len(), 3);
        assert_eq!(b.key_of(12), Some(100));
        assert!(b.holds(100) && b.holds(101) && !b.holds(102));
        assert!(b.remove(10));
        assert!(b.holds(100), "engine block 12 still carries the key");
        assert!(b.remove(12));
        assert!(!b.holds(100));
        assert!(!b.remove(12), "already gone");
        b.insert(11, 105, None); // stored again under another key
        assert!(!b.holds(101) && b.holds(105));
        b.check_invariants().unwrap();
        b.clear();
        assert_eq!(b.len(), 0);
        assert!(!b.holds(105));
    }

    #[test]
    fn memory_per_block_at_a_million() {
        let mut b = PodBlocks::new(7);
        let n = 1_000_000u64;
        for i in 0..n {
            b.insert(crate::hash::mix64(i), crate::hash::mix64(i ^ 0x55), None);
        }
        let per_block = b.memory_bytes() as f64 / n as f64;
        assert!(per_block <= 64.0, "{per_block:.1} bytes per block");
        // Churn at the same size does not grow it.
        for i in 0..n / 2 {
            assert!(b.remove(crate::hash::mix64(i)));
            b.insert(crate::hash::mix64(i + n), crate::hash::mix64(i + n), None);
        }
        assert!(b.memory_bytes() as f64 / n as f64 <= 64.0);
    }

    #[test]
    fn removing_a_parent_leaves_a_tombstone_until_its_children_go() {
        let mut b = PodBlocks::new(2);
        b.insert(1, 100, None);
        b.insert(2, 200, Some(100));
        b.insert(3, 300, Some(200));
        assert!(b.prefix_closed());
        assert_eq!(b.leading_held(&hs(&[100, 200, 300, 400])), 3);
        assert_eq!(
            b.leading_held(&hs(&[100, 201, 301])),
            1,
            "a different second block"
        );
        assert_eq!(b.leading_held(&hs(&[101, 200])), 0);
        assert!(b.remove(2));
        assert!(!b.prefix_closed(), "300 is held, its parent 200 not");
        assert!(!b.holds(200) && b.holds(300));
        assert_eq!(
            b.leading_held(&hs(&[100, 200, 300])),
            1,
            "walked, not searched"
        );
        b.check_invariants().unwrap();
        b.insert(4, 200, Some(100)); // the parent stored again
        assert!(b.prefix_closed());
        assert_eq!(b.leading_held(&hs(&[100, 200, 300])), 3);
        assert!(b.remove(4) && b.remove(3));
        assert!(b.prefix_closed(), "the tombstone went with its last child");
        assert_eq!(b.leading_held(&hs(&[100, 200, 300])), 1);
        b.check_invariants().unwrap();
    }

    #[test]
    fn a_full_child_count_is_a_hole_until_the_child_goes() {
        let mut b = PodBlocks::new(4);
        b.insert(0, 1, None);
        for i in 1..=u64::from(u16::MAX) {
            assert!(b.insert(i, 1_000 + i, Some(1)));
        }
        assert!(b.prefix_closed());
        let last = u64::from(u16::MAX) + 1;
        assert!(b.insert(last, 1_000 + last, Some(1)));
        assert!(!b.prefix_closed());
        assert_eq!(b.leading_held(&hs(&[1, 1_000 + last])), 2);
        assert!(b.remove(last));
        assert!(b.prefix_closed());
        b.check_invariants().unwrap();
    }

    fn hs(keys: &[u64]) -> Vec<BlockHash> {
        keys.iter().map(|&k| BlockHash(k)).collect()
    }

    /// Key `k`'s parent in the prefix-closure property test: keys form a binary tree under 1.
    fn tree_parent(k: u64) -> Option<u64> {
        (k > 1).then_some(k / 2)
    }

    proptest! {
        #[test]
        fn leading_held_is_the_walk_of_held_keys(ops in prop::collection::vec((0u8..3, 0u64..30, 1u64..32), 0..300)) {
            let mut b = PodBlocks::new(5);
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            for (op, engine, key) in ops {
                if op < 2 {
                    // Stored only after its parent, as the engine view keys blocks.
                    let parent = tree_parent(key);
                    if parent.is_some_and(|p| !model.values().any(|&k| k == p)) {
                        continue;
                    }
                    prop_assert!(b.insert(engine, key, parent));
                    model.insert(engine, key);
                } else {
                    prop_assert_eq!(b.remove(engine), model.remove(&engine).is_some());
                }
                b.check_invariants().map_err(TestCaseError::fail)?;
            }
            let held = |k: u64| model.values().any(|&v| v == k);
            for leaf in 1..64u64 {
                let mut path: Vec<u64> = std::iter::successors(Some(leaf), |&k| tree_parent(k)).collect();
                path.reverse();
                let walked = path.iter().take_while(|&&k| held(k)).count();
                prop_assert_eq!(b.leading_held(&hs(&path)), walked);
            }
        }

        #[test]
        fn behaves_like_two_maps(ops in prop::collection::vec((0u8..3, 0u64..40, 0u64..12), 0..300)) {
            let mut b = PodBlocks::new(3);
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            for (op, engine, key) in ops {
                match op {
                    0 | 1 => { b.insert(engine, key, None); model.insert(engine, key); }
                    _ => { prop_assert_eq!(b.remove(engine), model.remove(&engine).is_some()); }
                }
                prop_assert_eq!(b.len(), model.len());
            }
            b.check_invariants().map_err(TestCaseError::fail)?;
            for key in 0..12u64 {
                prop_assert_eq!(b.holds(key), model.values().any(|&k| k == key));
            }
            for (e, k) in &model {
                prop_assert_eq!(b.key_of(*e), Some(*k));
            }
        }
    }
}
