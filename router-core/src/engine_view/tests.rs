use super::*;

const SEED: u64 = 42;
const BS: u32 = 4;

use EngineBlockHash as H;

fn keys_of(tokens: &[u32], extras: BlockExtras<'_>) -> Vec<BlockHash> {
    TokenKeyConfig::new(BS, SEED).unwrap().keys(tokens, extras)
}

fn stored<'a>(
    hashes: &'a [EngineBlockHash],
    parent: Option<EngineBlockHash>,
    tokens: &'a [u32],
) -> KvEvent<'a> {
    KvEvent::Stored(StoredBlocks {
        block_hashes: hashes,
        parent,
        token_ids: tokens,
        block_size: BS,
        ..StoredBlocks::default()
    })
}

fn applied(r: KvApplied) -> BatchCounts {
    match r {
        KvApplied::Applied(c) => c,
        other => panic!("not applied: {other:?}"),
    }
}

const P: PodId = PodId(0);
const T0: Timestamp = Timestamp::ZERO;

#[test]
fn stored_blocks_get_the_keys_a_request_gets_across_batches() {
    let prompt: Vec<u32> = (1..=14).collect(); // 3 full blocks and a partial one
    let want = keys_of(&prompt, BlockExtras::default());
    let mut v = EngineViews::new(SEED);
    // Blocks 0-1 in one batch, block 2 later, chained through the parent's engine hash.
    let c = applied(v.apply(
        P,
        KvSource::Live,
        0,
        &[stored(&[H(7), H(8)], None, &prompt[..8])],
        T0,
    ));
    assert_eq!((c.stored, c.unkeyed), (2, 0));
    assert_eq!(v.leading(P, &want, BS), Some(2));
    applied(v.apply(
        P,
        KvSource::Live,
        1,
        &[stored(&[H(9)], Some(H(8)), &prompt[8..12])],
        T0,
    ));
    assert_eq!(v.leading(P, &want, BS), Some(3));
    // Another block size: the view cannot answer for it.
    assert_eq!(v.leading(P, &want, 16), None);
    // Another pod: no view.
    assert_eq!(v.leading(PodId(1), &want, BS), None);
}

#[test]
fn lora_and_cache_salt_key_as_requests_do() {
    let prompt: Vec<u32> = (1..=8).collect();
    let extras = BlockExtras {
        lora: Some("sql-adapter"),
        cache_salt: Some("tenant-a"),
    };
    let mut v = EngineViews::new(SEED);
    let ev = KvEvent::Stored(StoredBlocks {
        block_hashes: &[H(1), H(2)],
        token_ids: &prompt,
        block_size: BS,
        lora_name: extras.lora,
        cache_salt: extras.cache_salt,
        ..StoredBlocks::default()
    });
    applied(v.apply(P, KvSource::Live, 0, &[ev], T0));
    assert_eq!(v.leading(P, &keys_of(&prompt, extras), BS), Some(2));
    assert_eq!(
        v.leading(P, &keys_of(&prompt, BlockExtras::default()), BS),
        Some(0)
    );
    let other_salt = BlockExtras {
        cache_salt: Some("tenant-b"),
        ..extras
    };
    assert_eq!(v.leading(P, &keys_of(&prompt, other_salt), BS), Some(0));
}

#[test]
fn removals_and_clears_are_exact() {
    let prompt: Vec<u32> = (1..=12).collect();
    let want = keys_of(&prompt, BlockExtras::default());
    let mut v = EngineViews::new(SEED);
    applied(v.apply(
        P,
        KvSource::Live,
        0,
        &[stored(&[H(1), H(2), H(3)], None, &prompt)],
        T0,
    ));
    let removed = KvEvent::Removed {
        block_hashes: &[H(2), H(99)],
        medium: Medium::Gpu,
        group: 0,
    };
    let c = applied(v.apply(P, KvSource::Live, 1, &[removed], T0));
    assert_eq!(c.removed, 1, "an unknown hash removes nothing");
    assert_eq!(
        v.leading(P, &want, BS),
        Some(1),
        "the engine's lookup stops at the hole"
    );
    assert_eq!(v.stats(P).unwrap().blocks, 2);
    let c = applied(v.apply(P, KvSource::Live, 2, &[KvEvent::AllCleared], T0));
    assert!(c.reset);
    assert_eq!(v.leading(P, &want, BS), Some(0));
    assert!(v.stats(P).unwrap().complete);
}

#[test]
fn other_media_groups_unknown_parents_and_extra_keys_are_not_keyed() {
    let prompt: Vec<u32> = (1..=12).collect();
    let want = keys_of(&prompt, BlockExtras::default());
    let mut v = EngineViews::new(SEED);
    let cpu = KvEvent::Stored(StoredBlocks {
        block_hashes: &[H(1)],
        token_ids: &prompt[..4],
        block_size: BS,
        medium: Medium::Other,
        ..StoredBlocks::default()
    });
    let group1 = KvEvent::Stored(StoredBlocks {
        block_hashes: &[H(1)],
        token_ids: &prompt[..4],
        block_size: BS,
        group: 1,
        ..StoredBlocks::default()
    });
    let orphan = stored(&[H(5)], Some(H(404)), &prompt[4..8]);
    let mm = KvEvent::Stored(StoredBlocks {
        block_hashes: &[H(1), H(2), H(3)],
        token_ids: &prompt,
        block_size: BS,
        unkeyable_from: Some(1),
        ..StoredBlocks::default()
    });
    let c = applied(v.apply(P, KvSource::Live, 0, &[cpu, group1, orphan, mm], T0));
    assert_eq!((c.ignored, c.unkeyed, c.stored), (2, 1 + 2, 1));
    assert_eq!(v.leading(P, &want, BS), Some(1));
}

#[test]
fn a_gap_waits_for_the_replay_and_a_replay_fills_it() {
    let prompt: Vec<u32> = (1..=12).collect();
    let want = keys_of(&prompt, BlockExtras::default());
    let mut v = EngineViews::new(SEED);
    let b0 = [stored(&[H(1)], None, &prompt[..4])];
    let b1 = [stored(&[H(2)], Some(H(1)), &prompt[4..8])];
    let b2 = [stored(&[H(3)], Some(H(2)), &prompt[8..12])];
    applied(v.apply(P, KvSource::Live, 0, &b0, T0));
    assert_eq!(
        v.apply(P, KvSource::Live, 2, &b2, T0),
        KvApplied::Gap { expected: 1 }
    );
    assert_eq!(
        v.leading(P, &want, BS),
        None,
        "not usable while the gap is open"
    );
    assert!(v.stats(P).unwrap().gap_pending);
    // The replay sends everything from 0: 0 is a duplicate, 1 and 2 apply.
    assert_eq!(
        v.apply(P, KvSource::Replay, 0, &b0, T0),
        KvApplied::Duplicate
    );
    applied(v.apply(P, KvSource::Replay, 1, &b1, T0));
    applied(v.apply(P, KvSource::Replay, 2, &b2, T0));
    // The live batch held during the replay is fed again as a replayed one: a duplicate now.
    assert_eq!(
        v.apply(P, KvSource::Replay, 2, &b2, T0),
        KvApplied::Duplicate
    );
    assert_eq!(v.leading(P, &want, BS), Some(3));
    let s = v.stats(P).unwrap();
    assert!(s.complete);
    assert_eq!((s.gaps, s.next_seq), (1, Some(3)));
}

#[test]
fn an_unfilled_gap_makes_the_view_stale_until_the_engine_clears() {
    let prompt: Vec<u32> = (1..=8).collect();
    let want = keys_of(&prompt, BlockExtras::default());
    let mut v = EngineViews::new(SEED);
    // Joined mid-stream: the first batch is number 500.
    let b = [stored(&[H(1), H(2)], None, &prompt)];
    assert_eq!(
        v.apply(P, KvSource::Live, 500, &b, T0),
        KvApplied::Gap { expected: 0 }
    );
    v.accept_gap(P);
    applied(v.apply(P, KvSource::Live, 500, &b, T0));
    assert_eq!(v.leading(P, &want, BS), None, "stale: it may miss blocks");
    assert_eq!(v.stats(P).unwrap().blocks, 2, "but it keeps ingesting");
    applied(v.apply(P, KvSource::Live, 501, &[KvEvent::AllCleared], T0));
    applied(v.apply(P, KvSource::Live, 502, &b, T0));
    assert_eq!(v.leading(P, &want, BS), Some(2));
}

#[test]
fn a_suspended_view_is_kept_and_fed_and_used_again_from_its_next_batch() {
    let prompt: Vec<u32> = (1..=8).collect();
    let want = keys_of(&prompt, BlockExtras::default());
    let mut v = EngineViews::new(SEED);
    assert!(!v.suspend(P), "no view to suspend");
    applied(v.apply(
        P,
        KvSource::Live,
        0,
        &[stored(&[H(1)], None, &prompt[..4])],
        T0,
    ));
    assert_eq!(v.leading(P, &want, BS), Some(1));
    assert!(v.suspend(P));
    assert_eq!(
        v.leading(P, &want, BS),
        None,
        "suspended: the index answers"
    );
    let s = v.stats(P).unwrap();
    assert!(s.suspended && s.complete && s.blocks == 1);
    applied(v.apply(
        P,
        KvSource::Live,
        1,
        &[stored(&[H(2)], Some(H(1)), &prompt[4..])],
        T0,
    ));
    assert_eq!(
        v.leading(P, &want, BS),
        Some(2),
        "nothing was lost meanwhile"
    );
    assert!(!v.stats(P).unwrap().suspended);
}

#[test]
fn a_lower_live_number_is_a_restarted_engine() {
    let prompt: Vec<u32> = (1..=8).collect();
    let want = keys_of(&prompt, BlockExtras::default());
    let mut v = EngineViews::new(SEED);
    let b = [stored(&[H(1), H(2)], None, &prompt)];
    applied(v.apply(P, KvSource::Live, 0, &b, T0));
    applied(v.apply(P, KvSource::Live, 1, &[], T0));
    // The engine restarted: its cache is empty and its publisher counts from 0 again.
    let c = applied(v.apply(P, KvSource::Live, 0, &[], T0));
    assert!(c.reset);
    assert_eq!(v.leading(P, &want, BS), Some(0));
    assert!(v.stats(P).unwrap().complete);
    // A restart seen late (its first batches missed) is a gap from 0.
    applied(v.apply(P, KvSource::Live, 1, &b, T0));
    assert_eq!(
        v.apply(P, KvSource::Live, 1, &b, T0),
        KvApplied::Gap { expected: 0 }
    );
    assert_eq!(v.leading(P, &want, BS), None);
}

#[test]
fn a_changed_block_size_empties_the_view() {
    let prompt: Vec<u32> = (1..=16).collect();
    let mut v = EngineViews::new(SEED);
    applied(v.apply(
        P,
        KvSource::Live,
        0,
        &[stored(&[H(1)], None, &prompt[..4])],
        T0,
    ));
    let bigger = KvEvent::Stored(StoredBlocks {
        block_hashes: &[H(2)],
        token_ids: &prompt[..8],
        block_size: 8,
        ..StoredBlocks::default()
    });
    let c = applied(v.apply(P, KvSource::Live, 1, &[bigger], T0));
    assert!(c.reset);
    let s = v.stats(P).unwrap();
    assert_eq!((s.blocks, s.block_size), (1, 8));
    let keys8 = TokenKeyConfig::new(8, SEED)
        .unwrap()
        .keys(&prompt, BlockExtras::default());
    assert_eq!(v.leading(P, &keys8, 8), Some(1));
}
