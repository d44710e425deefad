//! `power-of-two` (AIBrix v0.7.0 `power_of_two.go`): two distinct candidates drawn uniformly at
//! random, the one with fewer in-flight requests, the first drawn on a tie; a single candidate
//! is chosen directly.
//!
//! AIBrix counts, in Redis, only the requests power-of-two itself routed, per model, pod and
//! hour (keys rotate hourly, so counts restart at 0 each hour while older requests are still
//! running), and registers the strategy only when Redis is configured. kvroute compares its
//! own in-flight counts: every request this router has open on the pod, whatever routed it.

use super::Candidate;

/// The index of the chosen candidate. `cands` must not be empty.
pub(crate) fn power_of_two(cands: &[Candidate], rng: &mut fastrand::Rng) -> usize {
    let n = cands.len();
    if n < 2 {
        return 0;
    }
    let first = rng.usize(..n);
    // Uniform over the others (AIBrix redraws until it differs: the same distribution).
    let mut second = rng.usize(..n - 1);
    if second >= first {
        second += 1;
    }
    if cands[first].load <= cands[second].load {
        first
    } else {
        second
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PodId;

    fn loads(l: &[u32]) -> Vec<Candidate> {
        l.iter()
            .enumerate()
            .map(|(i, &load)| Candidate {
                pod: PodId(i as u32),
                load,
                matched: 0,
            })
            .collect()
    }

    #[test]
    fn one_candidate_is_chosen_directly() {
        assert_eq!(
            power_of_two(&loads(&[7]), &mut fastrand::Rng::with_seed(1)),
            0
        );
    }

    #[test]
    fn the_busiest_of_distinct_loads_is_never_chosen() {
        let cands = loads(&[5, 1, 9, 3]);
        let mut rng = fastrand::Rng::with_seed(2);
        for _ in 0..500 {
            assert_ne!(power_of_two(&cands, &mut rng), 2);
        }
    }

    #[test]
    fn frequencies_follow_the_two_choice_law() {
        // P(p) = (2·#{q: load q > load p} + #{q ≠ p: load q = load p}) / (n(n − 1)).
        let l = [0u32, 2, 2, 5];
        let cands = loads(&l);
        let n = l.len();
        let mut rng = fastrand::Rng::with_seed(3);
        let draws = 120_000;
        let mut seen = [0u32; 4];
        for _ in 0..draws {
            seen[power_of_two(&cands, &mut rng)] += 1;
        }
        for p in 0..n {
            let above = l.iter().filter(|&&q| q > l[p]).count();
            let level = l
                .iter()
                .enumerate()
                .filter(|&(q, &v)| q != p && v == l[p])
                .count();
            let want = (2 * above + level) as f64 / (n * (n - 1)) as f64;
            let got = f64::from(seen[p]) / f64::from(draws);
            assert!((got - want).abs() < 0.01, "pod {p}: {got} vs {want}");
        }
    }
}
