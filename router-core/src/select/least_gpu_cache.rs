//! `least-gpu-cache` (AIBrix v0.7.0 `least_gpu_cache.go`): the pod with the least GPU KV-cache
//! usage, ties uniformly at random; pods without the metric are skipped, and with none having
//! it the choice is uniform over all ([`super::least_scored`] and the router's fallback).
//!
//! AIBrix reads `gpu_cache_usage_perc` (vLLM's `vllm:gpu_cache_usage_perc`, which vLLM V1
//! renamed `vllm:kv_cache_usage_perc`); kvroute reads [`crate::EngineSnapshot::kv_usage`],
//! scraped from either name.

use super::PodMetrics;

/// The pod's score: its KV-cache usage, if a fresh snapshot has it.
pub(crate) fn score(m: &PodMetrics) -> Option<f64> {
    m.engine?.kv_usage
}

#[cfg(test)]
mod tests {
    use super::super::{least_scored, tests::engine};
    use super::*;

    #[test]
    fn least_usage_wins_and_missing_metrics_are_skipped() {
        let pods = [
            engine(|s| s.kv_usage = Some(0.7)),
            PodMetrics::default(),
            engine(|s| s.kv_usage = Some(0.2)),
            engine(|s| s.kv_usage = None),
        ];
        let scores: Vec<_> = pods.iter().map(score).collect();
        assert_eq!(scores, [Some(0.7), None, Some(0.2), None]);
        let mut rng = fastrand::Rng::with_seed(1);
        assert_eq!(least_scored(&scores, &mut rng), Some(2));
        assert_eq!(least_scored(&[None, None], &mut rng), None);
    }
}
