//! Memory per indexed block, measured with a counting allocator (not estimated): the index at
//! its default 200,000-block capacity must cost at most 64 bytes per block.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use kvroute_core::{BlockHash, ModelId, PodId, PrefixIndex, Timestamp};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn bytes_per_indexed_block_at_200k() {
    const BLOCKS: usize = 200_000;
    let hashes: Vec<BlockHash> = (0..BLOCKS as u64)
        .map(|i| BlockHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
        .collect();
    let before = LIVE.load(Ordering::Relaxed);
    let mut index = PrefixIndex::new(BLOCKS, 60_000, 1);
    // Prompts of 218 blocks (the study's shape) on 2 pods; every 10th prompt is also sent to the
    // other pod, so some blocks hold two pods.
    for (n, chunk) in hashes.chunks(218).enumerate() {
        let pod = PodId::from_u32((n % 2) as u32);
        index.insert(
            ModelId::from_u32(0),
            pod,
            chunk,
            Timestamp::from_millis(n as u64),
        );
        if n % 10 == 0 {
            let other = PodId::from_u32(((n + 1) % 2) as u32);
            index.insert(
                ModelId::from_u32(0),
                other,
                chunk,
                Timestamp::from_millis(n as u64),
            );
        }
    }
    assert_eq!(index.len(), BLOCKS);
    let used = LIVE.load(Ordering::Relaxed) - before;
    let per_block = used as f64 / BLOCKS as f64;
    println!("prefix index: {used} bytes for {BLOCKS} blocks = {per_block:.1} B/block");
    assert!(
        per_block <= 64.0,
        "{per_block:.1} bytes per block exceeds the 64 B target"
    );
    drop(index);
}
