//! Selection strategies. Each is a pure function of the candidates (the model's ready pods with
//! their loads and prefix matches), its parameters and the seeded PRNG; the router commits the
//! choice.

mod least_request;
mod least_ttft;
mod prefix_cache;
mod random;
mod weighted;

pub(crate) use least_request::least_loaded;
pub(crate) use least_ttft::{explore, least_ttft};
pub(crate) use prefix_cache::{prefix_cache, PrefixCacheParams};
pub(crate) use random::random;
pub(crate) use weighted::weighted;

use crate::ids::PodId;

/// One ready pod as the strategies see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) pod: PodId,
    /// In-flight requests routed to it.
    pub(crate) load: u32,
    /// Leading prompt blocks it holds.
    pub(crate) matched: u32,
}

/// ⌊matched × 100 / total⌋, 0 for a prompt with no complete block (spec §3.6).
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
mod tests {
    use super::*;

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
