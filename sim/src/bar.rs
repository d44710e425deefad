//! The bar a strategy must clear to replace the study's three (issue 6): in every phase, a
//! within-SLO count at least the best of random, least-request and prefix-cache, a TTFT P95 at
//! most 1.1× the best of them, and a token hit rate at least least-request's (within 0.1 point:
//! warm phases hit 93.3% whatever the strategy). [`compare`] simulates a candidate and the three
//! on every phase of a [`StudyConfig`]; [`BarRow::misses`] says where it falls short.

use std::fmt;

use kvroute_core::StrategySpec;

use crate::cluster::SimError;
use crate::study::{label, phases, run_phase, PhaseResult, StudyConfig, STUDY_STRATEGIES};

/// How strict the bar is. [`Bar::default`] is issue 6's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bar {
    /// Requests within SLO the candidate may have fewer than the best baseline.
    pub slo_slack: usize,
    /// The most the candidate's TTFT P95 may be, as a multiple of the best baseline's.
    pub ttft_ratio: f64,
    /// Percentage points of token hits the candidate may be below least-request's.
    pub hit_slack_points: f64,
}

impl Default for Bar {
    fn default() -> Self {
        Bar {
            slo_slack: 0,
            ttft_ratio: 1.1,
            hit_slack_points: 0.1,
        }
    }
}

/// One phase: the candidate's numbers beside the best of the baselines'.
#[derive(Clone, Debug, PartialEq)]
pub struct BarRow {
    /// `scenario / round`, as in the study table.
    pub label: String,
    /// The candidate's requests within SLO.
    pub slo: usize,
    /// The most requests within SLO of any baseline.
    pub best_slo: usize,
    /// The candidate's TTFT P95, s (infinite when no request succeeded).
    pub ttft_p95_s: f64,
    /// The lowest TTFT P95 of any baseline, s.
    pub best_ttft_p95_s: f64,
    /// The candidate's token hit rate, %.
    pub hit_percent: f64,
    /// least-request's token hit rate, %.
    pub least_request_hit_percent: f64,
}

/// Where a phase falls short of the bar.
#[derive(Clone, Debug, PartialEq)]
pub enum Miss {
    /// Fewer requests within SLO than the best baseline (less the slack).
    Slo {
        /// The candidate's count.
        slo: usize,
        /// The best baseline's.
        best: usize,
    },
    /// A TTFT P95 above the allowed multiple of the best baseline's.
    TtftP95 {
        /// The candidate's, s.
        p95_s: f64,
        /// The best baseline's, s.
        best_s: f64,
        /// The allowed multiple.
        ratio: f64,
    },
    /// Fewer token hits than least-request (less the slack).
    Hits {
        /// The candidate's, %.
        percent: f64,
        /// least-request's, %.
        least_request: f64,
    },
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Miss::Slo { slo, best } => write!(f, "{slo} within SLO < {best}"),
            Miss::TtftP95 {
                p95_s,
                best_s,
                ratio,
            } => write!(f, "TTFT P95 {p95_s:.3} s > {ratio} × {best_s:.3} s"),
            Miss::Hits {
                percent,
                least_request,
            } => write!(
                f,
                "hits {percent:.1}% < least-request's {least_request:.1}%"
            ),
        }
    }
}

impl BarRow {
    /// Where this phase falls short of `bar` (empty if it clears it).
    pub fn misses(&self, bar: &Bar) -> Vec<Miss> {
        let mut out = Vec::new();
        if self.slo + bar.slo_slack < self.best_slo {
            out.push(Miss::Slo {
                slo: self.slo,
                best: self.best_slo,
            });
        }
        if self.ttft_p95_s > bar.ttft_ratio * self.best_ttft_p95_s {
            out.push(Miss::TtftP95 {
                p95_s: self.ttft_p95_s,
                best_s: self.best_ttft_p95_s,
                ratio: bar.ttft_ratio,
            });
        }
        if self.hit_percent < self.least_request_hit_percent - bar.hit_slack_points {
            out.push(Miss::Hits {
                percent: self.hit_percent,
                least_request: self.least_request_hit_percent,
            });
        }
        out
    }
}

/// Simulates `candidate` and the study's three strategies on every phase `cfg` selects (its
/// rounds and scenarios; its `strategies` are ignored) and returns a row per phase, round by
/// round.
pub fn compare(cfg: &StudyConfig, candidate: &StrategySpec) -> Result<Vec<BarRow>, SimError> {
    let ttft = |p: &PhaseResult| p.summary.ttft_p95_s.unwrap_or(f64::INFINITY);
    let hit = |p: &PhaseResult| p.summary.token_hit.unwrap_or(0.0) * 100.0;
    let mut rows = Vec::new();
    for (round, scenario) in phases(cfg) {
        let ours = run_phase(cfg, scenario, round, candidate)?;
        let base = STUDY_STRATEGIES
            .iter()
            .map(|s| run_phase(cfg, scenario, round, &StrategySpec::single(*s)))
            .collect::<Result<Vec<_>, _>>()?;
        rows.push(BarRow {
            label: label(scenario, round),
            slo: ours.summary.within_slo,
            best_slo: base.iter().map(|p| p.summary.within_slo).max().unwrap_or(0),
            ttft_p95_s: ttft(&ours),
            best_ttft_p95_s: base.iter().map(ttft).fold(f64::INFINITY, f64::min),
            hit_percent: hit(&ours),
            // STUDY_STRATEGIES is random, least-request, prefix-cache.
            least_request_hit_percent: hit(&base[1]),
        });
    }
    Ok(rows)
}

/// The rows as a Markdown table, one line per phase, with its draw's label (`variant`, or
/// `variant/order`) and the misses.
pub fn table(candidate: &StrategySpec, rows: &[(String, BarRow)], bar: &Bar) -> String {
    let mut out = format!(
        "| draw | phase | {candidate} within SLO | best other | TTFT P95 s | best other | hits | least-request | misses |\n\
         |---|---|---|---|---|---|---|---|---|\n"
    );
    for (draw, r) in rows {
        let misses: Vec<String> = r.misses(bar).iter().map(Miss::to_string).collect();
        out.push_str(&format!(
            "| {draw} | {} | {} | {} | {:.3} | {:.3} | {:.1}% | {:.1}% | {} |\n",
            r.label,
            r.slo,
            r.best_slo,
            r.ttft_p95_s,
            r.best_ttft_p95_s,
            r.hit_percent,
            r.least_request_hit_percent,
            if misses.is_empty() {
                "-".to_string()
            } else {
                misses.join("; ")
            }
        ));
    }
    out
}

/// One phase's numbers averaged over draws (see [`means`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseMeans {
    /// `scenario / round`.
    pub label: String,
    /// Draws averaged.
    pub draws: usize,
    /// Mean requests within SLO: the candidate's, and the best baseline's of each draw.
    pub slo: f64,
    /// See `slo`.
    pub best_slo: f64,
    /// Mean TTFT P95, s: the candidate's, and the best baseline's of each draw.
    pub ttft_p95_s: f64,
    /// See `ttft_p95_s`.
    pub best_ttft_p95_s: f64,
    /// Mean token hit rates, %: the candidate's and least-request's.
    pub hit_percent: f64,
    /// See `hit_percent`.
    pub least_request_hit_percent: f64,
    /// Draws in which the phase clears the bar.
    pub cleared: usize,
}

/// Per phase over every draw of `rows`, in first-seen phase order: the means and the draws that
/// clear `bar`. One draw is noise in a phase as sensitive as cold / 1; the means say whether the
/// ordering holds.
pub fn means(rows: &[(String, BarRow)], bar: &Bar) -> Vec<PhaseMeans> {
    let mut labels: Vec<&str> = Vec::new();
    for (_, r) in rows {
        if !labels.contains(&r.label.as_str()) {
            labels.push(&r.label);
        }
    }
    labels
        .into_iter()
        .map(|label| {
            let phase: Vec<&BarRow> = rows
                .iter()
                .map(|(_, r)| r)
                .filter(|r| r.label == label)
                .collect();
            let n = phase.len() as f64;
            let mean = |f: fn(&BarRow) -> f64| phase.iter().map(|r| f(r)).sum::<f64>() / n;
            PhaseMeans {
                label: label.to_string(),
                draws: phase.len(),
                slo: mean(|r| r.slo as f64),
                best_slo: mean(|r| r.best_slo as f64),
                ttft_p95_s: mean(|r| r.ttft_p95_s),
                best_ttft_p95_s: mean(|r| r.best_ttft_p95_s),
                hit_percent: mean(|r| r.hit_percent),
                least_request_hit_percent: mean(|r| r.least_request_hit_percent),
                cleared: phase.iter().filter(|r| r.misses(bar).is_empty()).count(),
            }
        })
        .collect()
}

/// [`means`] as a Markdown table.
pub fn summary(candidate: &StrategySpec, rows: &[(String, BarRow)], bar: &Bar) -> String {
    let mut out = format!(
        "| phase | draws | {candidate} mean within SLO | best other | mean TTFT P95 s | best other | mean hits | least-request | draws clearing the bar |\n\
         |---|---|---|---|---|---|---|---|---|\n"
    );
    for m in means(rows, bar) {
        out.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.3} | {:.3} | {:.1}% | {:.1}% | {} |\n",
            m.label,
            m.draws,
            m.slo,
            m.best_slo,
            m.ttft_p95_s,
            m.best_ttft_p95_s,
            m.hit_percent,
            m.least_request_hit_percent,
            m.cleared,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> BarRow {
        BarRow {
            label: "cold / 1".into(),
            slo: 89,
            best_slo: 89,
            ttft_p95_s: 2.2,
            best_ttft_p95_s: 2.0,
            hit_percent: 83.6,
            least_request_hit_percent: 77.7,
        }
    }

    #[test]
    fn the_summary_averages_each_phase_over_its_draws() {
        let worse = BarRow {
            slo: 85,
            ttft_p95_s: 3.0,
            ..row()
        };
        let rows = vec![("0".to_string(), row()), ("1".to_string(), worse)];
        let spec = StrategySpec::single(kvroute_core::Strategy::LeastTtft);
        let text = summary(&spec, &rows, &Bar::default());
        assert!(
            text.contains("| cold / 1 | 2 | 87.0 | 89.0 | 2.600 | 2.000 | 83.6% | 77.7% | 1 |"),
            "{text}"
        );
    }

    #[test]
    fn a_row_at_the_limits_clears_the_bar() {
        assert!(row().misses(&Bar::default()).is_empty());
        let warm = BarRow {
            hit_percent: 93.25,
            least_request_hit_percent: 93.3,
            ..row()
        };
        assert!(warm.misses(&Bar::default()).is_empty(), "0.05 points");
    }

    #[test]
    fn each_criterion_misses_on_its_own() {
        let bar = Bar::default();
        let fewer = BarRow { slo: 88, ..row() };
        assert_eq!(fewer.misses(&bar), vec![Miss::Slo { slo: 88, best: 89 }]);
        assert!(fewer
            .misses(&Bar {
                slo_slack: 1,
                ..bar
            })
            .is_empty());
        let slow = BarRow {
            ttft_p95_s: 2.21,
            ..row()
        };
        assert_eq!(slow.misses(&bar).len(), 1);
        assert_eq!(
            slow.misses(&bar)[0].to_string(),
            "TTFT P95 2.210 s > 1.1 × 2.000 s"
        );
        let cold = BarRow {
            hit_percent: 77.5,
            ..row()
        };
        assert!(matches!(cold.misses(&bar)[..], [Miss::Hits { .. }]));
        let failed = BarRow {
            ttft_p95_s: f64::INFINITY,
            ..row()
        };
        assert_eq!(failed.misses(&bar).len(), 1, "no P95 at all is a miss");
    }
}
