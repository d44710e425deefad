//! [`PrefixStore`]: a bounded cache of text prefixes and their token ids, so that a prompt
//! whose long prefix was seen before is tokenized only past it, with exactly the ids a full
//! tokenization gives.
//!
//! # Design
//! The text is cut into blocks of `block_bytes` bytes; complete block `k` is keyed by the
//! 128-bit hash of the text up to its end (module `chain`). An entry for block `k` holds a *cut*
//! `c_k` (a byte offset at least `margin` bytes before the block's end where tokenization splits
//! cleanly, see module `cuts`), the number `n_k` of ids before it, and the ids between its parent's
//! cut and its own (so a prompt's entries hold its ids once: storage is linear in prompt
//! length). An entry may repeat its parent's cut, with no ids, when its block has no usable cut.
//!
//! Lookup: compute the text's block keys (outside the lock), walk them from block 0 while an
//! entry exists whose `parent_cut` equals the cut reached so far (the chain is checked, so an
//! entry left behind by an evicted or replaced parent is never used), and collect the ids. The
//! result is those ids followed by the tokenization of `text[c..]`, where `c` is the last cut.
//!
//! Insert (when the text has complete blocks past the ones found): tokenize `text[c..]` with
//! pre-token starts, choose a cut per new block, verify the cuts (`cuts::verify`), and add one
//! entry per new block. Inserting costs about one more tokenization of the new part; lookups
//! that find every complete block insert nothing.
//!
//! Ids are *core* ids (no special tokens from the post-processor), so completions
//! (`add_special_tokens = true`) and chats (`false`) share entries; the caller adds the
//! post-processor's prefix and suffix, which it checked at load are the same for every text.
//!
//! # Memory
//! Each entry is charged [`table::ENTRY_OVERHEAD`] bytes plus 4 bytes per id; after each insert
//! entries are evicted (CLOCK) until the total is at most `capacity_bytes`. The hash of each
//! prompt's blocks and the ids it returns are per call and not charged.

mod chain;
pub(crate) mod cuts;
mod table;

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::error::EncodeError;
use table::{Entry, Table};

pub use table::ENTRY_OVERHEAD;

/// Default block size: 128 bytes (as kvroute's byte blocks).
pub const DEFAULT_BLOCK_BYTES: usize = 128;
/// Default memory cap: 64 MiB.
pub const DEFAULT_CAPACITY_BYTES: usize = 64 << 20;
/// Smallest accepted block size.
pub const MIN_BLOCK_BYTES: usize = 16;

/// How a [`PrefixStore`] is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixStoreConfig {
    /// Block size in bytes (at least [`MIN_BLOCK_BYTES`]). Smaller blocks re-tokenize less of
    /// each prompt's tail but cost more entries.
    pub block_bytes: usize,
    /// Memory cap in bytes, as charged per entry (see the module doc).
    pub capacity_bytes: usize,
    /// Seed of the block keys.
    pub seed: u64,
}

impl Default for PrefixStoreConfig {
    fn default() -> Self {
        PrefixStoreConfig {
            block_bytes: DEFAULT_BLOCK_BYTES,
            capacity_bytes: DEFAULT_CAPACITY_BYTES,
            seed: 0x6b76_726f_7574_6532,
        }
    }
}

/// A [`PrefixStoreConfig`] that cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreConfigError {
    /// `block_bytes` is below [`MIN_BLOCK_BYTES`] or above `u32::MAX`.
    #[error("block size must be between {MIN_BLOCK_BYTES} bytes and 4 GiB, got {0}")]
    BlockBytes(usize),
}

/// Counters of a [`PrefixStore`] since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Lookups that found at least one block.
    pub hits: u64,
    /// Lookups of texts with at least one complete block that found none.
    pub misses: u64,
    /// Ids taken from the store instead of tokenized.
    pub tokens_reused: u64,
    /// Entries added.
    pub inserts: u64,
    /// Entries evicted to stay under the cap.
    pub evictions: u64,
    /// Chosen cuts that failed verification (each costs reuse, never exactness).
    pub rejected_cuts: u64,
    /// Entries now held.
    pub entries: u64,
    /// Bytes now charged (at most the cap after every insert).
    pub bytes_used: u64,
}

/// A bounded, thread-safe cache of text prefix -> token ids. See the [module doc](self).
/// One store may serve several models: keys include each tokenizer's fingerprint.
#[derive(Debug)]
pub struct PrefixStore {
    config: PrefixStoreConfig,
    table: RwLock<Table>,
    hits: AtomicU64,
    misses: AtomicU64,
    tokens_reused: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
    rejected_cuts: AtomicU64,
}

impl Default for PrefixStore {
    fn default() -> Self {
        PrefixStore::new(PrefixStoreConfig::default()).expect("default config is valid")
    }
}

/// Core ids and candidate cuts `(byte, id index)`, ascending.
pub(crate) type WithCuts = (Vec<u32>, Vec<(usize, usize)>);

/// What the store needs from a tokenizer (implemented by [`crate::ModelTokenizer`]).
pub(crate) trait CoreEncoder {
    /// Mixed into every key.
    fn fingerprint(&self) -> u64;
    /// Cuts lie at least this many bytes before the end of their block.
    fn margin(&self) -> usize;
    /// `encode(text, add_special_tokens = false)`.
    fn encode_core(&self, text: &str) -> Result<Vec<u32>, EncodeError>;
    /// Like `encode_core`, plus the candidate cuts of `text` as ascending `(byte, id index)`.
    fn encode_core_with_cuts(&self, text: &str) -> Result<WithCuts, EncodeError>;
}

/// The blocks a lookup found (their ids were appended to the caller's vector).
struct Found {
    blocks: usize,
    cut: usize,
    n: usize,
    /// Slot of the last entry found ([`table::NO_SLOT`] if none).
    slot: u32,
}

impl PrefixStore {
    /// An empty store.
    pub fn new(config: PrefixStoreConfig) -> Result<Self, StoreConfigError> {
        if config.block_bytes < MIN_BLOCK_BYTES || u32::try_from(config.block_bytes).is_err() {
            return Err(StoreConfigError::BlockBytes(config.block_bytes));
        }
        Ok(PrefixStore {
            config,
            table: RwLock::new(Table::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            tokens_reused: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            rejected_cuts: AtomicU64::new(0),
        })
    }

    /// An empty store with the default block size and the given memory cap.
    pub fn with_capacity(capacity_bytes: usize) -> Self {
        PrefixStore::new(PrefixStoreConfig {
            capacity_bytes,
            ..PrefixStoreConfig::default()
        })
        .expect("default block size is valid")
    }

    /// The configuration.
    pub fn config(&self) -> PrefixStoreConfig {
        self.config
    }

    /// The counters.
    pub fn stats(&self) -> StoreStats {
        let table = self.table.read();
        StoreStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            tokens_reused: self.tokens_reused.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            rejected_cuts: self.rejected_cuts.load(Ordering::Relaxed),
            entries: table.len() as u64,
            bytes_used: table.bytes() as u64,
        }
    }

    /// Drops every entry (counters are kept).
    pub fn clear(&self) {
        self.table.write().clear();
    }

    /// The longest valid chain of entries for `keys` from block 0; appends their ids to `out`
    /// (under the read lock: copying is cheaper than sharing the segments).
    ///
    /// Fast path: probe the last key (or, if absent, binary-search the deepest present key) and
    /// walk back through the `parent_slot` hints, checking at each step the key, that the
    /// parent's cut is the entry's `parent_cut` and that the id counts add up; one or a few map
    /// probes instead of one per block. If any check fails, walk forward from block 0 probing
    /// every key (always correct; it stops at the first missing or mismatched entry).
    fn lookup(&self, keys: &[u128], out: &mut Vec<u32>) -> Found {
        let table = self.table.read();
        let deepest = match table.get(keys[keys.len() - 1]) {
            Some((slot, _)) => Some((keys.len() - 1, slot)),
            None => {
                // Largest d with keys[d] present, assuming presence is prefix-closed (if it is
                // not, the walk below falls back).
                let (mut lo, mut hi, mut best) = (0, keys.len() - 1, None);
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    match table.get(keys[mid]) {
                        Some((slot, _)) => {
                            best = Some((mid, slot));
                            lo = mid + 1;
                        }
                        None => hi = mid,
                    }
                }
                best
            }
        };
        if let Some((depth, deepest_slot)) = deepest {
            let mut slot = deepest_slot;
            let mut chain = Vec::with_capacity(depth + 1);
            let mut d = depth;
            let valid = loop {
                let Some(e) = table.at(slot).filter(|e| e.key == keys[d]) else {
                    break false;
                };
                chain.push(e);
                if d == 0 {
                    break e.parent_cut == 0 && e.n as usize == e.tokens.len();
                }
                let parent = table.at(e.parent_slot).filter(|p| {
                    p.key == keys[d - 1]
                        && p.cut == e.parent_cut
                        && p.n as usize + e.tokens.len() == e.n as usize
                });
                if parent.is_none() {
                    break false;
                }
                slot = e.parent_slot;
                d -= 1;
            };
            if valid {
                let last = chain[0];
                for e in chain.iter().rev() {
                    e.touch();
                    out.extend_from_slice(&e.tokens);
                }
                return Found {
                    blocks: depth + 1,
                    cut: last.cut as usize,
                    n: last.n as usize,
                    slot: deepest_slot,
                };
            }
        }
        let mut found = Found {
            blocks: 0,
            cut: 0,
            n: 0,
            slot: table::NO_SLOT,
        };
        for &key in keys {
            let Some((slot, e)) = table.get(key) else {
                break;
            };
            if e.parent_cut as usize != found.cut || e.n as usize != found.n + e.tokens.len() {
                break;
            }
            e.touch();
            found.blocks += 1;
            found.cut = e.cut as usize;
            found.n = e.n as usize;
            found.slot = slot;
            out.extend_from_slice(&e.tokens);
        }
        found
    }

    /// Appends the core ids of `text` (no special tokens) to `out`, from the store where it can.
    pub(crate) fn encode_core_into(
        &self,
        enc: &impl CoreEncoder,
        text: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), EncodeError> {
        let block = self.config.block_bytes;
        let mut keys = Vec::new();
        chain::block_keys(
            text.as_bytes(),
            block,
            self.config.seed ^ enc.fingerprint(),
            &mut keys,
        );
        if keys.is_empty() {
            out.extend_from_slice(&enc.encode_core(text)?);
            return Ok(());
        }
        let base = out.len();
        // Room for the whole prompt at ~3 bytes per id, so the copies do not reallocate.
        out.reserve(text.len() / 3 + 16);
        let found = self.lookup(&keys, out);
        debug_assert_eq!(out.len() - base, found.n);
        if found.blocks > 0 {
            self.hits.fetch_add(1, Ordering::Relaxed);
            self.tokens_reused
                .fetch_add(found.n as u64, Ordering::Relaxed);
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        if found.blocks == keys.len() {
            out.extend_from_slice(&enc.encode_core(&text[found.cut..])?);
            return Ok(());
        }
        let (tail, mut candidates) = enc.encode_core_with_cuts(&text[found.cut..])?;
        out.extend_from_slice(&tail);
        for c in &mut candidates {
            *c = (c.0 + found.cut, c.1 + found.n);
        }
        self.insert(enc, text, &keys, &found, &out[base..], &candidates);
        Ok(())
    }

    /// Adds entries for blocks `found.blocks..keys.len()` of `text`, whose core ids are `ids`.
    fn insert(
        &self,
        enc: &impl CoreEncoder,
        text: &str,
        keys: &[u128],
        found: &Found,
        ids: &[u32],
        candidates: &[(usize, usize)],
    ) {
        let block = self.config.block_bytes;
        let bytes = text.as_bytes();
        let candidates: Vec<(usize, usize)> = candidates
            .iter()
            .copied()
            .filter(|&(c, _)| cuts::is_candidate(bytes, c))
            .collect();
        let limits: Vec<usize> = (found.blocks..keys.len())
            .map(|k| ((k + 1) * block).saturating_sub(enc.margin()))
            .collect();
        let chosen = cuts::choose(&candidates, found.cut, &limits);
        let mut unique: Vec<(usize, usize)> = chosen.iter().flatten().copied().collect();
        unique.dedup();
        let kept = cuts::verify(
            ids,
            (found.cut, found.n),
            &unique,
            (text.len(), ids.len()),
            |a, b| enc.encode_core(&text[a..b]).ok(),
        );
        let rejected = kept.iter().filter(|k| !**k).count() as u64;
        if rejected > 0 {
            self.rejected_cuts.fetch_add(rejected, Ordering::Relaxed);
        }
        let accepted: Vec<(usize, usize)> = unique
            .iter()
            .zip(&kept)
            .filter(|(_, k)| **k)
            .map(|(c, _)| *c)
            .collect();
        let per_block = cuts::choose(&accepted, found.cut, &limits);
        let mut entries = Vec::with_capacity(per_block.len());
        let (mut cut, mut n) = (found.cut, found.n);
        for (k, choice) in (found.blocks..keys.len()).zip(per_block) {
            let (next_cut, next_n) = choice.unwrap_or((cut, n));
            entries.push(Entry::new(
                keys[k],
                cut as u32,
                next_cut as u32,
                next_n as u32,
                ids[n..next_n].into(),
            ));
            (cut, n) = (next_cut, next_n);
        }
        let count = entries.len() as u64;
        let mut table = self.table.write();
        let mut parent = found.slot;
        for mut e in entries {
            e.parent_slot = parent;
            parent = table.insert(e);
        }
        let evicted = table.evict_to(self.config.capacity_bytes);
        drop(table);
        self.inserts.fetch_add(count, Ordering::Relaxed);
        if evicted > 0 {
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One id per byte: every position splits cleanly.
    struct Bytes;

    impl CoreEncoder for Bytes {
        fn fingerprint(&self) -> u64 {
            1
        }
        fn margin(&self) -> usize {
            2
        }
        fn encode_core(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
            Ok(text.bytes().map(u32::from).collect())
        }
        fn encode_core_with_cuts(&self, text: &str) -> Result<WithCuts, EncodeError> {
            let b = text.as_bytes();
            let cands = (0..b.len())
                .filter(|&c| cuts::is_candidate(b, c))
                .map(|c| (c, c))
                .collect();
            Ok((self.encode_core(text)?, cands))
        }
    }

    fn encode(store: &PrefixStore, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        store.encode_core_into(&Bytes, text, &mut out).unwrap();
        assert_eq!(out, Bytes.encode_core(text).unwrap());
        out
    }

    fn store() -> PrefixStore {
        PrefixStore::new(PrefixStoreConfig {
            block_bytes: 16,
            ..Default::default()
        })
        .unwrap()
    }

    const TEXT: &str =
        "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi";

    #[test]
    fn reuses_the_longest_chain() {
        let s = store();
        encode(&s, TEXT);
        let blocks = (TEXT.len() / 16) as u64;
        assert_eq!(s.stats().entries, blocks);
        encode(&s, &format!("{} rho", &TEXT[..40]));
        let st = s.stats();
        assert_eq!((st.hits, st.misses), (1, 1));
        // Two blocks (32 bytes) were found; their last cut is at most 30.
        assert!(st.tokens_reused > 16 && st.tokens_reused <= 30, "{st:?}");
    }

    #[test]
    fn a_missing_or_replaced_parent_falls_back_to_the_forward_walk() {
        let s = store();
        encode(&s, TEXT);
        let mut keys = Vec::new();
        chain::block_keys(TEXT.as_bytes(), 16, s.config.seed ^ 1, &mut keys);
        // Replace block 1 by an entry with another cut: block 2's parent_cut no longer matches.
        {
            let mut t = s.table.write();
            let (_, e) = t.get(keys[1]).unwrap();
            let (pc, n0) = (e.parent_cut, e.n as usize - e.tokens.len());
            let replacement = Entry::new(keys[1], pc, pc, n0 as u32, Box::new([]));
            t.insert(replacement);
        }
        let mut out = Vec::new();
        let found = s.lookup(&keys, &mut out);
        assert_eq!(found.blocks, 2);
        assert_eq!(out.len(), found.n);
        encode(&s, TEXT);
        // Remove block 0 from the map: nothing is found, even though later blocks exist.
        {
            let mut t = s.table.write();
            let (slot, _) = t.get(keys[0]).unwrap();
            let e = t.slots_mut_take(slot);
            assert!(e.is_some());
        }
        let found = s.lookup(&keys, &mut Vec::new());
        assert_eq!(found.blocks, 0);
        encode(&s, TEXT);
    }

    #[test]
    fn memory_stays_under_the_cap() {
        let s = PrefixStore::new(PrefixStoreConfig {
            block_bytes: 16,
            capacity_bytes: 2000,
            ..Default::default()
        })
        .unwrap();
        for i in 0..50 {
            encode(&s, &format!("{i} {TEXT} {i}"));
            assert!(s.stats().bytes_used <= 2000);
        }
        assert!(s.stats().evictions > 0);
    }

    #[test]
    fn bad_block_size() {
        let bad = PrefixStoreConfig {
            block_bytes: 8,
            ..Default::default()
        };
        assert_eq!(
            PrefixStore::new(bad).unwrap_err(),
            StoreConfigError::BlockBytes(8)
        );
    }
}
