//! Byte-level BPE over bytes, merge for merge the algorithm of `tokenizers`' `BPE` model
//! (`Word::merge_all`): repeatedly apply the lowest-ranked merge among adjacent symbols, the
//! leftmost one first among equal ranks, until none applies.
//!
//! The vocabulary's byte-level characters (GPT-2's printable stand-ins for bytes) are mapped
//! back to the bytes they stand for, so words are merged as the raw bytes of the text.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use ahash::AHashMap;
use parking_lot::RwLock;

/// Words longer than this many bytes are not cached (as `tokenizers`' `MAX_LENGTH`).
const MAX_CACHED_WORD: usize = 256;
/// At most this many words are cached; past it, new words are merged every time.
const CACHE_CAPACITY: usize = 100_000;

/// Pre-token bytes -> ids.
type WordCache = AHashMap<Box<[u8]>, Box<[u32]>>;

/// The merge table of a byte-level BPE model.
pub(super) struct ByteBpe {
    /// Token bytes -> id, for `ignore_merges` (whole words found in the vocabulary).
    vocab: AHashMap<Box<[u8]>, u32>,
    /// Id of each single byte.
    byte_ids: [u32; 256],
    /// `(left, right)` -> `(rank, merged id)`.
    merges: AHashMap<(u32, u32), (u32, u32)>,
    ignore_merges: bool,
    cache: RwLock<WordCache>,
}

/// GPT-2's byte -> printable character map (`bytes_to_unicode`).
pub(super) fn byte_to_char() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        map[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).expect("valid code point")
        };
    }
    map
}

/// Why a model cannot use the fast path.
pub type Unsupported = String;

impl ByteBpe {
    /// Builds the table from the model's `vocab` (token text -> id) and `merges` (pairs of token
    /// texts, in rank order). Fails if a byte has no token, or a merge names unknown tokens.
    pub(super) fn new(
        vocab: &AHashMap<String, u32>,
        merges: &[(String, String)],
        ignore_merges: bool,
    ) -> Result<Self, Unsupported> {
        let to_byte: AHashMap<char, u8> = byte_to_char()
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        let decode = |token: &str| -> Option<Box<[u8]>> {
            token.chars().map(|c| to_byte.get(&c).copied()).collect()
        };
        let mut bytes_vocab = AHashMap::with_capacity(vocab.len());
        for (token, &id) in vocab {
            if let Some(bytes) = decode(token) {
                bytes_vocab.insert(bytes, id);
            }
        }
        let mut byte_ids = [0u32; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = *bytes_vocab
                .get(&[b as u8][..])
                .ok_or_else(|| format!("byte {b:#04x} has no token"))?;
        }
        let mut merge_map = AHashMap::with_capacity(merges.len());
        for (rank, (a, b)) in merges.iter().enumerate() {
            let id = |t: &str| {
                vocab
                    .get(t)
                    .copied()
                    .ok_or_else(|| format!("merge names unknown token {t:?}"))
            };
            let merged = id(&format!("{a}{b}"))?;
            merge_map.insert((id(a)?, id(b)?), (rank as u32, merged));
        }
        Ok(ByteBpe {
            vocab: bytes_vocab,
            byte_ids,
            merges: merge_map,
            ignore_merges,
            cache: RwLock::new(AHashMap::new()),
        })
    }

    /// Appends the ids of one pre-token (its raw bytes) to `out`.
    #[inline]
    pub(super) fn encode_word(&self, word: &[u8], out: &mut Vec<u32>) {
        if word.len() == 1 {
            out.push(self.byte_ids[word[0] as usize]);
            return;
        }
        if self.ignore_merges {
            if let Some(&id) = self.vocab.get(word) {
                out.push(id);
                return;
            }
        }
        if let Some(ids) = self.cache.read().get(word) {
            out.extend_from_slice(ids);
            return;
        }
        let start = out.len();
        self.merge(word, out);
        if word.len() < MAX_CACHED_WORD {
            let mut cache = self.cache.write();
            if cache.len() < CACHE_CAPACITY {
                cache.insert(word.into(), out[start..].into());
            }
        }
    }

    /// `Word::merge_all`: a heap of candidate merges ordered by (rank, position); stale
    /// entries (a symbol already merged away, or a pair that no longer merges to the same id)
    /// are skipped.
    fn merge(&self, word: &[u8], out: &mut Vec<u32>) {
        const NONE: usize = usize::MAX;
        struct Sym {
            id: u32,
            prev: usize,
            next: usize,
            alive: bool,
        }
        let n = word.len();
        let mut syms: Vec<Sym> = word
            .iter()
            .enumerate()
            .map(|(i, &b)| Sym {
                id: self.byte_ids[b as usize],
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
                alive: true,
            })
            .collect();
        let mut heap: BinaryHeap<Reverse<(u32, usize, u32)>> = BinaryHeap::with_capacity(n);
        for i in 0..n.saturating_sub(1) {
            if let Some(&(rank, new_id)) = self.merges.get(&(syms[i].id, syms[i + 1].id)) {
                heap.push(Reverse((rank, i, new_id)));
            }
        }
        while let Some(Reverse((_, pos, new_id))) = heap.pop() {
            if !syms[pos].alive || syms[pos].next == NONE {
                continue;
            }
            let right = syms[pos].next;
            match self.merges.get(&(syms[pos].id, syms[right].id)) {
                Some(&(_, id)) if id == new_id => {}
                _ => continue,
            }
            syms[pos].id = new_id;
            syms[right].alive = false;
            let after = syms[right].next;
            syms[pos].next = after;
            if after != NONE {
                syms[after].prev = pos;
            }
            let prev = syms[pos].prev;
            if prev != NONE {
                if let Some(&(rank, id)) = self.merges.get(&(syms[prev].id, new_id)) {
                    heap.push(Reverse((rank, prev, id)));
                }
            }
            if after != NONE {
                if let Some(&(rank, id)) = self.merges.get(&(new_id, syms[after].id)) {
                    heap.push(Reverse((rank, pos, id)));
                }
            }
        }
        let mut i = 0;
        while i != NONE {
            out.push(syms[i].id);
            i = syms[i].next;
        }
    }
}
