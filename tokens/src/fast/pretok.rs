//! Hand-written scanners equivalent to the pre-tokenizer regexes of byte-level BPE models.
//!
//! `tokenizers` splits each text segment (the text between added tokens) with `fancy-regex`, a
//! backtracking engine: at every position the alternatives are tried in order, each quantifier
//! greedy with backtracking, and the first alternative that matches wins. For the patterns
//! below every position starts a match, so the pre-tokens tile the segment. Each scanner
//! computes, for a start position, the end of the match the regex finds there, alternative by
//! alternative, in the regex's own order. The property test `scanners_match_fancy_regex` (`tests/props.rs`) checks them against
//! `fancy-regex` on random text.

use super::classes::{class_of, folds_to, CharClass};

/// GPT-2's pattern, built into the `ByteLevel` pre-tokenizer (`use_regex: true`).
pub const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's pattern (a `Split` pre-tokenizer before `ByteLevel(use_regex: false)`).
pub const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's pattern: Llama 3's with single digits.
pub const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A supported pre-tokenizer regex.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scanner {
    /// [`GPT2`].
    Gpt2,
    /// [`LLAMA3`] (`max_digits` 3) or [`QWEN2`] (`max_digits` 1).
    Llama3 {
        /// The `n` of `\p{N}{1,n}`.
        max_digits: usize,
    },
}

impl Scanner {
    /// The scanner for regex `pattern`, if it is one of the supported patterns (exact text).
    pub fn for_pattern(pattern: &str) -> Option<Scanner> {
        match pattern {
            GPT2 => Some(Scanner::Gpt2),
            LLAMA3 => Some(Scanner::Llama3 { max_digits: 3 }),
            QWEN2 => Some(Scanner::Llama3 { max_digits: 1 }),
            _ => None,
        }
    }

    /// Calls `f(start, end)` for each pre-token of `s`, in order; they tile `s`.
    #[inline]
    pub fn split(self, s: &str, mut f: impl FnMut(usize, usize)) {
        let mut i = 0;
        while i < s.len() {
            let end = match self {
                Scanner::Gpt2 => gpt2_match(s, i),
                Scanner::Llama3 { max_digits } => llama3_match(s, i, max_digits),
            };
            debug_assert!(end > i && s.is_char_boundary(end));
            f(i, end);
            i = end;
        }
    }
}

/// The character at byte `i` and its class, or `None` at the end.
#[inline]
fn at(s: &str, i: usize) -> Option<(char, CharClass)> {
    let b = *s.as_bytes().get(i)?;
    if b < 0x80 {
        let c = b as char;
        return Some((c, class_of(c)));
    }
    let c = s[i..].chars().next()?;
    Some((c, class_of(c)))
}

/// End of the maximal run of characters of class `class` starting at `i`.
#[inline]
fn run(s: &str, mut i: usize, class: CharClass) -> usize {
    while let Some((c, k)) = at(s, i) {
        if k != class {
            break;
        }
        i += c.len_utf8();
    }
    i
}

/// Length of a case-sensitive contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`) at `i`.
fn contraction(s: &str, i: usize) -> Option<usize> {
    let rest = &s.as_bytes()[i..];
    if rest.first() != Some(&b'\'') {
        return None;
    }
    for c in [&b"s"[..], b"t", b"re", b"ve", b"m", b"ll", b"d"] {
        if rest[1..].starts_with(c) {
            return Some(1 + c.len());
        }
    }
    None
}

/// Length of a case-insensitive contraction at `i` (Unicode simple case folding).
fn contraction_ci(s: &str, i: usize) -> Option<usize> {
    if s.as_bytes().get(i) != Some(&b'\'') {
        return None;
    }
    let rest = &s[i + 1..];
    'alt: for alt in [&b"s"[..], b"t", b"re", b"ve", b"m", b"ll", b"d"] {
        let mut len = 1;
        let mut chars = rest.chars();
        for &l in alt {
            match chars.next() {
                Some(c) if folds_to(c, l) => len += c.len_utf8(),
                _ => continue 'alt,
            }
        }
        return Some(len);
    }
    None
}

/// `\s+(?!\S)` then `\s+` at `i` (the character at `i` is a space): the whitespace run, less its
/// last character if the run has two or more characters and does not end the text.
#[inline]
fn whitespace(s: &str, i: usize) -> usize {
    let end = run(s, i, CharClass::Space);
    if end == s.len() {
        return end;
    }
    let last = s[..end].chars().next_back().map_or(1, char::len_utf8);
    if end - last > i {
        end - last
    } else {
        end
    }
}

fn gpt2_match(s: &str, i: usize) -> usize {
    if let Some(n) = contraction(s, i) {
        return i + n;
    }
    let Some((c, class)) = at(s, i) else {
        return i;
    };
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional ' ' then a run of one class.
    if c == ' ' {
        if let Some((_, next)) = at(s, i + 1) {
            if next != CharClass::Space {
                return run(s, i + 1, next);
            }
        }
    }
    if class != CharClass::Space {
        return run(s, i, class);
    }
    whitespace(s, i)
}

fn llama3_match(s: &str, i: usize, max_digits: usize) -> usize {
    if let Some(n) = contraction_ci(s, i) {
        return i + n;
    }
    let Some((c, class)) = at(s, i) else {
        return i;
    };
    let next = at(s, i + c.len_utf8());
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    if class == CharClass::Letter {
        return run(s, i, CharClass::Letter);
    }
    if class != CharClass::Number && c != '\r' && c != '\n' {
        if let Some((_, CharClass::Letter)) = next {
            return run(s, i + c.len_utf8(), CharClass::Letter);
        }
    }
    // `\p{N}{1,n}`
    if class == CharClass::Number {
        let mut j = i;
        for _ in 0..max_digits {
            match at(s, j) {
                Some((d, CharClass::Number)) => j += d.len_utf8(),
                _ => break,
            }
        }
        return j;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let other_from = if c == ' ' && matches!(next, Some((_, CharClass::Other))) {
        Some(i + 1)
    } else if class == CharClass::Other {
        Some(i)
    } else {
        None
    };
    if let Some(from) = other_from {
        let mut j = run(s, from, CharClass::Other);
        while matches!(s.as_bytes().get(j), Some(b'\r' | b'\n')) {
            j += 1;
        }
        return j;
    }
    // Here the character at `i` is whitespace. `\s*[\r\n]+`: up to the last '\r' or '\n' of
    // the whitespace run, if it has one.
    let end = run(s, i, CharClass::Space);
    if let Some(k) = s.as_bytes()[i..end]
        .iter()
        .rposition(|&b| b == b'\r' || b == b'\n')
    {
        return i + k + 1;
    }
    whitespace(s, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(scanner: Scanner, s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        scanner.split(s, |a, b| out.push(&s[a..b]));
        out
    }

    #[test]
    fn gpt2_examples() {
        assert_eq!(
            pieces(Scanner::Gpt2, "Hello  world's 123 !!\n\n x"),
            ["Hello", " ", " world", "'s", " 123", " !!", "\n\n", " x"]
        );
        assert_eq!(pieces(Scanner::Gpt2, "a  "), ["a", "  "]);
    }

    #[test]
    fn llama3_examples() {
        let l3 = Scanner::Llama3 { max_digits: 3 };
        assert_eq!(
            pieces(l3, "Hello  WORLD'S 12345 .x!!\n\n\tfoo \n"),
            ["Hello", " ", " WORLD", "'S", " ", "123", "45", " .", "x", "!!\n\n", "\tfoo", " \n"]
        );
    }
}
