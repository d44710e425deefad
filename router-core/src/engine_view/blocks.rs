//! One pod's engine view as data: the engine's block hashes it holds, each with kvroute's key
//! for the same block, and the set of keys (with how many engine blocks carry each).
//!
//! Layout (bounded memory: about 53 bytes per block at a million blocks, measured by
//! `memory_per_block_at_a_million`): two slabs of 16-byte records with free lists, and two
//! `HashTable<u32>`s of slab slots (one keyed by the engine hash, one by kvroute's key), so a
//! table bucket is 5 bytes. An engine hash maps to one key; two engine hashes may map to the
//! same key (an engine keying something kvroute does not), hence the count.

use hashbrown::HashTable;

const NONE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Block {
    engine: u64,
    // index into `keys`; NONE for a free slot.
    key: u32,
}

#[derive(Clone, Copy, Debug)]
struct KeyRecord {
    key: u64,
    // engine blocks with this key; 0 for a free slot.
    refs: u32,
}

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
    by_key: HashTable<u32>,
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
        self.find_key(key).is_some()
    }

    /// Records that the engine holds block `engine` with key `key` (a block stored again keeps
    /// one record, with the latest key).
    pub(crate) fn insert(&mut self, engine: u64, key: u64) {
        if let Some(b) = self.find_block(engine) {
            let old = self.blocks[b as usize].key;
            if self.keys[old as usize].key == key {
                return;
            }
            self.release_key(old);
            self.blocks[b as usize].key = self.acquire_key(key);
            return;
        }
        let k = self.acquire_key(key);
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

    fn find_key(&self, key: u64) -> Option<u32> {
        self.by_key
            .find(key_hash(key), |&s| self.keys[s as usize].key == key)
            .copied()
    }

    fn acquire_key(&mut self, key: u64) -> u32 {
        if let Some(k) = self.find_key(key) {
            self.keys[k as usize].refs += 1;
            return k;
        }
        let record = KeyRecord { key, refs: 1 };
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
        slot
    }

    fn release_key(&mut self, k: u32) {
        let record = &mut self.keys[k as usize];
        record.refs -= 1;
        if record.refs > 0 {
            return;
        }
        let key = record.key;
        let keys = &self.keys;
        if let Ok(entry) = self
            .by_key
            .find_entry(key_hash(key), |&s| keys[s as usize].key == key)
        {
            entry.remove();
        }
        self.free_keys.push(k);
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
        let mut refs = vec![0u32; self.keys.len()];
        for b in self.blocks.iter().filter(|b| b.key != NONE) {
            refs[b.key as usize] += 1;
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
        for (i, r) in self.keys.iter().enumerate() {
            if r.refs != refs[i] {
                return Err(format!(
                    "key slot {i}: refs {} but {} blocks",
                    r.refs, refs[i]
                ));
            }
            if r.refs > 0 && self.find_key(r.key) != Some(i as u32) {
                return Err(format!("key {:#x} not found", r.key));
            }
        }
        if self.by_key.len() != refs.iter().filter(|&&n| n > 0).count() {
            return Err("key table size".into());
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
        b.insert(10, 100);
        b.insert(11, 101);
        b.insert(12, 100); // another engine hash, same kvroute key
        assert_eq!(b.len(), 3);
        assert_eq!(b.key_of(12), Some(100));
        assert!(b.holds(100) && b.holds(101) && !b.holds(102));
        assert!(b.remove(10));
        assert!(b.holds(100), "engine block 12 still carries the key");
        assert!(b.remove(12));
        assert!(!b.holds(100));
        assert!(!b.remove(12), "already gone");
        b.insert(11, 105); // stored again under another key
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
            b.insert(crate::hash::mix64(i), crate::hash::mix64(i ^ 0x55));
        }
        let per_block = b.memory_bytes() as f64 / n as f64;
        assert!(per_block <= 64.0, "{per_block:.1} bytes per block");
        // Churn at the same size does not grow it.
        for i in 0..n / 2 {
            assert!(b.remove(crate::hash::mix64(i)));
            b.insert(crate::hash::mix64(i + n), crate::hash::mix64(i + n));
        }
        assert!(b.memory_bytes() as f64 / n as f64 <= 64.0);
    }

    proptest! {
        #[test]
        fn behaves_like_two_maps(ops in prop::collection::vec((0u8..3, 0u64..40, 0u64..12), 0..300)) {
            let mut b = PodBlocks::new(3);
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            for (op, engine, key) in ops {
                match op {
                    0 | 1 => { b.insert(engine, key); model.insert(engine, key); }
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
