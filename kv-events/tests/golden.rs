//! The golden files written by msgspec (scripts/gen-kv-events.py): decoding gives the content
//! expected.json describes, and encoding gives the files back byte for byte.

mod common;

use kvroute_kv_events::wire::{decode, encode, Layout};

#[test]
fn golden_set_is_complete() {
    let cases = common::cases();
    assert!(cases.len() >= 10);
    let files: usize = cases.iter().map(|c| c.files.len()).sum();
    let on_disk = std::fs::read_dir(common::golden_dir())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "msgpack")
        })
        .count();
    assert_eq!(
        files, on_disk,
        "every .msgpack file is described in expected.json"
    );
}

#[test]
fn decode_golden_files() {
    for case in common::cases() {
        for f in &case.files {
            let got = decode(&f.bytes).unwrap_or_else(|e| panic!("{}: {e}", f.file));
            assert_eq!(got, case.expected, "{}", f.file);
            assert_eq!(got.ts.to_bits(), case.expected.ts.to_bits(), "{}", f.file);
        }
    }
}

#[test]
fn fold_matches_expected() {
    let mut n = 0;
    for case in common::cases() {
        for (h, fold) in &case.folds {
            assert_eq!(h.fold(), *fold, "{}: {h:?}", case.name);
            n += 1;
        }
    }
    assert!(n > 50);
}

#[test]
fn encode_reproduces_golden_bytes() {
    let mut checked = 0;
    for case in common::cases().into_iter().filter(|c| c.roundtrip) {
        for f in &case.files {
            // From the file's own decoding, and from the expected content alone.
            let decoded = decode(&f.bytes).unwrap();
            assert!(
                encode(&decoded, f.layout) == f.bytes,
                "{}: re-encoding differs",
                f.file
            );
            assert!(
                encode(&case.expected, f.layout) == f.bytes,
                "{}: encoding differs",
                f.file
            );
            checked += 1;
        }
    }
    assert!(checked >= 21, "{checked}");
}

#[test]
fn transcode_between_layouts() {
    for case in common::cases().into_iter().filter(|c| c.roundtrip) {
        for from in &case.files {
            let decoded = decode(&from.bytes).unwrap();
            for to in &case.files {
                assert!(
                    encode(&decoded, to.layout) == to.bytes,
                    "{} -> {}",
                    from.file,
                    to.file
                );
            }
        }
    }
}

#[test]
fn lossy_cases_are_stable() {
    // Unknown tags/fields and short positional events do not survive re-encoding, but what is
    // kept decodes back the same in every layout.
    for case in common::cases().into_iter().filter(|c| !c.roundtrip) {
        for f in &case.files {
            let decoded = decode(&f.bytes).unwrap();
            for layout in [Layout::Positional, Layout::Map, Layout::MapBatch] {
                let mut again = decode(&encode(&decoded, layout)).unwrap();
                again.skipped = decoded.skipped.clone();
                assert_eq!(again, decoded, "{} via {layout}", f.file);
            }
        }
    }
}

#[test]
fn unknown_tags_are_reported() {
    let case = common::cases()
        .into_iter()
        .find(|c| c.name == "unknown_event_tag")
        .unwrap();
    for f in &case.files {
        let b = decode(&f.bytes).unwrap();
        assert_eq!(b.events.len(), 2, "{}", f.file);
        assert_eq!(b.skipped.len(), 1);
        assert_eq!(
            (b.skipped[0].index, b.skipped[0].tag.as_str()),
            (1, "BlockUpdated")
        );
    }
}
