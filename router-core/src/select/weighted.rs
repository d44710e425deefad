//! Weighted multi-strategy specs such as `prefix-cache:2,least-request` (spec §2.4).
//!
//! Each strategy scores every candidate: prefix-cache by match % (higher is better),
//! least-request by in-flight count and least-ttft by its cost (predicted TTFT plus the stall
//! charge; lower is better), and random by a uniform draw (kvroute's choice: AIBrix does not
//! document a score for random). Scores are min-max normalised to
//! `[0, 1]` (all equal → 1), combined as `Σ norm × weight / Σ weight`, and the highest total
//! wins with a 1e-9 tolerance; ties go to the first candidate in a shuffled order. As in AIBrix
//! there is no imbalance guard in this mode.

use super::{match_percent, Candidate};
use crate::strategy::{Strategy, StrategySpec};

/// The index of the winning candidate. `cands` must not be empty; `totals` and `order` are
/// scratch space.
pub(crate) fn weighted(
    cands: &[Candidate],
    spec: &StrategySpec,
    total_blocks: u32,
    cost_ms: &[f64],
    rng: &mut fastrand::Rng,
    totals: &mut Vec<f64>,
    order: &mut Vec<usize>,
) -> usize {
    totals.clear();
    totals.resize(cands.len(), 0.0);
    let weight_sum: f64 = spec.entries().iter().map(|(_, w)| f64::from(*w)).sum();
    for &(strategy, weight) in spec.entries() {
        let share = f64::from(weight) / weight_sum;
        let scores: Vec<f64> = match strategy {
            Strategy::PrefixCache => cands
                .iter()
                .map(|c| f64::from(match_percent(c.matched, total_blocks)))
                .collect(),
            Strategy::LeastRequest => cands.iter().map(|c| f64::from(c.load)).collect(),
            Strategy::Random => cands.iter().map(|_| rng.f64()).collect(),
            Strategy::LeastTtft => cost_ms.to_vec(),
        };
        let higher_is_better = matches!(strategy, Strategy::PrefixCache | Strategy::Random);
        let min = scores.iter().copied().fold(f64::INFINITY, f64::min);
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        for (total, s) in totals.iter_mut().zip(&scores) {
            let norm = if max - min <= 0.0 {
                1.0
            } else if higher_is_better {
                (s - min) / (max - min)
            } else {
                (max - s) / (max - min)
            };
            *total += norm * share;
        }
    }
    order.clear();
    order.extend(0..cands.len());
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
    use super::*;
    use crate::ids::PodId;

    fn run(cands: &[Candidate], spec: &str, total: u32, seed: u64) -> usize {
        let spec = StrategySpec::parse(spec).unwrap();
        let ttft = vec![0.0; cands.len()];
        weighted(
            cands,
            &spec,
            total,
            &ttft,
            &mut fastrand::Rng::with_seed(seed),
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
}
