//! `prefix-cache`: AIBrix v0.7.0's procedure (`routeOriginal` in
//! `pkg/plugins/gateway/algorithms/prefix_cache.go`), step for step.
//!
//! 1. Imbalance guard: if `max − min > abs_count` over the ready pods' loads, only the
//!    least-loaded pods stay candidates (prefix matching still runs among them).
//! 2. The candidates that hold at least the first block are shuffled, then stably sorted by
//!    match % descending, then load ascending.
//! 3. The first with `load ≤ μ + k·σ` wins (`prefix_match`); μ and the sample σ are taken over
//!    *all* ready pods. With two pods and k ≥ 1 this can never exclude the busier one (the
//!    study's fact 4): σ = |a − b|/√2, so μ + σ ≥ max.
//! 4. Otherwise the least-loaded ready pod, ties at random (`prefix_match_skipped` if some pod
//!    matched, `least_request_fallback` if none did).

use super::least_request::least_loaded;
use super::{match_percent, mean_and_sample_stddev, Candidate};
use crate::decision::Reason;

/// The two knobs of prefix-cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct PrefixCacheParams {
    pub(crate) imbalance_abs_count: u32,
    pub(crate) stddev_factor: f64,
}

/// prefix-cache's choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PrefixCachePick {
    pub(crate) index: usize,
    pub(crate) reason: Reason,
    pub(crate) imbalance: bool,
}

/// Runs the procedure. `cands` must not be empty; `order` is scratch space.
pub(crate) fn prefix_cache(
    cands: &[Candidate],
    total_blocks: u32,
    params: PrefixCacheParams,
    rng: &mut fastrand::Rng,
    order: &mut Vec<usize>,
) -> PrefixCachePick {
    let min = cands.iter().map(|c| c.load).min().unwrap_or(0);
    let max = cands.iter().map(|c| c.load).max().unwrap_or(0);
    let imbalance = max - min > params.imbalance_abs_count;

    order.clear();
    order.extend(
        cands
            .iter()
            .enumerate()
            .filter(|(_, c)| c.matched > 0 && (!imbalance || c.load == min))
            .map(|(i, _)| i),
    );
    let any_match = !order.is_empty();
    if any_match {
        rng.shuffle(order);
        order.sort_by(|&a, &b| {
            let (a, b) = (&cands[a], &cands[b]);
            match_percent(b.matched, total_blocks)
                .cmp(&match_percent(a.matched, total_blocks))
                .then(a.load.cmp(&b.load))
        });
        let (mean, sd) = mean_and_sample_stddev(cands);
        let limit = mean + params.stddev_factor * sd;
        if let Some(&index) = order.iter().find(|&&i| f64::from(cands[i].load) <= limit) {
            return PrefixCachePick {
                index,
                reason: Reason::PrefixMatch,
                imbalance,
            };
        }
    }
    let reason = if any_match {
        Reason::PrefixMatchSkipped
    } else {
        Reason::LeastRequestFallback
    };
    PrefixCachePick {
        index: least_loaded(cands, rng),
        reason,
        imbalance,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PodId;

    const AIBRIX: PrefixCacheParams = PrefixCacheParams {
        imbalance_abs_count: 16,
        stddev_factor: 2.0,
    };

    fn c(pod: u32, load: u32, matched: u32) -> Candidate {
        Candidate {
            pod: PodId(pod),
            load,
            matched,
        }
    }

    fn pick(
        cands: &[Candidate],
        total: u32,
        params: PrefixCacheParams,
        seed: u64,
    ) -> PrefixCachePick {
        prefix_cache(
            cands,
            total,
            params,
            &mut fastrand::Rng::with_seed(seed),
            &mut Vec::new(),
        )
    }

    #[test]
    fn worked_example_of_spec_3_8() {
        // 1000-byte prompt → 7 blocks; A holds 0–4 (71%), B holds 0–6 (100%); loads 3, 12, 0.
        let cands = [c(0, 3, 5), c(1, 12, 7), c(2, 0, 0)];
        for seed in 0..50 {
            let p = pick(&cands, 7, AIBRIX, seed);
            assert_eq!(
                p,
                PrefixCachePick {
                    index: 1,
                    reason: Reason::PrefixMatch,
                    imbalance: false
                }
            );
        }
    }

    #[test]
    fn sigma_filter_skips_an_overloaded_best_match() {
        // Loads 30, 0, 0, 0, 0: μ = 6, σ = √180 ≈ 13.4, limit ≈ 32.8 with k = 2 passes; with k = 1
        // (19.4) the best match (load 30) is skipped for the next match.
        let cands = [c(0, 30, 4), c(1, 0, 2), c(2, 0, 0), c(3, 0, 0), c(4, 0, 0)];
        let k1 = PrefixCacheParams {
            imbalance_abs_count: 100,
            stddev_factor: 1.0,
        };
        assert_eq!(pick(&cands, 4, k1, 0).index, 1);
        assert_eq!(pick(&cands, 4, k1, 0).reason, Reason::PrefixMatch);
        let k2 = PrefixCacheParams {
            imbalance_abs_count: 100,
            stddev_factor: 2.0,
        };
        assert_eq!(pick(&cands, 4, k2, 0).index, 0);
    }

    #[test]
    fn only_match_over_the_limit_is_skipped() {
        let cands = [c(0, 30, 4), c(1, 0, 0), c(2, 0, 0), c(3, 0, 0), c(4, 0, 0)];
        let k1 = PrefixCacheParams {
            imbalance_abs_count: 100,
            stddev_factor: 1.0,
        };
        let p = pick(&cands, 4, k1, 3);
        assert_eq!(p.reason, Reason::PrefixMatchSkipped);
        assert_ne!(p.index, 0);
    }

    #[test]
    fn no_match_falls_back_to_least_request() {
        let cands = [c(0, 3, 0), c(1, 1, 0)];
        let p = pick(&cands, 7, AIBRIX, 0);
        assert_eq!(
            p,
            PrefixCachePick {
                index: 1,
                reason: Reason::LeastRequestFallback,
                imbalance: false
            }
        );
    }

    #[test]
    fn imbalance_is_strict_and_narrows_to_least_loaded() {
        // max − min = 16: not imbalanced, the full match on the busy pod wins.
        let at = [c(0, 16, 7), c(1, 0, 1)];
        assert_eq!(
            pick(&at, 7, AIBRIX, 0),
            PrefixCachePick {
                index: 0,
                reason: Reason::PrefixMatch,
                imbalance: false
            }
        );
        // 17: imbalanced; only the least-loaded pod stays a candidate and its match still counts.
        let over = [c(0, 17, 7), c(1, 0, 1)];
        assert_eq!(
            pick(&over, 7, AIBRIX, 0),
            PrefixCachePick {
                index: 1,
                reason: Reason::PrefixMatch,
                imbalance: true
            }
        );
        // Imbalanced and the least-loaded pod matches nothing: fallback among the least loaded.
        let none = [c(0, 17, 7), c(1, 0, 0)];
        assert_eq!(
            pick(&none, 7, AIBRIX, 0),
            PrefixCachePick {
                index: 1,
                reason: Reason::LeastRequestFallback,
                imbalance: true
            }
        );
    }

    #[test]
    fn two_pods_with_k2_never_exclude_the_busier_pod() {
        // The study's fact 4, exhaustively over loads below the guard.
        for busy in 0..=16u32 {
            for idle in 0..=busy {
                let cands = [c(0, busy, 3), c(1, idle, 0)];
                let p = pick(&cands, 3, AIBRIX, u64::from(busy * 31 + idle));
                assert_eq!(p.index, 0, "busy={busy} idle={idle}");
                assert_eq!(p.reason, Reason::PrefixMatch);
            }
        }
    }

    #[test]
    fn equal_matches_go_to_the_lower_load_and_ties_spread() {
        let cands = [c(0, 2, 7), c(1, 1, 7), c(2, 1, 7)];
        let mut seen = [0u32; 3];
        for seed in 0..400 {
            seen[pick(&cands, 7, AIBRIX, seed).index] += 1;
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1] > 120 && seen[2] > 120, "{seen:?}");
    }
}
