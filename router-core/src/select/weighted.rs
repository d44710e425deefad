//! Weighted multi-strategy specs such as `prefix-cache:2,least-request` (AIBrix v0.7.0
//! `router.go`).
//!
//! Each strategy scores every candidate ([`Inputs::scores`]): prefix-cache by match % (higher
//! is better), least-request by in-flight count, least-ttft by its cost (predicted TTFT plus
//! the stall charge), the AIBrix metric strategies by their metric (lower is better),
//! session-affinity 1 for the pod the session names and 0 for the others (higher is better),
//! and random by a uniform draw (kvroute's choice: AIBrix's random scores nothing and cannot
//! be weighted). As in AIBrix, scores are min-max normalised to `[0, 1]` over the candidates
//! that have a finite one (all equal → 1), a candidate without one gets 0, the totals are
//! `Σ norm × weight / Σ weight`, and the highest total wins with a 1e-9 tolerance; ties go to
//! the first candidate in a shuffled order. As in AIBrix there is no imbalance guard in this
//! mode.

use super::{higher_is_better, Inputs};
use crate::strategy::StrategySpec;

/// The index of the winning candidate. `inputs.cands` must not be empty; `scores`, `totals`
/// and `order` are scratch space.
pub(crate) fn weighted(
    inputs: &Inputs<'_>,
    spec: &StrategySpec,
    rng: &mut fastrand::Rng,
    scores: &mut Vec<Option<f64>>,
    totals: &mut Vec<f64>,
    order: &mut Vec<usize>,
) -> usize {
    let n = inputs.cands.len();
    totals.clear();
    totals.resize(n, 0.0);
    let weight_sum: f64 = spec.entries().iter().map(|(_, w)| f64::from(*w)).sum();
    for &(strategy, weight) in spec.entries() {
        let share = f64::from(weight) / weight_sum;
        inputs.scores(strategy, rng, scores);
        let finite = |s: &Option<f64>| s.filter(|v| v.is_finite());
        let min = scores
            .iter()
            .filter_map(finite)
            .fold(f64::INFINITY, f64::min);
        let max = scores
            .iter()
            .filter_map(finite)
            .fold(f64::NEG_INFINITY, f64::max);
        for (total, s) in totals.iter_mut().zip(scores.iter()) {
            let norm = match finite(s) {
                None => 0.0,
                Some(_) if max - min <= 0.0 => 1.0,
                Some(v) if higher_is_better(strategy) => (v - min) / (max - min),
                Some(v) => (max - v) / (max - min),
            };
            *total += norm * share;
        }
    }
    order.clear();
    order.extend(0..n);
    rng.shuffle(order);
    let best = totals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    order
        .iter()
        .copied()
        .find(|&i| totals[i] >= best - 1e-9)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::super::{tests::engine, Candidate, PodMetrics};
    use super::*;
    use crate::ids::PodId;

    fn run(cands: &[Candidate], spec: &str, total: u32, seed: u64) -> usize {
        let ttft = vec![0.0; cands.len()];
        let inputs = Inputs {
            cands,
            total_blocks: total,
            cost_ms: &ttft,
            metrics: &[],
            session: None,
        };
        run_with(&inputs, spec, seed)
    }

    fn run_with(inputs: &Inputs<'_>, spec: &str, seed: u64) -> usize {
        let spec = StrategySpec::parse(spec).unwrap();
        weighted(
            inputs,
            &spec,
            &mut fastrand::Rng::with_seed(seed),
            &mut Vec::new(),
            &mut Vec::new(),
            &mut Vec::new(),
        )
    }

    #[test]
    fn weights_trade_match_against_load() {
        let c = |pod, load, matched| Candidate {
            pod: PodId(pod),
            load,
            matched,
        };
        // Pod 0: full match, load 10. Pod 1: no match, load 0.
        let cands = [c(0, 10, 10), c(1, 0, 0)];
        // prefix 2 vs least 1: pod 0 scores 2/3, pod 1 scores 1/3.
        assert_eq!(run(&cands, "prefix-cache:2,least-request", 10, 0), 0);
        // prefix 1 vs least 2: pod 1 wins.
        assert_eq!(run(&cands, "prefix-cache,least-request:2", 10, 0), 1);
    }

    #[test]
    fn exact_ties_spread() {
        let c = |pod| Candidate {
            pod: PodId(pod),
            load: 1,
            matched: 0,
        };
        let cands = [c(0), c(1)];
        let mut seen = [0; 2];
        for seed in 0..200 {
            seen[run(&cands, "prefix-cache,least-request", 4, seed)] += 1;
        }
        assert!(seen[0] > 50 && seen[1] > 50, "{seen:?}");
    }

    fn idle(n: u32) -> Vec<Candidate> {
        (0..n)
            .map(|i| Candidate {
                pod: PodId(i),
                load: 0,
                matched: 0,
            })
            .collect()
    }

    #[test]
    fn unscored_pods_get_zero() {
        // Pod 0 has no KV usage: it scores 0 under least-kv-cache, the others 1 and 0.
        let cands = idle(3);
        let metrics = [
            PodMetrics::default(),
            engine(|s| s.kv_usage = Some(0.1)),
            engine(|s| s.kv_usage = Some(0.9)),
        ];
        let inputs = Inputs {
            cands: &cands,
            total_blocks: 0,
            cost_ms: &[],
            metrics: &metrics,
            session: None,
        };
        for seed in 0..20 {
            assert_eq!(run_with(&inputs, "least-kv-cache,least-request", seed), 1);
        }
        // No pod scored: every pod gets 0 from it, and least-request (all equal) decides
        // nothing either: ties spread.
        let none = [PodMetrics::default(); 3];
        let inputs = Inputs {
            metrics: &none,
            ..inputs
        };
        let mut seen = [0; 3];
        for seed in 0..300 {
            seen[run_with(&inputs, "least-gpu-cache:5,least-request", seed)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 60), "{seen:?}");
    }

    #[test]
    fn the_session_weighs_against_load() {
        let mut cands = idle(3);
        cands[2].load = 8;
        let inputs = Inputs {
            cands: &cands,
            total_blocks: 0,
            cost_ms: &[],
            metrics: &[],
            session: Some(2),
        };
        // session 1·2/3 + least-request 0·1/3 = 0.67 beats 0 + 1/3.
        assert_eq!(run_with(&inputs, "session-affinity:2,least-request", 1), 2);
        assert_ne!(run_with(&inputs, "session-affinity,least-request:2", 1), 2);
        // No session: every pod scores 0 under session-affinity, so all get 1.
        let inputs = Inputs {
            session: None,
            ..inputs
        };
        assert_ne!(run_with(&inputs, "session-affinity:9,least-request", 1), 2);
    }
}
