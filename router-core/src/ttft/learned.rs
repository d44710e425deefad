//! Learned quantities of the TTFT model: a bounded EWMA for rates and a fraction in [0, 1].

use super::TtftConfig;

/// A bounded exponentially weighted moving average (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Ewma {
    value: f64,
}

impl Ewma {
    pub(crate) fn new(prior: f64) -> Self {
        Ewma { value: prior }
    }

    pub(crate) fn get(self) -> f64 {
        self.value
    }

    /// Learns one sample; non-finite or non-positive samples are ignored.
    pub(crate) fn learn(&mut self, sample: f64, cfg: &TtftConfig) {
        if !(sample.is_finite() && sample > 0.0) {
            return;
        }
        let r = cfg.max_sample_ratio;
        let s = sample.clamp(self.value / r, self.value * r);
        self.value += cfg.learning_rate * (s - self.value);
    }
}

/// A learned fraction in [0, 1]: a plain EWMA of samples clamped to [0, 1], so one sample
/// moves it by at most the learning rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Fraction {
    value: f64,
}

impl Fraction {
    pub(crate) fn new(prior: f64) -> Self {
        Fraction {
            value: prior.clamp(0.0, 1.0),
        }
    }

    pub(crate) fn get(self) -> f64 {
        self.value
    }

    pub(crate) fn learn(&mut self, sample: f64, cfg: &TtftConfig) {
        if sample.is_finite() {
            self.value += cfg.learning_rate * (sample.clamp(0.0, 1.0) - self.value);
        }
    }
}
