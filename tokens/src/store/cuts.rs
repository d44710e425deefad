//! Cuts: byte offsets where a text's tokenization splits cleanly, so that the ids before the
//! cut can be reused and the text after it tokenized on its own.
//!
//! A candidate cut `c` is the start of a pre-token where the text reads `x␠a` (`x` an ASCII
//! character other than whitespace at `c-1`, a space at `c`, `a` an ASCII letter or digit at
//! `c+1`) or `\na` (a newline at `c-1`, an ASCII letter at `c`). For the GPT-2, Llama 3 and
//! Qwen 2 regexes every match attempt that starts before such a `c` stops reading at `c` or
//! `c+1`, so the pre-tokens before `c` do not depend on anything after `c+1`, and those after
//! `c` are the pre-tokens of `text[c..]` (none of the regexes looks behind). Added tokens are
//! found first, by exact match: a cut at least one added-token length (the margin) before the
//! end of what two texts share cannot be straddled by an added token in one text only.
//!
//! Each chosen cut is then verified on the text it was chosen in: with cuts
//! `a = x_0 < x_1 < ... < x_m < x_{m+1} = len`, segment `i` passes if `encode(text[x_i..x_{i+1}])`
//! equals the full encoding's ids between them; a cut is kept only if the segments on both its
//! sides pass. The verification costs one more encoding of the new part of the text.

/// Whether byte offset `c` of `text` reads as a candidate cut (see the module doc).
#[inline]
pub(crate) fn is_candidate(text: &[u8], c: usize) -> bool {
    if c == 0 || c + 1 >= text.len() {
        return false;
    }
    let (before, at, after) = (text[c - 1], text[c], text[c + 1]);
    (at == b' '
        && before.is_ascii()
        && !before.is_ascii_whitespace()
        && after.is_ascii_alphanumeric())
        || (before == b'\n' && at.is_ascii_alphabetic())
}

/// For each limit (ascending), the last candidate `(byte, index)` at or before it that lies after
/// `floor`; `None` where there is none. `candidates` is ascending.
pub(crate) fn choose(
    candidates: &[(usize, usize)],
    floor: usize,
    limits: &[usize],
) -> Vec<Option<(usize, usize)>> {
    let mut out = Vec::with_capacity(limits.len());
    let mut i = 0;
    let mut best = None;
    for &limit in limits {
        while i < candidates.len() && candidates[i].0 <= limit {
            if candidates[i].0 > floor {
                best = Some(candidates[i]);
            }
            i += 1;
        }
        out.push(best);
    }
    out
}

/// Verifies the chosen cuts: `cuts` are ascending `(byte, index)` strictly between `start` and
/// `end = (text.len(), ids.len())`, where `ids[start.1..]` are the ids of `text[start.0..]` in the
/// full encoding. Returns, per cut, whether it is kept. `encode(a, b)` tokenizes `text[a..b]`;
/// `None` from it (an error) fails the segment.
pub(crate) fn verify(
    ids: &[u32],
    start: (usize, usize),
    cuts: &[(usize, usize)],
    end: (usize, usize),
    mut encode: impl FnMut(usize, usize) -> Option<Vec<u32>>,
) -> Vec<bool> {
    let mut points = Vec::with_capacity(cuts.len() + 2);
    points.push(start);
    points.extend_from_slice(cuts);
    points.push(end);
    let passed: Vec<bool> = points
        .windows(2)
        .map(|w| {
            let ((a, na), (b, nb)) = (w[0], w[1]);
            encode(a, b).is_some_and(|got| got == ids[na..nb])
        })
        .collect();
    (0..cuts.len())
        .map(|i| passed[i] && passed[i + 1])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates() {
        let t = b"ab cd\nef  gh.\t ij";
        let c: Vec<usize> = (0..t.len()).filter(|&c| is_candidate(t, c)).collect();
        // " cd" after 'b', "ef" after '\n'; "  gh" has whitespace before its space; "\t ij" too.
        assert_eq!(c, vec![2, 6]);
    }

    #[test]
    fn choose_last_before_each_limit() {
        let cands = [(5, 1), (9, 2), (20, 4)];
        assert_eq!(
            choose(&cands, 5, &[4, 10, 19, 30]),
            vec![None, Some((9, 2)), Some((9, 2)), Some((20, 4))]
        );
    }

    #[test]
    fn a_failing_segment_drops_both_ends() {
        let ids = [1, 2, 3, 4];
        // Segments [0,1) [1,2) [2,3) [3,4) by byte = index; [1,2) encodes wrong.
        let kept = verify(&ids, (0, 0), &[(1, 1), (2, 2), (3, 3)], (4, 4), |a, b| {
            Some(if a == 1 { vec![9] } else { ids[a..b].to_vec() })
        });
        assert_eq!(kept, vec![false, false, true]);
    }
}
