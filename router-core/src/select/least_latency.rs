//! `least-latency` (AIBrix v0.7.0 `least_latency.go`): the pod with the least expected latency,
//!
//! ```text
//! latency_p = queue_p + prefill_p × guess_prompt / prompt_p + decode_p × guess_gen / gen_p
//! ```
//!
//! where `prefill_p` and `decode_p` are the pod's mean prefill and decode time per request,
//! `prompt_p` and `gen_p` its average prompt and generation tokens per request (each replaced
//! by the guess when not above 0), and the guesses are the averages of the candidates'
//! `prompt_p` and `gen_p` above 0 (10 and 100 when none is). AIBrix breaks ties to the last
//! pod of its shuffled list, so uniformly at random; pods without the metrics are skipped,
//! and with none having them the choice is uniform over all.
//!
//! What AIBrix reads and what kvroute reads instead (from [`crate::EngineSnapshot`], each
//! over the engine's life):
//! - `queue_p`: AIBrix reads the `vllm:request_queue_time_seconds` histogram as a plain value,
//!   which is always 0. kvroute takes the histogram's mean (`queue_seconds / queue_requests`),
//!   as the formula means (a quirk fixed), and 0 where the engine does not export it (AIBrix's
//!   value; the pod is not skipped).
//! - `prefill_p`: the mean of `vllm:request_prefill_time_seconds`, as in AIBrix
//!   (`prefill_seconds / prefills`).
//! - `decode_p`: the mean of `vllm:request_decode_time_seconds`, as in AIBrix
//!   (`decode_seconds / decode_requests`); where the engine does not export it,
//!   `inter_token_seconds / prefills` (a request's decode time is the sum of its inter-token
//!   gaps).
//! - `prompt_p`, `gen_p`: AIBrix reads one-day averages from Prometheus as plain values (always
//!   0, so the guesses 10 and 100 and the ratios 1); kvroute takes the means of the
//!   `vllm:request_prompt_tokens` and `vllm:request_generation_tokens` histograms, or derives
//!   them from the counters where those are missing, as `throughput` does.
//!
//! A mean over no request is 0, as a histogram's mean with no sample is in AIBrix. A pod
//! without the prefill histogram, or without both the decode histogram and the inter-token
//! counters, is skipped.

use super::throughput::{self, histogram_mean};
use super::PodMetrics;

/// AIBrix's guesses when no candidate has a positive average.
const DEFAULT_PROMPT_TOKENS: f64 = 10.0;
const DEFAULT_GENERATION_TOKENS: f64 = 100.0;

/// One pod's inputs, in AIBrix's terms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LatencyInputs {
    pub(crate) queue_s: f64,
    pub(crate) prefill_mean_s: f64,
    pub(crate) decode_mean_s: f64,
    pub(crate) prompt_tokens: f64,
    pub(crate) generation_tokens: f64,
}

/// What kvroute has of the pod's inputs (module docs); `None` (skipped) without a fresh
/// snapshot carrying the prefill histogram and either the decode histogram or the inter-token
/// counters.
pub(crate) fn inputs(m: &PodMetrics) -> Option<LatencyInputs> {
    let s = m.engine?;
    let prefill_mean_s = histogram_mean(s.prefill_seconds, s.prefills)?;
    let decode_mean_s = histogram_mean(s.decode_seconds, s.decode_requests)
        .or_else(|| histogram_mean(s.inter_token_seconds, s.prefills))?;
    let queue_s = histogram_mean(s.queue_seconds, s.queue_requests).unwrap_or(0.0);
    let (prompt_tokens, generation_tokens) = throughput::per_request_tokens(m).unwrap_or_default();
    Some(LatencyInputs {
        queue_s,
        prefill_mean_s,
        decode_mean_s,
        prompt_tokens,
        generation_tokens,
    })
}

/// Every candidate's expected latency (seconds), `None` where its inputs are missing. The
/// guesses average every candidate's token averages (`averages`, 0 where unknown), whether or
/// not its other inputs are there, as AIBrix does.
pub(crate) fn scores(
    inputs: &[Option<LatencyInputs>],
    averages: &[(f64, f64)],
    out: &mut Vec<Option<f64>>,
) {
    let guess = |f: fn(&(f64, f64)) -> f64, default: f64| {
        let (sum, n) = averages
            .iter()
            .map(f)
            .filter(|&v| v > 0.0)
            .fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
        if n > 0 {
            sum / f64::from(n)
        } else {
            default
        }
    };
    let guess_prompt = guess(|a| a.0, DEFAULT_PROMPT_TOKENS);
    let guess_gen = guess(|a| a.1, DEFAULT_GENERATION_TOKENS);
    let own = |v: f64, guess: f64| if v > 0.0 { v } else { guess };
    out.clear();
    out.extend(inputs.iter().map(|i| {
        i.map(|i| {
            i.queue_s
                + i.prefill_mean_s / own(i.prompt_tokens, guess_prompt) * guess_prompt
                + i.decode_mean_s / own(i.generation_tokens, guess_gen) * guess_gen
        })
    }));
}

/// [`scores`] from what kvroute has of the candidates.
pub(crate) fn scores_of(metrics: &[PodMetrics], out: &mut Vec<Option<f64>>) {
    let inputs: Vec<_> = metrics.iter().map(inputs).collect();
    let averages: Vec<_> = metrics
        .iter()
        .map(|m| throughput::per_request_tokens(m).unwrap_or_default())
        .collect();
    scores(&inputs, &averages, out);
}

#[cfg(test)]
mod tests {
    use super::super::{least_scored, tests::engine};
    use super::*;
    use crate::EngineSnapshot;

    fn aibrix(queue_s: f64, prompt: f64, gen: f64, prefill: f64, decode: f64) -> LatencyInputs {
        LatencyInputs {
            queue_s,
            prefill_mean_s: prefill,
            decode_mean_s: decode,
            prompt_tokens: prompt,
            generation_tokens: gen,
        }
    }

    fn run(inputs: &[Option<LatencyInputs>]) -> Vec<Option<f64>> {
        let averages: Vec<_> = inputs
            .iter()
            .map(|i| i.map_or((0.0, 0.0), |i| (i.prompt_tokens, i.generation_tokens)))
            .collect();
        let mut out = Vec::new();
        scores(inputs, &averages, &mut out);
        out
    }

    #[test]
    fn aibrix_cases() {
        // "successful routing with least latency": guesses 25 and 250; p1 = 5 + 10/10·25 +
        // 10/100·250 = 55, the others more.
        let s = run(&[
            Some(aibrix(5.0, 10.0, 100.0, 10.0, 10.0)),
            Some(aibrix(5.0, 20.0, 200.0, 21.0, 21.0)),
            Some(aibrix(5.0, 30.0, 300.0, 31.0, 31.0)),
            Some(aibrix(5.0, 40.0, 400.0, 41.0, 41.0)),
        ]);
        assert_eq!(s[0], Some(55.0));
        assert_eq!(least_scored(&s, &mut fastrand::Rng::with_seed(1)), Some(0));
        // "multiple pods with same latency": p1 and p3 tie at 45.
        let s = run(&[
            Some(aibrix(5.0, 10.0, 100.0, 10.0, 10.0)),
            Some(aibrix(5.0, 20.0, 200.0, 21.0, 21.0)),
            Some(aibrix(5.0, 30.0, 300.0, 30.0, 30.0)),
        ]);
        assert_eq!((s[0], s[2]), (Some(45.0), Some(45.0)));
        assert!(s[1].unwrap() > 45.0);
        // Averages not above 0 take the guess; none above 0: 10 and 100.
        let s = run(&[
            Some(aibrix(0.0, 0.0, 0.0, 2.0, 3.0)),
            None,
            Some(aibrix(0.0, 20.0, 0.0, 4.0, 1.0)),
        ]);
        assert_eq!(s, [Some(5.0), None, Some(5.0)]);
    }

    #[test]
    fn guesses_count_pods_whose_other_inputs_are_missing() {
        // The first pod has no decode histogram (unscored) but its 51 generation tokens per
        // request still enter the guess: (51 + 1) / 2 = 26.
        let skipped = engine(|s| {
            s.prefills = Some(1);
            s.prefix_queries = Some(0);
            s.inter_tokens = Some(50);
            s.prefill_seconds = Some(0.0);
        });
        let short = engine(|s| {
            s.prefills = Some(2);
            s.prefix_queries = Some(0);
            s.inter_tokens = Some(0);
            s.prefill_seconds = Some(0.0);
            s.inter_token_seconds = Some(1.0);
        });
        let unknown = engine(|s| {
            s.prefills = Some(1);
            s.prefill_seconds = Some(0.0);
            s.inter_token_seconds = Some(1.0);
        });
        let mut out = Vec::new();
        scores_of(&[skipped, short, unknown], &mut out);
        // short: 0.5 s / 1 token × 26; unknown: 1 s, its average taken as the guess.
        assert_eq!(out, [None, Some(13.0), Some(1.0)]);
    }

    #[test]
    fn inputs_come_from_the_engine_counters() {
        let m = engine(|s| {
            s.prefills = Some(4);
            s.prefill_seconds = Some(2.0);
            s.inter_token_seconds = Some(6.0);
            s.inter_tokens = Some(396);
            s.prefix_queries = Some(400);
        });
        assert_eq!(
            inputs(&m),
            Some(aibrix(0.0, 100.0, 100.0, 0.5, 1.5)),
            "per request: 100 prompt tokens, 1 + 99 generated"
        );
        let fresh = engine(|s| {
            s.prefills = Some(0);
            s.prefill_seconds = Some(0.0);
            s.inter_token_seconds = Some(0.0);
        });
        assert_eq!(inputs(&fresh), Some(aibrix(0.0, 0.0, 0.0, 0.0, 0.0)));
        assert_eq!(inputs(&engine(|s| s.prefills = Some(1))), None);
        assert_eq!(inputs(&PodMetrics::default()), None);
    }

    #[test]
    fn the_histograms_come_first_and_the_queue_term_is_their_mean() {
        // Counters alone: prefill 0.5 s, decode 6 s / 4, 100 prompt and 100 generated tokens.
        let counters = |s: &mut EngineSnapshot| {
            s.prefills = Some(4);
            s.prefill_seconds = Some(2.0);
            s.inter_token_seconds = Some(6.0);
            s.inter_tokens = Some(396);
            s.prefix_queries = Some(400);
        };
        let histograms = |s: &mut EngineSnapshot| {
            s.queue_seconds = Some(1.5);
            s.queue_requests = Some(3);
            s.decode_seconds = Some(3.0);
            s.decode_requests = Some(3);
            s.request_prompt_tokens = Some(150);
            s.prompt_requests = Some(3);
            s.request_generation_tokens = Some(60);
            s.generation_requests = Some(3);
        };
        // Every histogram: queue 0.5 s, decode 1 s, 50 prompt and 20 generated tokens.
        let both = engine(|s| {
            counters(s);
            histograms(s);
        });
        assert_eq!(inputs(&both), Some(aibrix(0.5, 50.0, 20.0, 0.5, 1.0)));
        // Each missing histogram falls back on its own: queue to 0, decode to the inter-token
        // counters, the token averages to the counters'.
        let no_queue = engine(|s| {
            counters(s);
            histograms(s);
            s.queue_requests = None;
        });
        assert_eq!(inputs(&no_queue), Some(aibrix(0.0, 50.0, 20.0, 0.5, 1.0)));
        let no_decode = engine(|s| {
            counters(s);
            histograms(s);
            s.decode_seconds = None;
        });
        assert_eq!(inputs(&no_decode), Some(aibrix(0.5, 50.0, 20.0, 0.5, 1.5)));
        let no_tokens = engine(|s| {
            counters(s);
            histograms(s);
            s.request_prompt_tokens = None;
            s.generation_requests = None;
        });
        assert_eq!(
            inputs(&no_tokens),
            Some(aibrix(0.5, 100.0, 100.0, 0.5, 1.0))
        );
        // Histograms over no finished request: means of 0.
        let fresh = engine(|s| {
            counters(s);
            histograms(s);
            s.queue_requests = Some(0);
            s.decode_requests = Some(0);
        });
        assert_eq!(inputs(&fresh), Some(aibrix(0.0, 50.0, 20.0, 0.5, 0.0)));
        // The decode histogram stands in for the inter-token counters; the prefill one is
        // needed.
        let decode_only = engine(|s| {
            s.prefills = Some(4);
            s.prefill_seconds = Some(2.0);
            histograms(s);
        });
        assert_eq!(
            inputs(&decode_only),
            Some(aibrix(0.5, 50.0, 20.0, 0.5, 1.0))
        );
        let no_prefill = engine(|s| {
            histograms(s);
            s.prefills = Some(4);
        });
        assert_eq!(inputs(&no_prefill), None);
        // A queue behind one pod outweighs its faster decode.
        let mut out = Vec::new();
        let quick_but_queued = engine(|s| {
            counters(s);
            histograms(s);
            s.queue_seconds = Some(30.0);
        });
        scores_of(&[both, quick_but_queued], &mut out);
        assert!(out[0] < out[1], "{out:?}");
    }
}
