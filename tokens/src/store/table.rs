//! The store's entries: a hash map from block key to slot, with CLOCK eviction under a byte cap.
//!
//! Readers (lookups) take the read lock and set an entry's `referenced` bit atomically; writers
//! (inserts, eviction) take the write lock. The CLOCK hand sweeps the slots: a referenced entry
//! loses its bit and is passed over, an unreferenced one is evicted. Memory is accounted per
//! entry as [`ENTRY_OVERHEAD`] plus 4 bytes per token id.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes charged per entry besides its ids: the entry (slot), its map slot and key, the
/// allocation's header, rounded up.
pub const ENTRY_OVERHEAD: usize = 112;

/// The `parent_slot` of an entry without a parent.
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// Keys are already uniform hashes: the map hashes them by taking their low 64 bits.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

/// One cached block.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The block's key.
    pub(crate) key: u128,
    /// The cut its segment starts at: the cut of the entry it was inserted after (0 for the
    /// first block). On lookup the entry is used only if this equals the running cut.
    pub(crate) parent_cut: u32,
    /// Byte offset of this entry's cut in any text that has this block.
    pub(crate) cut: u32,
    /// Number of core ids before `cut`.
    pub(crate) n: u32,
    /// The core ids between `parent_cut` and `cut`.
    pub(crate) tokens: Box<[u32]>,
    /// The slot its parent had when it was inserted ([`NO_SLOT`] for block 0): a hint for
    /// walking a chain back from its end with one map probe; walkers check the key and cut of
    /// what they find there, since the slot may have been reused.
    pub(crate) parent_slot: u32,
    referenced: AtomicBool,
}

impl Entry {
    /// A new entry (not yet referenced).
    pub(crate) fn new(key: u128, parent_cut: u32, cut: u32, n: u32, tokens: Box<[u32]>) -> Self {
        Entry {
            key,
            parent_cut,
            cut,
            n,
            tokens,
            parent_slot: NO_SLOT,
            referenced: AtomicBool::new(false),
        }
    }

    /// Bytes charged for this entry.
    pub(crate) fn cost(&self) -> usize {
        ENTRY_OVERHEAD + 4 * self.tokens.len()
    }

    /// Marks the entry as used (the CLOCK reference bit).
    pub(crate) fn touch(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }
}

/// The entries, their index and the byte accounting.
#[derive(Debug, Default)]
pub(crate) struct Table {
    map: HashMap<u128, u32, BuildHasherDefault<KeyHasher>>,
    slots: Vec<Option<Entry>>,
    free: Vec<u32>,
    hand: usize,
    // invariant: the sum of `cost()` over the entries in `slots`.
    bytes: usize,
}

impl Table {
    /// The entry with `key` and its slot, if any.
    #[inline]
    pub(crate) fn get(&self, key: u128) -> Option<(u32, &Entry)> {
        let slot = *self.map.get(&key)?;
        Some((slot, self.slots[slot as usize].as_ref()?))
    }

    /// The entry in `slot`, if any.
    #[inline]
    pub(crate) fn at(&self, slot: u32) -> Option<&Entry> {
        self.slots.get(slot as usize)?.as_ref()
    }

    /// Inserts `entry`, replacing any entry with the same key, and returns its slot. The caller
    /// evicts afterwards with [`Table::evict_to`] (slots returned by one batch of inserts stay
    /// valid until then).
    pub(crate) fn insert(&mut self, entry: Entry) -> u32 {
        self.bytes += entry.cost();
        entry.touch();
        if let Some(&slot) = self.map.get(&entry.key) {
            let old = self.slots[slot as usize].replace(entry);
            self.bytes -= old.map_or(0, |e| e.cost());
            return slot;
        }
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(entry);
                s
            }
            None => {
                self.slots.push(Some(entry));
                (self.slots.len() - 1) as u32
            }
        };
        let key = self.slots[slot as usize]
            .as_ref()
            .map(|e| e.key)
            .unwrap_or_default();
        self.map.insert(key, slot);
        slot
    }

    /// Evicts entries (CLOCK) until at most `cap` bytes are used. Returns how many it evicted.
    pub(crate) fn evict_to(&mut self, cap: usize) -> u64 {
        let mut evicted = 0;
        // Two sweeps clear every reference bit, so this terminates once bytes <= cap or empty.
        while self.bytes > cap && !self.map.is_empty() {
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            let slot = self.hand;
            self.hand += 1;
            let Some(entry) = &self.slots[slot] else {
                continue;
            };
            if entry.referenced.swap(false, Ordering::Relaxed) {
                continue;
            }
            let entry = self.slots[slot].take().expect("checked above");
            self.map.remove(&entry.key);
            self.bytes -= entry.cost();
            self.free.push(slot as u32);
            evicted += 1;
        }
        evicted
    }

    /// Removes the entry in `slot` (tests: simulates an eviction).
    #[cfg(test)]
    pub(crate) fn slots_mut_take(&mut self, slot: u32) -> Option<Entry> {
        let e = self.slots[slot as usize].take()?;
        self.map.remove(&e.key);
        self.bytes -= e.cost();
        self.free.push(slot);
        Some(e)
    }

    /// Bytes charged for all entries.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Removes every entry.
    pub(crate) fn clear(&mut self) {
        *self = Table::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: u128, ids: usize) -> Entry {
        Entry::new(key, 0, 0, 0, vec![7; ids].into())
    }

    #[test]
    fn accounting_and_replacement() {
        let mut t = Table::default();
        t.insert(entry(1, 10));
        t.insert(entry(2, 0));
        assert_eq!(t.bytes(), 2 * ENTRY_OVERHEAD + 40);
        t.insert(entry(1, 1));
        assert_eq!(t.bytes(), 2 * ENTRY_OVERHEAD + 4);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn clock_evicts_unreferenced_first() {
        let mut t = Table::default();
        for k in 0..4 {
            t.insert(entry(k, 0));
        }
        // All were referenced on insert; one sweep clears them, then entry 0 goes first.
        t.evict_to(3 * ENTRY_OVERHEAD);
        assert!(t.get(0).is_none());
        t.get(1).unwrap().1.touch();
        t.evict_to(2 * ENTRY_OVERHEAD);
        assert!(t.get(1).is_some() && t.get(2).is_none());
        assert_eq!(t.len(), 2);
        t.evict_to(0);
        assert_eq!((t.len(), t.bytes()), (0, 0));
    }
}
