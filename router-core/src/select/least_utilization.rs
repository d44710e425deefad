//! `least-utilization` (AIBrix v0.7.0 `least_util.go`): the pod with the least engine
//! utilization, ties uniformly at random; pods without the metric are skipped, and with none
//! having it the choice is uniform over all.
//!
//! AIBrix reads `engine_utilization`, which only xLLM exports and AIBrix describes as the "GPU
//! busy time ratio"; on vLLM every pod is skipped and AIBrix picks at random. kvroute reads the
//! busy-time ratio it measures for `least-busy-time` (`crate::busy`), so on kvroute the two
//! strategies rank alike.

use super::PodMetrics;

/// The pod's score: its busy-time ratio.
pub(crate) fn score(m: &PodMetrics) -> Option<f64> {
    Some(m.busy_ratio)
}

#[cfg(test)]
mod tests {
    use super::super::least_scored;
    use super::*;

    #[test]
    fn least_utilized_wins_ties_spread() {
        let busy = |r| PodMetrics {
            busy_ratio: r,
            ..Default::default()
        };
        let scores: Vec<_> = [busy(0.2), busy(0.2), busy(0.6)]
            .iter()
            .map(score)
            .collect();
        let mut rng = fastrand::Rng::with_seed(4);
        let mut seen = [0u32; 3];
        for _ in 0..300 {
            seen[least_scored(&scores, &mut rng).unwrap()] += 1;
        }
        assert_eq!(seen[2], 0);
        assert!(seen[0] > 100 && seen[1] > 100, "{seen:?}");
    }
}
