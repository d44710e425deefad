//! `least-ttft`: the pod with the lowest cost, its predicted time to first token plus the
//! stall its prefill imposes on the pod's running decodes (model in [`crate::TtftConfig`]).
//! Costs within `tie_ms` of the best tie; ties go to the pod expected to reuse the most engine
//! blocks (the index's match corrected by what the model learned of the engine's cache,
//! rounded to whole blocks), then the lower load, then the seeded PRNG. [`explore`] may then
//! send the request to a pod not yet probed instead.

use super::Candidate;
use crate::ttft::Estimate;

/// The index of the winner and of the lowest-cost other candidate (if any). `cands`, `cost_ms`
/// and `reuse_blocks` are parallel and non-empty; `order` is scratch space. Costs that are not
/// numbers never win over numbers; if none is a number, every candidate ties.
pub(crate) fn least_ttft(
    cands: &[Candidate],
    cost_ms: &[f64],
    reuse_blocks: &[u32],
    tie_ms: f64,
    rng: &mut fastrand::Rng,
    order: &mut Vec<usize>,
) -> (usize, Option<usize>) {
    let best = cost_ms.iter().copied().fold(f64::INFINITY, f64::min);
    order.clear();
    order.extend((0..cands.len()).filter(|&i| cost_ms[i] <= best + tie_ms));
    if order.is_empty() {
        // No finite cost (a model gone wrong): every candidate ties.
        order.extend(0..cands.len());
    }
    let top_reuse = order.iter().map(|&i| reuse_blocks[i]).max().unwrap_or(0);
    order.retain(|&i| reuse_blocks[i] == top_reuse);
    let low_load = order.iter().map(|&i| cands[i].load).min().unwrap_or(0);
    order.retain(|&i| cands[i].load == low_load);
    let winner = order[rng.usize(..order.len())];
    let runner_up = (0..cands.len())
        .filter(|&i| i != winner)
        .min_by(|&a, &b| cost_ms[a].total_cmp(&cost_ms[b]));
    (winner, runner_up)
}

/// Exploration ([`crate::TtftConfig::explore_wait_ms`]): if the pick would wait at least
/// `wait_ms` (and `wait_ms` > 0), the cheapest candidate that would be its pod's probe and start
/// at once, if any. `estimates` and `cost_ms` are parallel to the candidates.
pub(crate) fn explore(
    pick: usize,
    estimates: &[Estimate],
    cost_ms: &[f64],
    wait_ms: f64,
) -> Option<usize> {
    let waits = estimates.get(pick)?.queue_ms;
    if wait_ms <= 0.0 || waits < wait_ms {
        return None;
    }
    (0..estimates.len())
        .filter(|&i| estimates[i].probe && estimates[i].queue_ms <= 0.0)
        .min_by(|&a, &b| cost_ms[a].total_cmp(&cost_ms[b]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PodId;

    fn c(pod: u32, load: u32) -> Candidate {
        Candidate {
            pod: PodId(pod),
            load,
            matched: 0,
        }
    }

    #[test]
    fn minimum_wins_and_names_the_runner_up() {
        let cands = [c(0, 0), c(1, 5), c(2, 1)];
        let (w, r) = least_ttft(
            &cands,
            &[900.0, 150.0, 400.0],
            &[0, 9, 0],
            1.0,
            &mut fastrand::Rng::with_seed(1),
            &mut Vec::new(),
        );
        assert_eq!((w, r), (1, Some(2)));
    }

    #[test]
    fn ties_prefer_reuse_then_load_then_random() {
        let cands = [c(0, 3), c(1, 1), c(2, 0), c(3, 1)];
        let ttft = [100.0, 100.4, 100.0, 100.9];
        let reuse = [2, 2, 1, 2];
        let mut seen = [0; 4];
        let mut rng = fastrand::Rng::with_seed(2);
        for _ in 0..200 {
            seen[least_ttft(&cands, &ttft, &reuse, 1.0, &mut rng, &mut Vec::new()).0] += 1;
        }
        assert_eq!(seen[0] + seen[2], 0, "{seen:?}");
        assert!(seen[1] > 50 && seen[3] > 50, "{seen:?}");
    }

    fn est(queue_ms: f64, probe: bool) -> Estimate {
        Estimate {
            ttft_ms: 0.0,
            stall_ms: 0.0,
            queue_ms,
            cached_tokens: 0.0,
            indexed_tokens: 0.0,
            uncached_tokens: 0.0,
            probe,
        }
    }

    #[test]
    fn a_long_wait_sends_the_request_to_a_pod_to_probe() {
        // The pick (0) would wait 600 ms; 1 and 2 would be probes, 2 is busy, 3 is known.
        let ests = [
            est(600.0, false),
            est(0.0, true),
            est(50.0, true),
            est(0.0, false),
        ];
        let costs = [900.0, 4_000.0, 1_000.0, 950.0];
        assert_eq!(
            explore(0, &ests, &costs, 500.0),
            Some(1),
            "whatever it costs"
        );
        assert_eq!(
            explore(0, &ests, &costs, 600.0),
            Some(1),
            "at the threshold"
        );
        assert_eq!(explore(0, &ests, &costs, 601.0), None, "a shorter wait");
        assert_eq!(explore(0, &ests, &costs, 0.0), None, "0 turns it off");
        let known = [est(600.0, false), est(0.0, false)];
        assert_eq!(
            explore(0, &known, &costs[..2], 500.0),
            None,
            "nothing to probe"
        );
        let cheaper = [est(600.0, false), est(0.0, true), est(0.0, true)];
        assert_eq!(
            explore(0, &cheaper, &[900.0, 4_000.0, 3_000.0], 500.0),
            Some(2)
        );
    }

    #[test]
    fn costs_that_are_not_numbers_do_not_panic() {
        let cands = [c(0, 2), c(1, 1)];
        let mut rng = fastrand::Rng::with_seed(3);
        let nan = f64::NAN;
        let pick = |costs: &[f64], rng: &mut fastrand::Rng| {
            least_ttft(&cands, costs, &[0, 0], 1.0, rng, &mut Vec::new()).0
        };
        assert_eq!(pick(&[nan, 5.0], &mut rng), 1);
        assert_eq!(pick(&[nan, nan], &mut rng), 1, "all tie: the lower load");
    }
}
