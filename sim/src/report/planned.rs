//! TTFT from the planned arrival next to TTFT from the send (`kvroute-sim run`): a client whose
//! in-flight cap is full sends a request late, and its TTFT from the send does not count the
//! wait; from the planned arrival it does, which is what a user arriving on time sees.
//!
//! Definitions, over one run's records:
//! - from the send: [`RequestRecord::ttft_s`]; from the planned arrival:
//!   [`RequestRecord::planned_ttft_s`] (the first token − [`RequestRecord::planned_s`]);
//! - P50 and P95 over the successful requests ([`percentile`]);
//! - sent late: requests first sent after their planned arrival (held back by the cap), and
//!   the longest such hold;
//! - within SLO from the planned arrival: as [`RequestRecord::judge`], with TTFT and E2E
//!   counted from the planned arrival instead of the send (TPOT is the same).

use std::fmt::Write;

use serde::Serialize;

use super::{percentile, RequestRecord, Slo};

/// One run's TTFT both ways.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlannedRow {
    /// The strategy.
    pub strategy: String,
    /// Planned arrivals (the SLO denominator).
    pub planned: usize,
    /// TTFT from the send, P50 and P95, s.
    pub ttft_p50_s: Option<f64>,
    /// See `ttft_p50_s`.
    pub ttft_p95_s: Option<f64>,
    /// TTFT from the planned arrival, P50 and P95, s.
    pub planned_ttft_p50_s: Option<f64>,
    /// See `planned_ttft_p50_s`.
    pub planned_ttft_p95_s: Option<f64>,
    /// Requests first sent after their planned arrival.
    pub sent_late: usize,
    /// The longest time a request was held back, s (0 when none was).
    pub longest_hold_s: f64,
    /// Requests within SLO (from the send, as the study counts them).
    pub within_slo: usize,
    /// Requests within SLO with TTFT and E2E counted from the planned arrival.
    pub within_slo_planned: usize,
}

/// Whether `r` is within `slo` with TTFT and E2E counted from its planned arrival.
pub fn within_slo_from_planned(r: &RequestRecord, slo: &Slo) -> bool {
    let hold = r.sent_s.map_or(0.0, |s| (s - r.planned_s).max(0.0));
    r.success
        && r.planned_ttft_s.is_some_and(|t| t <= slo.ttft_s)
        && r.tpot_ms.is_some_and(|t| t <= slo.tpot_ms)
        && r.e2e_s.is_some_and(|e| e + hold <= slo.e2e_s)
}

impl PlannedRow {
    /// Summarises one run's records (`planned` arrivals) against `slo`.
    pub fn from_records(
        strategy: &str,
        planned: usize,
        records: &[RequestRecord],
        slo: &Slo,
    ) -> Self {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.success).collect();
        let sent: Vec<f64> = ok.iter().filter_map(|r| r.ttft_s).collect();
        let from_planned: Vec<f64> = ok.iter().filter_map(|r| r.planned_ttft_s).collect();
        let holds: Vec<f64> = records
            .iter()
            .filter_map(|r| Some(r.sent_s? - r.planned_s))
            .filter(|h| *h > 0.0)
            .collect();
        PlannedRow {
            strategy: strategy.to_owned(),
            planned,
            ttft_p50_s: percentile(&sent, 0.5),
            ttft_p95_s: percentile(&sent, 0.95),
            planned_ttft_p50_s: percentile(&from_planned, 0.5),
            planned_ttft_p95_s: percentile(&from_planned, 0.95),
            sent_late: holds.len(),
            longest_hold_s: holds.iter().copied().fold(0.0, f64::max),
            within_slo: records.iter().filter(|r| r.within_slo).count(),
            within_slo_planned: records
                .iter()
                .filter(|r| within_slo_from_planned(r, slo))
                .count(),
        }
    }
}

/// `| strategy | TTFT P50 / P95 s from send | from planned arrival | sent late | longest hold s
/// | SLO /N | SLO /N from planned |`.
pub fn planned_table(rows: &[PlannedRow]) -> String {
    let planned = rows.first().map_or(0, |r| r.planned);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| strategy | TTFT P50 / P95 s from send | from planned arrival | sent late | longest hold s | SLO /{planned} | SLO /{planned} from planned |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    let pair = |a: Option<f64>, b: Option<f64>| {
        let f = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        format!("{} / {}", f(a), f(b))
    };
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.3} | {} | {} |",
            r.strategy,
            pair(r.ttft_p50_s, r.ttft_p95_s),
            pair(r.planned_ttft_p50_s, r.planned_ttft_p95_s),
            r.sent_late,
            r.longest_hold_s,
            r.within_slo,
            r.within_slo_planned
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(planned: f64, sent: f64, ttft: f64) -> RequestRecord {
        let mut r = RequestRecord {
            planned_s: planned,
            sent_s: Some(sent),
            success: true,
            ttft_s: Some(ttft),
            planned_ttft_s: Some(ttft + sent - planned),
            tpot_ms: Some(50.0),
            e2e_s: Some(ttft + 6.0),
            ..Default::default()
        };
        r.judge(&Slo::default());
        r
    }

    #[test]
    fn a_request_held_back_is_late_from_its_planned_arrival_only() {
        // On time, 0.5 s; held back 3 s, then 0.5 s; held back 25 s (E2E from the planned
        // arrival 31.5 s); failed.
        let mut failed = rec(3.0, 3.0, 0.1);
        failed.success = false;
        failed.within_slo = false;
        let rs = [
            rec(0.0, 0.0, 0.5),
            rec(1.0, 4.0, 0.5),
            rec(2.0, 27.0, 0.5),
            failed,
        ];
        let row = PlannedRow::from_records("x", 5, &rs, &Slo::default());
        assert_eq!(row.within_slo, 3);
        assert_eq!(row.within_slo_planned, 1);
        assert_eq!((row.sent_late, row.longest_hold_s), (2, 25.0));
        assert_eq!(row.ttft_p50_s, Some(0.5));
        assert_eq!(row.planned_ttft_p50_s, Some(3.5));
        let t = planned_table(&[row]);
        assert!(
            t.contains("| x | 0.500 / 0.500 | 3.500 / 23.300 | 2 | 25.000 | 3 | 1 |"),
            "{t}"
        );
        assert!(
            t.starts_with("| strategy | TTFT P50 / P95 s from send |"),
            "{t}"
        );
    }
}
