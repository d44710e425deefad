//! `least-busy-time` (AIBrix v0.7.0 `least_busy_time.go`): the pod with the least GPU busy-time
//! ratio. AIBrix keeps the first pod of its shuffled list on a tie (so uniformly at random);
//! a ratio that is not a number never wins.
//!
//! AIBrix reads a `gpu_busy_time_ratio` pod metric that nothing in AIBrix v0.7.0 collects (no
//! engine exports it; the code marks the read "todo: replace mock"), so every pod is skipped
//! and AIBrix always picks at random. kvroute measures the ratio it names: the share of the
//! last minute the pod had requests from this router in flight (`crate::busy`). Every pod has
//! one (0 for a pod never used), so there is no random fallback.

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
    fn least_busy_wins_and_nan_never_does() {
        let busy = |r| PodMetrics {
            busy_ratio: r,
            ..Default::default()
        };
        let scores: Vec<_> = [busy(0.9), busy(0.3), busy(f64::NAN), busy(0.5)]
            .iter()
            .map(score)
            .collect();
        let mut rng = fastrand::Rng::with_seed(3);
        assert_eq!(least_scored(&scores, &mut rng), Some(1));
        let nan_and_half = [Some(f64::NAN), Some(0.5)];
        assert_eq!(least_scored(&nan_and_half, &mut rng), Some(1));
    }
}
