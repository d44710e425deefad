//! least-ttft's TTFT predictions held against the first tokens the router was told of, per pod
//! (the core's per-pod calibration over one run), so a user can see when the model is off and
//! in which part: predictions of a start at once (prefill rate and overhead) or of a wait (the
//! replay of the pod's queue as well).

use kvroute_core::{TtftCalibration, TtftErrors};
use serde::Serialize;

/// One kind of prediction over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Errors {
    /// Requests whose first-token time the router was told.
    pub samples: u64,
    /// Mean of observed − predicted, s (above 0: predictions too short).
    pub mean_error_s: Option<f64>,
    /// Mean of |observed − predicted|, s.
    pub mean_abs_error_s: Option<f64>,
}

impl Errors {
    fn between(before: &TtftErrors, after: &TtftErrors) -> Self {
        let d = TtftErrors {
            samples: after.samples - before.samples,
            predicted_ms: after.predicted_ms - before.predicted_ms,
            observed_ms: after.observed_ms - before.observed_ms,
            abs_error_ms: after.abs_error_ms - before.abs_error_ms,
        };
        Errors {
            samples: d.samples,
            mean_error_s: d.mean_error_ms().map(|v| v / 1e3),
            mean_abs_error_s: d.mean_abs_error_ms().map(|v| v / 1e3),
        }
    }
}

/// One pod's calibration over a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PodCalibration {
    /// The pod.
    pub pod: String,
    /// Requests predicted to start their prefill at once.
    pub at_once: Errors,
    /// Requests predicted to wait for a slot or for the prefills before them.
    pub waited: Errors,
}

impl PodCalibration {
    /// What the router's counters for `pod` gained from `before` to `after`.
    pub fn between(pod: &str, before: &TtftCalibration, after: &TtftCalibration) -> Self {
        PodCalibration {
            pod: pod.to_owned(),
            at_once: Errors::between(&before.at_once, &after.at_once),
            waited: Errors::between(&before.waited, &after.waited),
        }
    }
}

/// A markdown table: strategy × pod, samples, mean and mean absolute error for each kind.
pub fn calibration_table(runs: &[(String, Vec<PodCalibration>)]) -> String {
    let mut out = String::from(
        "| strategy | pod | at once: requests | mean error s | mean abs error s | waited: requests | mean error s | mean abs error s |\n|---|---|---|---|---|---|---|---|\n",
    );
    let s = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:+.3}"));
    let a = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.3}"));
    for (strategy, pods) in runs {
        for p in pods {
            out += &format!(
                "| {strategy} | {} | {} | {} | {} | {} | {} | {} |\n",
                p.pod,
                p.at_once.samples,
                s(p.at_once.mean_error_s),
                a(p.at_once.mean_abs_error_s),
                p.waited.samples,
                s(p.waited.mean_error_s),
                a(p.waited.mean_abs_error_s),
            );
        }
    }
    out
}
