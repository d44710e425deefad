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

/// A learned fraction in [0, 1]: an average of samples clamped to [0, 1], the `n`-th weighing
/// `max(1/n, learning rate)`. The first sample replaces the prior (a fraction is measured, not
/// guessed, by one request), and from the `1/learning rate`-th on it is an EWMA.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Fraction {
    value: f64,
    samples: u32,
}

impl Fraction {
    pub(crate) fn new(prior: f64) -> Self {
        Fraction {
            value: prior.clamp(0.0, 1.0),
            samples: 0,
        }
    }

    pub(crate) fn get(self) -> f64 {
        self.value
    }

    /// Whether any sample has been learned.
    pub(crate) fn sampled(self) -> bool {
        self.samples > 0
    }

    pub(crate) fn learn(&mut self, sample: f64, cfg: &TtftConfig) {
        if sample.is_finite() {
            self.samples = self.samples.saturating_add(1);
            let w = cfg.learning_rate.max(1.0 / f64::from(self.samples));
            self.value += w * (sample.clamp(0.0, 1.0) - self.value);
        }
    }
}
