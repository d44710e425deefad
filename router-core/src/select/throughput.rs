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
//! day scores not-a-number and is never chosen again. kvroute takes both averages from the
//! engine's cumulative counters in [`crate::EngineSnapshot`] (over the engine's life, not a
//! day), each on its own:
//! - prompt tokens per request: the mean of the engine's `vllm:request_prompt_tokens`
//!   histogram (`request_prompt_tokens / prompt_requests`), or where the engine does not export
//!   it, `prefix_queries / prefills` (every scheduled prompt is one prefix-cache query);
//! - generation tokens per request: the mean of `vllm:request_generation_tokens`
//!   (`request_generation_tokens / generation_requests`), or where not exported,
//!   `1 + inter_tokens / prefills` (every token after the first is one inter-token gap).
//!
//! A mean over no request is 0: a pod that has served nothing scores 0 (the fewest tokens
//! served).

use super::PodMetrics;

/// A histogram's mean, `sum / count` (0 over no sample), when both are known.
pub(crate) fn histogram_mean(sum: Option<f64>, count: Option<u64>) -> Option<f64> {
    let (sum, count) = (sum?, count?);
    Some(if count == 0 { 0.0 } else { sum / count as f64 })
}

/// The engine's average prompt and generation tokens per request so far (see the module docs;
/// 0 for an engine that has served nothing); `None` without a fresh snapshot, or when the
/// snapshot has neither the histogram nor the counters for one of the two.
pub(crate) fn per_request_tokens(m: &PodMetrics) -> Option<(f64, f64)> {
    let s = m.engine?;
    let tokens = |v: Option<u64>| v.map(|v| v as f64);
    let prompt = histogram_mean(tokens(s.request_prompt_tokens), s.prompt_requests)
        .or_else(|| histogram_mean(tokens(s.prefix_queries), s.prefills))?;
    let generation = histogram_mean(tokens(s.request_generation_tokens), s.generation_requests)
        .or_else(|| {
            let gaps = histogram_mean(tokens(s.inter_tokens), s.prefills)?;
            Some(if s.prefills == Some(0) {
                0.0
            } else {
                1.0 + gaps
            })
        })?;
    Some((prompt, generation))
}

/// The pod's score: `2 × prompt + generation` tokens per request.
pub(crate) fn score(m: &PodMetrics) -> Option<f64> {
    per_request_tokens(m).map(|(prompt, generation)| 2.0 * prompt + generation)
}

#[cfg(test)]
mod tests {
    use super::super::{least_scored, tests::engine};
    use super::*;
    use crate::EngineSnapshot;

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

    #[test]
    fn the_token_histograms_come_first_each_on_its_own() {
        // Counters: 100 prompt tokens and 1 + 9 generated per request (score 210).
        let with = |f: fn(&mut EngineSnapshot)| {
            engine(|s| {
                s.prefills = Some(10);
                s.prefix_queries = Some(1_000);
                s.inter_tokens = Some(90);
                f(s);
            })
        };
        assert_eq!(score(&with(|_| {})), Some(210.0));
        // Both histograms: 40 prompt and 30 generated tokens per finished request.
        let both = with(|s| {
            s.request_prompt_tokens = Some(320);
            s.prompt_requests = Some(8);
            s.request_generation_tokens = Some(240);
            s.generation_requests = Some(8);
        });
        assert_eq!(per_request_tokens(&both), Some((40.0, 30.0)));
        assert_eq!(score(&both), Some(110.0));
        // One histogram: the other average still comes from the counters.
        let prompt_only = with(|s| {
            s.request_prompt_tokens = Some(320);
            s.prompt_requests = Some(8);
        });
        assert_eq!(per_request_tokens(&prompt_only), Some((40.0, 10.0)));
        let generation_only = with(|s| {
            s.request_generation_tokens = Some(240);
            s.generation_requests = Some(8);
        });
        assert_eq!(per_request_tokens(&generation_only), Some((100.0, 30.0)));
        // A sum without its count is no histogram.
        let half = with(|s| s.request_prompt_tokens = Some(320));
        assert_eq!(per_request_tokens(&half), Some((100.0, 10.0)));
        // Histograms over no finished request: 0, even while the counters show prefills.
        let none_finished = with(|s| {
            s.request_prompt_tokens = Some(0);
            s.prompt_requests = Some(0);
            s.request_generation_tokens = Some(0);
            s.generation_requests = Some(0);
        });
        assert_eq!(score(&none_finished), Some(0.0));
        // The histograms alone are enough; one of them alone, without the counters, is not.
        let histograms_only = engine(|s| {
            s.request_prompt_tokens = Some(50);
            s.prompt_requests = Some(1);
            s.request_generation_tokens = Some(7);
            s.generation_requests = Some(1);
        });
        assert_eq!(score(&histograms_only), Some(107.0));
        let prompt_histogram_only = engine(|s| {
            s.request_prompt_tokens = Some(50);
            s.prompt_requests = Some(1);
        });
        assert_eq!(score(&prompt_histogram_only), None);
    }
}
