//! `decode` never panics, whatever the bytes; `encode` then `decode` is the identity.

mod common;

use kvroute_kv_events::wire::{
    decode, encode, BlockHash, BlockRemoved, BlockStored, DecodeError, EventBatch, KvEvent, Layout,
    Value,
};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

const LAYOUTS: [Layout; 3] = [Layout::Positional, Layout::Map, Layout::MapBatch];

#[test]
fn every_truncation_of_every_golden_file_is_an_error() {
    for case in common::cases() {
        for f in &case.files {
            // Skip the 70 KB file's 70 000 prefixes past the first few hundred: same code paths.
            let step = if f.bytes.len() > 4096 { 97 } else { 1 };
            for len in (0..f.bytes.len()).step_by(step) {
                assert!(
                    decode(&f.bytes[..len]).is_err(),
                    "{} cut at {len} decoded",
                    f.file
                );
            }
            let mut longer = f.bytes.clone();
            longer.push(0xc0);
            assert_eq!(
                decode(&longer),
                Err(DecodeError::TrailingBytes { count: 1 }),
                "{}",
                f.file
            );
        }
    }
}

#[test]
fn every_byte_mutation_of_small_golden_files_is_handled() {
    for case in common::cases() {
        for f in f_small(&case.files) {
            for i in 0..f.bytes.len() {
                for b in [
                    0x00, 0x7f, 0x80, 0x90, 0xa0, 0xc0, 0xc1, 0xc4, 0xcf, 0xd3, 0xdc, 0xdd, 0xde,
                    0xdf, 0xff,
                ] {
                    let mut m = f.bytes.clone();
                    m[i] = b;
                    let _ = decode(&m);
                }
            }
        }
    }
}

fn f_small(files: &[common::GoldenFile]) -> impl Iterator<Item = &common::GoldenFile> {
    files.iter().filter(|f| f.bytes.len() <= 1024)
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    // [0.0, [{"type": "BlockStored", "x": [[[[...]]]]}]] and the same inside extra_keys.
    let depth = 200_000;
    for key in ["x", "extra_keys"] {
        let mut p = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x82];
        p.extend([0xa4]);
        p.extend(b"type");
        p.extend([0xab]);
        p.extend(b"BlockStored");
        p.push(0xa0 | key.len() as u8);
        p.extend(key.as_bytes());
        if key == "extra_keys" {
            p.extend([0x91, 0x91]); // list of one tuple of one value
        }
        p.extend(std::iter::repeat_n(0x91, depth));
        p.push(0xc0);
        assert!(
            matches!(decode(&p), Err(DecodeError::TooDeep { .. })),
            "{key}"
        );
    }
}

#[test]
fn huge_lengths_do_not_allocate() {
    // array32 / map32 / bin32 / str32 claiming 4 G elements in a few bytes.
    for p in [
        &[0xdd, 0xff, 0xff, 0xff, 0xff][..],
        &[
            0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff,
        ],
        &[
            0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff,
        ],
        &[
            0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff,
        ],
        &[
            0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x92, 0xab, b'B', b'l', b'o', b'c', b'k',
            b'S', b't', b'o', b'r', b'e', b'd', 0xc6, 0xff, 0xff, 0xff, 0xff,
        ],
    ] {
        assert!(
            matches!(decode(p), Err(DecodeError::Truncated { .. })),
            "{p:x?}"
        );
    }
}

#[test]
fn typed_errors() {
    // A known event with a wrongly typed field fails the batch, naming the field.
    let bad = [0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x95, 0xab]
        .iter()
        .copied()
        .chain(*b"BlockStored")
        .chain([0x90, 0xc0, 0x91, 0xa1, b'x', 0x10])
        .collect::<Vec<u8>>();
    match decode(&bad) {
        Err(DecodeError::UnexpectedType {
            field: "token_ids",
            expected: "int",
            found: "str",
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // Missing required positional fields.
    let short = [0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x93, 0xab]
        .iter()
        .copied()
        .chain(*b"BlockStored")
        .chain([0x90, 0xc0])
        .collect::<Vec<u8>>();
    assert_eq!(
        decode(&short),
        Err(DecodeError::MissingField {
            event: "BlockStored",
            field: "token_ids"
        })
    );
    // An event without a tag.
    assert!(matches!(
        decode(&[0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x90]),
        Err(DecodeError::MissingTag { index: 0, .. })
    ));
    assert!(matches!(
        decode(&[0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x81, 0xa1, b'a', 0x01]),
        Err(DecodeError::MissingTag { index: 0, .. })
    ));
    // Token id above u32, negative block size.
    let big_token = [0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x95, 0xab]
        .iter()
        .copied()
        .chain(*b"BlockStored")
        .chain([0x90, 0xc0, 0x91, 0xcf, 1, 0, 0, 0, 0, 0, 0, 0, 0x10])
        .collect::<Vec<u8>>();
    assert!(matches!(
        decode(&big_token),
        Err(DecodeError::OutOfRange {
            field: "token_ids",
            ..
        })
    ));
    // Invalid UTF-8 in medium.
    let mut bad_utf8 = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x93, 0xac];
    bad_utf8.extend(b"BlockRemoved");
    bad_utf8.extend([0x90, 0xa2, 0xff, 0xfe]);
    assert!(matches!(
        decode(&bad_utf8),
        Err(DecodeError::InvalidUtf8 {
            field: "medium",
            ..
        })
    ));
}

#[test]
fn tag_anywhere_in_a_map_and_non_string_keys() {
    // {"block_hashes": [1], 7: "x", [1]: 2, "medium": "GPU", "type": "BlockRemoved"}
    let mut p = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x85, 0xac];
    p.extend(b"block_hashes");
    p.extend([0x91, 0x01, 0x07, 0xa1, b'x', 0x91, 0x01, 0x02, 0xa6]);
    p.extend(b"medium");
    p.extend([0xa3]);
    p.extend(b"GPU");
    p.extend([0xa4]);
    p.extend(b"type");
    p.extend([0xac]);
    p.extend(b"BlockRemoved");
    let b = decode(&p).unwrap();
    assert_eq!(
        b.events,
        vec![KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![BlockHash::Int(1)],
            medium: Some("GPU".into()),
            group_idx: None
        })]
    );
}

fn arb_hash() -> impl Strategy<Value = BlockHash> {
    prop_oneof![
        any::<u64>().prop_map(BlockHash::Int),
        (i64::MIN..0).prop_map(BlockHash::NegInt),
        vec(any::<u8>(), 0..40).prop_map(BlockHash::Bytes),
    ]
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::UInt),
        (i64::MIN..0).prop_map(Value::Int),
        any::<f64>()
            .prop_filter("NaN != NaN", |f| !f.is_nan())
            .prop_map(Value::Float),
        ".{0,40}".prop_map(Value::Str),
        vec(any::<u8>(), 0..40).prop_map(Value::Bytes),
        (any::<i8>(), vec(any::<u8>(), 0..20)).prop_map(|(t, d)| Value::Ext(t, d)),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

fn arb_stored() -> impl Strategy<Value = BlockStored> {
    (
        vec(arb_hash(), 0..6),
        option::of(arb_hash()),
        vec(any::<u32>(), 0..40),
        any::<u32>(),
        option::of(any::<i64>()),
        option::of("GPU|CPU|[a-z]{0,40}"),
        option::of(".{0,50}"),
        option::of(vec(option::of(vec(arb_value(), 0..4)), 0..4)),
        (
            option::of(any::<u32>()),
            option::of("[a-z_]{0,300}"),
            option::of(any::<u32>()),
        ),
    )
        .prop_map(
            |(
                block_hashes,
                parent,
                token_ids,
                block_size,
                lora_id,
                medium,
                lora_name,
                extra_keys,
                (g, k, w),
            )| {
                BlockStored {
                    block_hashes,
                    parent_block_hash: parent,
                    token_ids,
                    block_size,
                    lora_id,
                    medium,
                    lora_name,
                    extra_keys,
                    group_idx: g,
                    kv_cache_spec_kind: k,
                    kv_cache_spec_sliding_window: w,
                }
            },
        )
}

fn arb_event() -> impl Strategy<Value = KvEvent> {
    prop_oneof![
        arb_stored().prop_map(KvEvent::BlockStored),
        (
            vec(arb_hash(), 0..6),
            option::of("GPU|CPU"),
            option::of(any::<u32>())
        )
            .prop_map(|(block_hashes, medium, group_idx)| KvEvent::BlockRemoved(
                BlockRemoved {
                    block_hashes,
                    medium,
                    group_idx
                }
            )),
        Just(KvEvent::AllBlocksCleared),
    ]
}

fn arb_batch() -> impl Strategy<Value = EventBatch> {
    (
        any::<f64>().prop_filter("NaN != NaN", |f| !f.is_nan()),
        vec(arb_event(), 0..8),
        option::of(any::<u32>()),
    )
        .prop_map(|(ts, events, dp)| EventBatch {
            ts,
            events,
            data_parallel_rank: dp,
            skipped: vec![],
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn roundtrip_every_layout(batch in arb_batch()) {
        for layout in LAYOUTS {
            let bytes = encode(&batch, layout);
            let back = decode(&bytes).map_err(|e| TestCaseError::fail(format!("{layout}: {e}")))?;
            prop_assert_eq!(&back, &batch);
            prop_assert_eq!(encode(&back, layout), bytes);
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn corrupted_encodings_never_panic(batch in arb_batch(), cuts in vec((any::<usize>(), any::<u8>()), 1..8)) {
        for layout in LAYOUTS {
            let mut bytes = encode(&batch, layout);
            for &(at, b) in &cuts {
                let i = at % bytes.len();
                bytes[i] = b;
            }
            let _ = decode(&bytes);
            let _ = decode(&bytes[..cuts[0].0 % bytes.len()]);
        }
    }
}
