//! How far least-ttft's predictions are from what happens: per pod, the TTFT predicted at
//! routing against the first-token time later reported, split by whether a wait (slot or
//! prefill backlog) was predicted, so an operator can see when the model is off and which part.

/// Predicted against observed TTFTs of one kind of request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TtftErrors {
    /// Requests whose first-token time was reported.
    pub samples: u64,
    /// Their predicted TTFTs, summed, ms.
    pub predicted_ms: f64,
    /// Their reported first-token times, summed, ms.
    pub observed_ms: f64,
    /// `|observed − predicted|`, summed, ms.
    pub abs_error_ms: f64,
}

impl TtftErrors {
    /// Mean of `observed − predicted`, ms (positive: the model predicts too short). `None`
    /// without samples.
    pub fn mean_error_ms(&self) -> Option<f64> {
        (self.samples > 0).then(|| (self.observed_ms - self.predicted_ms) / self.samples as f64)
    }

    /// Mean of `|observed − predicted|`, ms. `None` without samples.
    pub fn mean_abs_error_ms(&self) -> Option<f64> {
        (self.samples > 0).then(|| self.abs_error_ms / self.samples as f64)
    }

    fn add(&mut self, predicted_ms: f64, observed_ms: f64) {
        self.samples += 1;
        self.predicted_ms += predicted_ms;
        self.observed_ms += observed_ms;
        self.abs_error_ms += (observed_ms - predicted_ms).abs();
    }
}

/// A pod's calibration: requests predicted to start their prefill at once, and those predicted
/// to wait. Each routed request counts once, at the first report of its first-token time (a
/// first-token report or a successful completion that carries it); the prediction is the one
/// the router made when it routed the request, whatever the strategy.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TtftCalibration {
    /// Requests predicted to start their prefill at once.
    pub at_once: TtftErrors,
    /// Requests predicted to wait for a slot or for the prefills before them.
    pub waited: TtftErrors,
}

impl TtftCalibration {
    pub(crate) fn record(&mut self, predicted_ms: f64, predicted_wait_ms: f64, observed_ms: f64) {
        if !(predicted_ms.is_finite() && observed_ms.is_finite()) {
            return;
        }
        let kind = if predicted_wait_ms > 0.0 {
            &mut self.waited
        } else {
            &mut self.at_once
        };
        kind.add(predicted_ms, observed_ms);
    }

    /// Both kinds together.
    pub fn total(&self) -> TtftErrors {
        TtftErrors {
            samples: self.at_once.samples + self.waited.samples,
            predicted_ms: self.at_once.predicted_ms + self.waited.predicted_ms,
            observed_ms: self.at_once.observed_ms + self.waited.observed_ms,
            abs_error_ms: self.at_once.abs_error_ms + self.waited.abs_error_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_split_by_the_predicted_wait_and_averaged() {
        let mut c = TtftCalibration::default();
        assert_eq!(c.total().mean_error_ms(), None);
        c.record(1_000.0, 0.0, 1_200.0);
        c.record(1_000.0, 0.0, 900.0);
        c.record(3_000.0, 2_500.0, 1_000.0);
        c.record(f64::NAN, 0.0, 1.0);
        assert_eq!(c.at_once.samples, 2);
        assert_eq!(c.at_once.mean_error_ms(), Some(50.0));
        assert_eq!(c.at_once.mean_abs_error_ms(), Some(150.0));
        assert_eq!(c.waited.mean_error_ms(), Some(-2_000.0));
        let all = c.total();
        assert_eq!(all.samples, 3);
        assert_eq!(all.abs_error_ms, 2_300.0);
    }
}
