//! `least-kv-cache` (AIBrix v0.7.0 `least_kv_cache.go`): the pod with the least GPU plus CPU
//! KV-cache usage. AIBrix breaks ties to the last pod of its shuffled list, so uniformly at
//! random; pods without the metric are skipped, and with none having it the choice is uniform
//! over all.
//!
//! AIBrix reads `kv_cache_usage_perc` (`vllm:kv_cache_usage_perc`, vLLM V1) and
//! `cpu_cache_usage_perc` (`vllm:cpu_cache_usage_perc`, vLLM V0 only) and skips a pod missing
//! either: no vLLM exports both, so AIBrix always fell back to random on vLLM. kvroute reads
//! the first from [`crate::EngineSnapshot::kv_usage`] and takes the CPU part as 0 (no CPU KV
//! tier reported, as on vLLM V1), so it ranks as `least-gpu-cache` does.

use super::PodMetrics;

/// The CPU KV-cache usage kvroute assumes: vLLM V1 reports none.
const CPU_KV_USAGE: f64 = 0.0;

/// The pod's score: GPU plus CPU KV-cache usage, if a fresh snapshot has the GPU part.
pub(crate) fn score(m: &PodMetrics) -> Option<f64> {
    m.engine?.kv_usage.map(|gpu| gpu + CPU_KV_USAGE)
}

#[cfg(test)]
mod tests {
    use super::super::{least_scored, tests::engine};
    use super::*;

    #[test]
    fn least_usage_wins_and_ties_spread() {
        let pods = [
            engine(|s| s.kv_usage = Some(0.4)),
            engine(|s| s.kv_usage = Some(0.1)),
            PodMetrics::default(),
            engine(|s| s.kv_usage = Some(0.1)),
        ];
        let scores: Vec<_> = pods.iter().map(score).collect();
        let mut rng = fastrand::Rng::with_seed(2);
        let mut seen = [0u32; 4];
        for _ in 0..400 {
            seen[least_scored(&scores, &mut rng).unwrap()] += 1;
        }
        assert_eq!(seen[0] + seen[2], 0, "{seen:?}");
        assert!(seen[1] > 150 && seen[3] > 150, "{seen:?}");
    }
}
