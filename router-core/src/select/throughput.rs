//! `throughput` (AIBrix v0.7.0 `throughput.go`): the pod with the least
//! `2 × average prompt tokens + average generation tokens` per request it has served ("prompt
//! tokens cost twice as much"), ties uniformly at random; pods without the metrics are
//! skipped, and with none having them the choice is uniform over all.
//!
//! AIBrix reads `avg_prompt_toks_per_req` and `avg_generation_toks_per_req`, one-day averages
//! it queries from Prometheus (`vllm:request_prompt_tokens` and
//! `vllm:request_generation_tokens` histograms). Two quirks made it random in AIBrix v0.7.0:
//! it reads those query results as plain values, which are always 0 (every pod ties), and
//! without Prometheus every pod is skipped. Read as intended, a pod that served nothing in the
//! day scores not-a-number and is never chosen again. kvroute derives both averages from the
//! engine's cumulative counters in [`crate::EngineSnapshot`] (over the engine's life, not a
//! day): prompt tokens per request = `prefix_queries / prefills`, generation tokens per
//! request = `1 + inter_tokens / prefills` (every token after the first is one inter-token
//! gap), and a pod that has served nothing scores 0 (the fewest tokens served).

use super::PodMetrics;

/// The engine's average prompt and generation tokens per request so far, `(0, 0)` before its
/// first request; `None` without a fresh snapshot carrying the counters.
pub(crate) fn per_request_tokens(m: &PodMetrics) -> Option<(f64, f64)> {
    let s = m.engine?;
    let (prefills, queries, gaps) = (s.prefills?, s.prefix_queries?, s.inter_tokens?);
    if prefills == 0 {
        return Some((0.0, 0.0));
    }
    let n = prefills as f64;
    Some((queries as f64 / n, 1.0 + gaps as f64 / n))
}

/// The pod's score: `2 × prompt + generation` tokens per request.
pub(crate) fn score(m: &PodMetrics) -> Option<f64> {
    per_request_tokens(m).map(|(prompt, generation)| 2.0 * prompt + generation)
}

#[cfg(test)]
mod tests {
    use super::super::{least_scored, tests::engine};
    use super::*;

    fn served(prefills: u64, prompt_tokens: u64, gaps: u64) -> PodMetrics {
        engine(|s| {
            s.prefills = Some(prefills);
            s.prefix_queries = Some(prompt_tokens);
            s.inter_tokens = Some(gaps);
        })
    }

    #[test]
    fn weighs_prompt_tokens_twice() {
        // 10 requests: 1,000 prompt tokens and 90 gaps → 100 + 10 per request → 210.
        assert_eq!(score(&served(10, 1_000, 90)), Some(210.0));
        // A pod that served nothing has processed the fewest tokens.
        assert_eq!(score(&served(0, 0, 0)), Some(0.0));
        // Missing counters, or no fresh snapshot: skipped.
        assert_eq!(score(&engine(|s| s.prefills = Some(3))), None);
        assert_eq!(score(&PodMetrics::default()), None);
    }

    #[test]
    fn the_lightest_requests_win() {
        // AIBrix's test: scores 2·p + g of (10, 100), (20, 200), (30, 300) → the first.
        let pods = [served(1, 10, 99), served(1, 20, 199), served(1, 30, 299)];
        let scores: Vec<_> = pods.iter().map(score).collect();
        assert_eq!(scores, [Some(120.0), Some(240.0), Some(360.0)]);
        assert_eq!(
            least_scored(&scores, &mut fastrand::Rng::with_seed(5)),
            Some(0)
        );
    }
}
