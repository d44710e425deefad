//! Character classes of the pre-tokenizer regexes: `\p{L}`, `\p{N}`, `\s`, and the
//! case-insensitive letters of Llama 3's contractions. The tables come from `regex-syntax`, the
//! crate whose tables `fancy-regex` (and so `tokenizers`) match with, so both sides agree on
//! every code point.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

/// The class of a character as the regexes see it. `\p{L}`, `\p{N}` and `\s` are disjoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CharClass {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\s` (Unicode White_Space).
    Space,
    /// Everything else: `[^\s\p{L}\p{N}]`.
    Other,
}

struct Tables {
    ascii: [CharClass; 128],
    /// Sorted, disjoint `(first, last, class)` ranges of non-ASCII letters, numbers, spaces.
    ranges: Vec<(u32, u32, CharClass)>,
}

fn ranges_of(pattern: &str) -> Vec<(u32, u32)> {
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .expect("static class pattern");
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        HirKind::Literal(lit) => {
            let s = std::str::from_utf8(&lit.0).expect("utf-8 literal");
            s.chars().map(|c| (c as u32, c as u32)).collect()
        }
        other => panic!("unexpected HIR for {pattern}: {other:?}"),
    }
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut ranges = Vec::new();
        for (pattern, class) in [
            (r"\p{L}", CharClass::Letter),
            (r"\p{N}", CharClass::Number),
            (r"\s", CharClass::Space),
        ] {
            ranges.extend(ranges_of(pattern).into_iter().map(|(a, b)| (a, b, class)));
        }
        ranges.sort_unstable_by_key(|r| r.0);
        let mut ascii = [CharClass::Other; 128];
        for (b, slot) in ascii.iter_mut().enumerate() {
            let c = b as u32;
            if let Some(r) = ranges.iter().find(|r| r.0 <= c && c <= r.1) {
                *slot = r.2;
            }
        }
        Tables { ascii, ranges }
    })
}

/// The class of `c`.
#[inline]
pub fn class_of(c: char) -> CharClass {
    let t = tables();
    let u = c as u32;
    if u < 128 {
        return t.ascii[u as usize];
    }
    let i = t.ranges.partition_point(|r| r.1 < u);
    match t.ranges.get(i) {
        Some(r) if r.0 <= u => r.2,
        _ => CharClass::Other,
    }
}

/// Forces the tables to be built (at load, not on the first request).
pub fn warm_up() {
    let _ = tables();
}

/// Whether `c` matches the ASCII letter `lower` case-insensitively under Unicode simple case
/// folding, as `(?i:...)` does (`s` also matches U+017F LATIN SMALL LETTER LONG S).
pub fn folds_to(c: char, lower: u8) -> bool {
    type Folds = Vec<(u8, Vec<(u32, u32)>)>;
    static FOLDS: OnceLock<Folds> = OnceLock::new();
    let folds = FOLDS.get_or_init(|| {
        b"strevmld"
            .iter()
            .map(|&l| (l, ranges_of(&format!("(?i:{})", l as char))))
            .collect()
    });
    let u = c as u32;
    folds
        .iter()
        .find(|(l, _)| *l == lower)
        .is_some_and(|(_, r)| r.iter().any(|&(a, b)| a <= u && u <= b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class_of('a'), CharClass::Letter);
        assert_eq!(class_of('é'), CharClass::Letter);
        assert_eq!(class_of('中'), CharClass::Letter);
        assert_eq!(class_of('7'), CharClass::Number);
        assert_eq!(class_of('²'), CharClass::Number);
        assert_eq!(class_of('\u{a0}'), CharClass::Space);
        assert_eq!(class_of('\u{3000}'), CharClass::Space);
        assert_eq!(class_of('\u{200b}'), CharClass::Other);
        assert_eq!(class_of('\u{301}'), CharClass::Other);
        assert_eq!(class_of('\u{1c}'), CharClass::Other);
        assert_eq!(class_of('!'), CharClass::Other);
    }

    #[test]
    fn case_folding() {
        assert!(folds_to('S', b's') && folds_to('\u{17f}', b's') && !folds_to('t', b's'));
        assert!(folds_to('L', b'l') && folds_to('d', b'd'));
    }
}
