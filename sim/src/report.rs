//! Per-request records, per-phase metrics and the study's table layout.
//!
//! Definitions (the study's):
//! - success: HTTP 200, content received, `[DONE]` received and exactly the planned output tokens;
//! - TTFT: send → first content; TPOT: (last content − first content) / (output tokens − 1);
//!   E2E: send → end of stream (the simulator's records also carry TTFT from the planned
//!   arrival, see [`PlannedRow`]);
//! - within SLO: success, TTFT ≤ 2 s, TPOT ≤ 150 ms and E2E ≤ 30 s, counted out of the planned
//!   arrivals (a request never sent still counts in the denominator);
//! - P95: over the successful requests, linear interpolation between closest ranks
//!   (`rank = 0.95 × (n − 1)`, numpy's default).

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

mod calibration;
mod planned;
pub use calibration::{calibration_table, Errors, PodCalibration};
pub use planned::{planned_table, within_slo_from_planned, PlannedRow};

/// The study's service-level objective.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Slo {
    /// Largest TTFT, seconds.
    pub ttft_s: f64,
    /// Largest TPOT, milliseconds.
    pub tpot_ms: f64,
    /// Largest end-to-end latency, seconds.
    pub e2e_s: f64,
}

impl Default for Slo {
    fn default() -> Self {
        Slo {
            ttft_s: 2.0,
            tpot_ms: 150.0,
            e2e_s: 30.0,
        }
    }
}

/// What happened to one request.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RequestRecord {
    /// The phase label, e.g. `hot50/1`.
    pub phase: String,
    /// The strategy asked for.
    pub strategy: String,
    /// 1-based position in the phase.
    pub index: usize,
    /// The study family, if any.
    pub family: Option<usize>,
    /// Planned send time, s from the phase start.
    pub planned_s: f64,
    /// Actual send time, s from the phase start (later than planned when the client cap held
    /// it back; `None` if never sent).
    pub sent_s: Option<f64>,
    /// The pod that served it.
    pub pod: Option<String>,
    /// The router's reason (`prefix_match`, …).
    pub reason: Option<String>,
    /// The chosen pod's prefix match, percent.
    pub match_percent: Option<u8>,
    /// Whether prefix-cache's imbalance guard fired for this request.
    pub imbalance: Option<bool>,
    /// The router's one-line explanation.
    pub decision: Option<String>,
    /// HTTP status (200 in the simulator).
    pub status: Option<u16>,
    /// The study's success definition.
    pub success: bool,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// Time to first token from the (first) send, s.
    pub ttft_s: Option<f64>,
    /// Time to first token from the planned arrival ([`RequestRecord::planned_s`]), s: what a
    /// user who arrived on time waited, including the time the client's in-flight cap held
    /// the request back (the simulator; absent where only the send is known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planned_ttft_s: Option<f64>,
    /// Time per output token after the first, ms.
    pub tpot_ms: Option<f64>,
    /// End-to-end latency, s.
    pub e2e_s: Option<f64>,
    /// Prompt tokens (usage).
    pub prompt_tokens: Option<u32>,
    /// Prompt tokens served from the prefix cache (usage).
    pub cached_tokens: Option<u32>,
    /// The simulator: the prompt tokens the router's TTFT model predicted the chosen engine
    /// would serve from its cache (`Decision::prediction.cached_tokens`, at routing time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_cached_tokens: Option<u32>,
    /// The simulator: the prompt tokens the chosen engine held in its cache when the request
    /// was routed (what it would have served had it been admitted at once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_cached_tokens: Option<u32>,
    /// The simulator, with `--kv-events`: the prompt tokens the chosen engine's published KV
    /// events said it held when the request was routed (what an engine view that has applied
    /// every event can know; `held_cached_tokens` less the blocks of the step in progress).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published_cached_tokens: Option<u32>,
    /// Output tokens received.
    pub output_tokens: Option<u32>,
    /// Success and within every SLO bound.
    pub within_slo: bool,
}

impl RequestRecord {
    /// Sets `within_slo` from the measurements.
    pub fn judge(&mut self, slo: &Slo) {
        self.within_slo = self.success
            && self.ttft_s.is_some_and(|t| t <= slo.ttft_s)
            && self.tpot_ms.is_some_and(|t| t <= slo.tpot_ms)
            && self.e2e_s.is_some_and(|t| t <= slo.e2e_s);
    }
}

/// The `p`-quantile (0..=1) of `values` with linear interpolation; `None` when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = p.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    Some(v[lo] + (v[hi] - v[lo]) * (rank - lo as f64))
}

/// One phase's row of the study table, plus what the table has no column for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseSummary {
    /// `scenario / round` label.
    pub label: String,
    /// The strategy.
    pub strategy: String,
    /// Planned arrivals (the SLO denominator).
    pub planned: usize,
    /// Successful requests.
    pub succeeded: usize,
    /// TTFT P95, s.
    pub ttft_p95_s: Option<f64>,
    /// TPOT P95, ms.
    pub tpot_p95_ms: Option<f64>,
    /// Token hit rate, 0..=1.
    pub token_hit: Option<f64>,
    /// Requests within SLO.
    pub within_slo: usize,
    /// Requests per pod, in the order of the pods given.
    pub split: Vec<(String, usize)>,
    /// Output tokens per second over the phase (first send → last byte).
    pub output_throughput: Option<f64>,
}

impl PhaseSummary {
    /// Summarises records. `pods` fixes the split's order (pods not seen count 0; others are
    /// appended by name). `token_hit` overrides the usage-based hit rate (the simulator passes
    /// the engines' counter deltas, as the study did).
    pub fn from_records(
        label: &str,
        strategy: &str,
        planned: usize,
        records: &[RequestRecord],
        pods: &[String],
        token_hit: Option<f64>,
    ) -> Self {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.success).collect();
        let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_s).collect();
        let tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot_ms).collect();
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for r in records {
            if let Some(p) = &r.pod {
                *counts.entry(p).or_default() += 1;
            }
        }
        let mut split: Vec<(String, usize)> = pods
            .iter()
            .map(|p| (p.clone(), counts.remove(p.as_str()).unwrap_or(0)))
            .collect();
        split.extend(counts.into_iter().map(|(p, n)| (p.to_owned(), n)));
        let usage_hit = {
            let (q, h) = ok.iter().fold((0u64, 0u64), |(q, h), r| {
                (
                    q + u64::from(r.prompt_tokens.unwrap_or(0)),
                    h + u64::from(r.cached_tokens.unwrap_or(0)),
                )
            });
            (q > 0).then(|| h as f64 / q as f64)
        };
        let start = records
            .iter()
            .filter_map(|r| r.sent_s)
            .fold(f64::INFINITY, f64::min);
        let end = records
            .iter()
            .filter_map(|r| Some(r.sent_s? + r.e2e_s?))
            .fold(f64::NEG_INFINITY, f64::max);
        let tokens: u64 = ok
            .iter()
            .map(|r| u64::from(r.output_tokens.unwrap_or(0)))
            .sum();
        PhaseSummary {
            label: label.to_owned(),
            strategy: strategy.to_owned(),
            planned,
            succeeded: ok.len(),
            ttft_p95_s: percentile(&ttft, 0.95),
            tpot_p95_ms: percentile(&tpot, 0.95),
            token_hit: token_hit.or(usage_hit),
            within_slo: records.iter().filter(|r| r.within_slo).count(),
            split,
            output_throughput: (end > start).then(|| tokens as f64 / (end - start)),
        }
    }

    /// The split as `45 / 51`.
    pub fn split_cell(&self) -> String {
        self.split
            .iter()
            .map(|(_, n)| n.to_string())
            .collect::<Vec<_>>()
            .join(" / ")
    }
}

/// The study's table: `| scenario / round | strategy | TTFT P95 s | TPOT P95 ms | token hit |
/// SLO /N | A / B |`, the split header naming the pods of the first row with the most pods.
pub fn study_table(rows: &[PhaseSummary]) -> String {
    let planned = rows.first().map_or(96, |r| r.planned);
    let most = rows.iter().map(|r| r.split.len()).max().unwrap_or(0);
    let pods = rows.iter().find(|r| r.split.len() == most).map_or_else(
        || "A / B".to_owned(),
        |r| {
            r.split
                .iter()
                .map(|(p, _)| p.as_str())
                .collect::<Vec<_>>()
                .join(" / ")
        },
    );
    let mut s = String::new();
    let _ = writeln!(s, "| scenario / round | strategy | TTFT P95 s | TPOT P95 ms | token hit | SLO /{planned} | {pods} |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or_else(|| "-".to_owned(), f);
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.label,
            r.strategy,
            opt(r.ttft_p95_s, &|v| format!("{v:.3}")),
            opt(r.tpot_p95_ms, &|v| format!("{v:.1}")),
            opt(r.token_hit, &|v| format!("{:.1}%", v * 100.0)),
            r.within_slo,
            r.split_cell()
        );
    }
    s
}

/// How well the router's predicted cached tokens ([`RequestRecord::predicted_cached_tokens`])
/// matched the tokens the engines served from their prefix caches
/// ([`RequestRecord::cached_tokens`]), over a phase's successful requests that have both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CacheAccuracy {
    /// Requests counted.
    pub requests: usize,
    /// Σ predicted cached tokens.
    pub predicted: u64,
    /// Σ cached tokens the engines served.
    pub actual: u64,
    /// Σ cached tokens the chosen engines held when the requests were routed.
    pub held: u64,
    /// Σ |predicted − actual| per request: what the totals' ratio can hide (over- and
    /// under-predictions cancelling out).
    pub abs_error: u64,
    /// Of those requests, the ones routed from an engine view (`view=engine` in the decision).
    pub engine_views: usize,
}

impl CacheAccuracy {
    /// Sums the records.
    pub fn from_records(records: &[RequestRecord]) -> Self {
        let mut a = CacheAccuracy::default();
        for r in records.iter().filter(|r| r.success) {
            let (Some(p), Some(c)) = (r.predicted_cached_tokens, r.cached_tokens) else {
                continue;
            };
            a.requests += 1;
            a.predicted += u64::from(p);
            a.actual += u64::from(c);
            a.held += u64::from(r.held_cached_tokens.unwrap_or(0));
            a.abs_error += u64::from(p.abs_diff(c));
            let view = r
                .decision
                .as_deref()
                .and_then(|d| decision_field(d, "view"));
            a.engine_views += usize::from(view == Some("engine"));
        }
        a
    }

    /// predicted ÷ actual (`None` when nothing was served from cache).
    pub fn ratio(&self) -> Option<f64> {
        (self.actual > 0).then(|| self.predicted as f64 / self.actual as f64)
    }

    /// Σ |predicted − actual| ÷ actual (`None` when nothing was served from cache).
    pub fn error_share(&self) -> Option<f64> {
        (self.actual > 0).then(|| self.abs_error as f64 / self.actual as f64)
    }

    /// predicted ÷ held at routing (`None` when the chosen engines held nothing).
    pub fn held_ratio(&self) -> Option<f64> {
        (self.held > 0).then(|| self.predicted as f64 / self.held as f64)
    }
}

/// One row of [`cache_table`]: a phase's label and strategy, its [`CacheAccuracy`] and the
/// blocks its engines evicted.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheRow {
    /// `scenario / round`.
    pub label: String,
    /// The strategy.
    pub strategy: String,
    /// Predicted against actual cached tokens.
    pub accuracy: CacheAccuracy,
    /// Blocks evicted, all engines together.
    pub evictions: u64,
}

/// Predicted against actual cached tokens per phase: `| scenario / round | strategy | predicted
/// cached | actual cached | predicted ÷ actual | abs error ÷ actual | held at routing |
/// predicted ÷ held | engine view | evicted |`.
pub fn cache_table(rows: &[CacheRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| scenario / round | strategy | predicted cached | actual cached | predicted ÷ actual | abs error ÷ actual | held at routing | predicted ÷ held | engine view | evicted |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    let ratio = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
    for r in rows {
        let a = &r.accuracy;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {} |",
            r.label,
            r.strategy,
            a.predicted,
            a.actual,
            ratio(a.ratio()),
            ratio(a.error_share()),
            a.held,
            ratio(a.held_ratio()),
            a.engine_views,
            a.requests,
            r.evictions
        );
    }
    s
}

/// The per-request table: #, family, pod, reason, match, TTFT, within SLO.
pub fn request_table(records: &[RequestRecord]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>4} {:>6} {:>16} {:>24} {:>6} {:>8} {:>4}",
        "#", "family", "pod", "reason", "match", "TTFT s", "SLO"
    );
    for r in records {
        let _ = writeln!(
            s,
            "{:>4} {:>6} {:>16} {:>24} {:>6} {:>8} {:>4}",
            r.index,
            r.family.map_or_else(|| "-".to_owned(), |f| f.to_string()),
            r.pod.as_deref().unwrap_or("-"),
            r.reason.as_deref().unwrap_or("-"),
            r.match_percent
                .map_or_else(|| "-".to_owned(), |m| format!("{m}%")),
            r.ttft_s.map_or_else(
                || r.error
                    .clone()
                    .map_or("-".to_owned(), |_| "fail".to_owned()),
                |t| format!("{t:.3}")
            ),
            if r.within_slo { "yes" } else { "no" }
        );
    }
    s
}

/// Writes records as JSONL.
pub fn write_jsonl(path: &std::path::Path, records: &[RequestRecord]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for r in records {
        serde_json::to_writer(&mut f, r)?;
        f.write_all(b"\n")?;
    }
    f.flush()
}

/// Parses `key=value` fields of a decision line (`x-kvroute-decision`).
pub fn decision_field<'a>(decision: &'a str, key: &str) -> Option<&'a str> {
    decision
        .split_ascii_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_interpolates_linearly() {
        let v: Vec<f64> = (1..=21).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.95), Some(20.0));
        assert_eq!(percentile(&[1.0, 2.0], 0.95), Some(1.95));
        assert_eq!(percentile(&[], 0.95), None);
    }

    #[test]
    fn slo_needs_every_bound() {
        let mut r = RequestRecord {
            success: true,
            ttft_s: Some(2.0),
            tpot_ms: Some(150.0),
            e2e_s: Some(30.0),
            ..Default::default()
        };
        r.judge(&Slo::default());
        assert!(r.within_slo);
        r.ttft_s = Some(2.001);
        r.judge(&Slo::default());
        assert!(!r.within_slo);
    }

    #[test]
    fn summary_and_table() {
        let rec = |pod: &str, ttft| RequestRecord {
            pod: Some(pod.into()),
            success: true,
            ttft_s: Some(ttft),
            tpot_ms: Some(60.0),
            e2e_s: Some(8.0),
            within_slo: ttft <= 2.0,
            prompt_tokens: Some(100),
            cached_tokens: Some(50),
            ..Default::default()
        };
        let rs = vec![rec("b", 1.0), rec("b", 3.0), rec("c", 0.5)];
        let s =
            PhaseSummary::from_records("x / 1", "random", 4, &rs, &["a".into(), "b".into()], None);
        assert_eq!(
            s.split,
            vec![("a".into(), 0), ("b".into(), 2), ("c".into(), 1)]
        );
        assert_eq!(s.within_slo, 2);
        assert_eq!(s.token_hit, Some(0.5));
        let t = study_table(&[s]);
        assert!(
            t.contains("| x / 1 | random | 2.800 | 60.0 | 50.0% | 2 | 0 / 2 / 1 |"),
            "{t}"
        );
        assert_eq!(
            decision_field("strategy=x reason=prefix_match match=100%", "reason"),
            Some("prefix_match")
        );
        assert_eq!(decision_field("strategy=x", "match"), None);
    }

    #[test]
    fn cache_accuracy_sums_successful_requests() {
        let rec = |p, c, h, view: &str| RequestRecord {
            success: true,
            predicted_cached_tokens: Some(p),
            cached_tokens: Some(c),
            held_cached_tokens: Some(h),
            decision: Some(format!("strategy=x reason=y{view}")),
            ..Default::default()
        };
        let mut failed = rec(9, 9, 9, "");
        failed.success = false;
        let rs = [rec(100, 50, 100, " view=engine"), rec(0, 50, 0, ""), failed];
        let a = CacheAccuracy::from_records(&rs);
        assert_eq!(
            (a.requests, a.predicted, a.actual, a.held),
            (2, 100, 100, 100)
        );
        assert_eq!((a.abs_error, a.engine_views), (100, 1));
        assert_eq!(
            (a.ratio(), a.error_share(), a.held_ratio()),
            (Some(1.0), Some(1.0), Some(1.0))
        );
        assert_eq!(CacheAccuracy::default().ratio(), None);
        let t = cache_table(&[CacheRow {
            label: "x / 1".into(),
            strategy: "random".into(),
            accuracy: a,
            evictions: 7,
        }]);
        assert!(
            t.contains("| x / 1 | random | 100 | 100 | 1.000 | 1.000 | 100 | 1.000 | 1/2 | 7 |"),
            "{t}"
        );
    }
}
