//! `least-request`: the fewest in-flight requests, ties uniformly at random (AIBrix v0.7.0's
//! `algorithms/least_request.go`).

use super::Candidate;

/// The index of a least-loaded candidate, uniform among ties (0 if `cands` is empty).
pub(crate) fn least_loaded(cands: &[Candidate], rng: &mut fastrand::Rng) -> usize {
    let Some(min) = cands.iter().map(|c| c.load).min() else {
        return 0;
    };
    let ties = cands.iter().filter(|c| c.load == min).count();
    let nth = rng.usize(..ties);
    cands
        .iter()
        .enumerate()
        .filter(|(_, c)| c.load == min)
        .nth(nth)
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PodId;

    #[test]
    fn picks_the_minimum_and_spreads_ties() {
        let c = |pod, load| Candidate {
            pod: PodId(pod),
            load,
            matched: 0,
        };
        let cands = [c(0, 3), c(1, 1), c(2, 1), c(3, 5)];
        let mut rng = fastrand::Rng::with_seed(1);
        let mut seen = [0u32; 4];
        for _ in 0..1000 {
            seen[least_loaded(&cands, &mut rng)] += 1;
        }
        assert_eq!(seen[0] + seen[3], 0);
        assert!(
            seen[1] > 400 && seen[2] > 400,
            "ties must be spread: {seen:?}"
        );
    }
}
