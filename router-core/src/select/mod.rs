//! Selection strategies. Each is a pure function of the candidates (the model's ready pods with
//! their loads and prefix matches), what it reads of them ([`Inputs`]), its parameters and the
//! seeded PRNG; the router commits the choice. One module per strategy; the AIBrix metric
//! strategies score every candidate ([`Inputs::scores`]) and the least score wins
//! ([`least_scored`]).

mod least_busy_time;
mod least_gpu_cache;
mod least_kv_cache;
mod least_latency;
mod least_request;
mod least_ttft;
mod least_utilization;
mod power_of_two;
mod prefix_cache;
mod random;
pub(crate) mod session_affinity;
mod throughput;
mod weighted;

pub(crate) use least_request::least_loaded;
pub(crate) use least_ttft::{explore, least_ttft};
pub(crate) use power_of_two::power_of_two;
pub(crate) use prefix_cache::{prefix_cache, PrefixCacheParams};
pub(crate) use random::random;
pub(crate) use weighted::weighted;

use crate::ids::PodId;
use crate::strategy::Strategy;
use crate::ttft::EngineSnapshot;

/// One ready pod as the strategies see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) pod: PodId,
    /// In-flight requests routed to it.
    pub(crate) load: u32,
    /// Leading prompt blocks it holds.
    pub(crate) matched: u32,
}

/// What the AIBrix metric strategies read of one candidate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct PodMetrics {
    /// Its engine's latest snapshot, if fresh (`ttft.snapshot_max_age_ms`).
    pub(crate) engine: Option<EngineSnapshot>,
    /// The share of the last minute it had requests from this router in flight.
    pub(crate) busy_ratio: f64,
}

/// Whether a strategy reads [`PodMetrics`].
pub(crate) const fn reads_metrics(s: Strategy) -> bool {
    matches!(
        s,
        Strategy::LeastKvCache
            | Strategy::LeastGpuCache
            | Strategy::LeastBusyTime
            | Strategy::LeastLatency
            | Strategy::Throughput
            | Strategy::LeastUtilization
    )
}

/// Whether a higher score is better under `s` in a weighted spec (AIBrix's polarity "most").
pub(crate) const fn higher_is_better(s: Strategy) -> bool {
    matches!(
        s,
        Strategy::PrefixCache | Strategy::Random | Strategy::SessionAffinity
    )
}

/// What the strategies read of the candidates, parallel to `cands`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Inputs<'a> {
    pub(crate) cands: &'a [Candidate],
    /// Complete blocks in the prompt.
    pub(crate) total_blocks: u32,
    /// least-ttft's costs (empty unless the spec has least-ttft).
    pub(crate) cost_ms: &'a [f64],
    /// The metric strategies' inputs (empty unless the spec has one).
    pub(crate) metrics: &'a [PodMetrics],
    /// The candidate the request's session id names, if any.
    pub(crate) session: Option<usize>,
}

impl Inputs<'_> {
    /// Every candidate's raw score under `strategy` into `out`, `None` for a candidate it cannot
    /// score (AIBrix's unscored pod: its metric is missing). `power-of-two` scores nothing
    /// (it compares two pods only; specs never weight it).
    pub(crate) fn scores(
        &self,
        strategy: Strategy,
        rng: &mut fastrand::Rng,
        out: &mut Vec<Option<f64>>,
    ) {
        out.clear();
        let n = self.cands.len();
        let metric = |f: fn(&PodMetrics) -> Option<f64>| self.metrics.iter().map(f);
        match strategy {
            Strategy::PrefixCache => out.extend(
                self.cands
                    .iter()
                    .map(|c| Some(f64::from(match_percent(c.matched, self.total_blocks)))),
            ),
            Strategy::LeastRequest => {
                out.extend(self.cands.iter().map(|c| Some(f64::from(c.load))))
            }
            Strategy::Random => out.extend((0..n).map(|_| Some(rng.f64()))),
            Strategy::LeastTtft => out.extend(self.cost_ms.iter().map(|&c| Some(c))),
            Strategy::SessionAffinity => {
                out.extend((0..n).map(|i| Some(if self.session == Some(i) { 1.0 } else { 0.0 })))
            }
            Strategy::PowerOfTwo => out.extend((0..n).map(|_| None)),
            Strategy::LeastKvCache => out.extend(metric(least_kv_cache::score)),
            Strategy::LeastGpuCache => out.extend(metric(least_gpu_cache::score)),
            Strategy::LeastBusyTime => out.extend(metric(least_busy_time::score)),
            Strategy::LeastUtilization => out.extend(metric(least_utilization::score)),
            Strategy::Throughput => out.extend(metric(throughput::score)),
            Strategy::LeastLatency => least_latency::scores_of(self.metrics, out),
        }
        // Inputs missing for some candidates (a caller's slip): those are unscored.
        out.resize(n, None);
    }
}

/// The index of a candidate with the least score, uniform among ties. Scores that are missing
/// or not finite never win (AIBrix compares with `<`, `<=` or `==` against a running minimum
/// that starts at the largest float). `None` when no score is finite: AIBrix then picks
/// uniformly at random among all pods, and so does the router.
pub(crate) fn least_scored(scores: &[Option<f64>], rng: &mut fastrand::Rng) -> Option<usize> {
    let finite = |s: &Option<f64>| s.filter(|v| v.is_finite());
    let min = scores
        .iter()
        .filter_map(finite)
        .fold(f64::INFINITY, f64::min);
    let ties = scores.iter().filter(|s| finite(s) == Some(min)).count();
    if ties == 0 {
        return None;
    }
    let nth = rng.usize(..ties);
    scores
        .iter()
        .enumerate()
        .filter(|(_, s)| finite(s) == Some(min))
        .nth(nth)
        .map(|(i, _)| i)
}

/// ⌊matched × 100 / total⌋, 0 for a prompt with no complete block (as AIBrix's
/// `seqSearchPrefix`).
pub(crate) fn match_percent(matched: u32, total: u32) -> u8 {
    if total == 0 {
        0
    } else {
        (u64::from(matched.min(total)) * 100 / u64::from(total)) as u8
    }
}

/// Mean and sample standard deviation (n − 1 denominator; 0 with one value) of the loads.
pub(crate) fn mean_and_sample_stddev(cands: &[Candidate]) -> (f64, f64) {
    let n = cands.len() as f64;
    if cands.is_empty() {
        return (0.0, 0.0);
    }
    let mean = cands.iter().map(|c| f64::from(c.load)).sum::<f64>() / n;
    if cands.len() < 2 {
        return (mean, 0.0);
    }
    let var = cands
        .iter()
        .map(|c| (f64::from(c.load) - mean).powi(2))
        .sum::<f64>()
        / (n - 1.0);
    (mean, var.sqrt())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A candidate's metrics with a fresh snapshot set up by `f`.
    pub(crate) fn engine(f: impl FnOnce(&mut EngineSnapshot)) -> PodMetrics {
        let mut s = EngineSnapshot::default();
        f(&mut s);
        PodMetrics {
            engine: Some(s),
            busy_ratio: 0.0,
        }
    }

    #[test]
    fn least_scored_skips_missing_and_non_finite_scores() {
        let mut rng = fastrand::Rng::with_seed(9);
        let s = [
            None,
            Some(f64::INFINITY),
            Some(3.0),
            Some(f64::NAN),
            Some(-1.0),
        ];
        assert_eq!(least_scored(&s, &mut rng), Some(4));
        assert_eq!(least_scored(&[None, Some(f64::NAN)], &mut rng), None);
        assert_eq!(least_scored(&[], &mut rng), None);
    }

    #[test]
    fn percent_truncates() {
        assert_eq!(match_percent(5, 7), 71);
        assert_eq!(match_percent(7, 7), 100);
        assert_eq!(match_percent(1, 218), 0);
        assert_eq!(match_percent(0, 0), 0);
    }

    #[test]
    fn stddev_is_sample() {
        let c = |load| Candidate {
            pod: PodId(0),
            load,
            matched: 0,
        };
        let (m, s) = mean_and_sample_stddev(&[c(3), c(12), c(0)]);
        assert_eq!(m, 5.0);
        assert!((s - 39f64.sqrt()).abs() < 1e-12);
        assert_eq!(mean_and_sample_stddev(&[c(4)]), (4.0, 0.0));
    }
}
