//! Learned quantities of the TTFT model: a bounded EWMA for rates and a fraction in [0, 1].

use super::TtftConfig;

/// A bounded exponentially weighted moving average (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Ewma {
    value: f64,
    /// Samples taken with [`Ewma::learn_measured`].
    measured: u32,
    /// Whether any sample has been taken (the value is no longer the prior).
    learned: bool,
}

impl Ewma {
    pub(crate) fn new(prior: f64) -> Self {
        Ewma {
            value: prior,
            measured: 0,
            learned: false,
        }
    }

    /// Replaces the prior, unless a sample has been learned.
    pub(crate) fn set_prior(&mut self, prior: f64) {
        if !self.learned {
            self.value = prior;
        }
    }

    pub(crate) fn get(self) -> f64 {
        self.value
    }

    /// How many samples [`Ewma::learn_measured`] has taken.
    pub(crate) fn measured(self) -> u32 {
        self.measured
    }

    /// Learns one sample at weight `learning_rate`; non-finite or non-positive samples are
    /// ignored.
    pub(crate) fn learn(&mut self, sample: f64, cfg: &TtftConfig) {
        self.learn_weighted(sample, cfg.learning_rate, cfg);
    }

    /// Learns one measured sample, the `n`-th measured one weighing `max(1/n, learning_rate)`
    /// as in [`Fraction`]: the first replaces the prior (within the clamp), and the estimate is
    /// the measured samples' mean until the EWMA's own weight takes over.
    pub(crate) fn learn_measured(&mut self, sample: f64, cfg: &TtftConfig) {
        if !(sample.is_finite() && sample > 0.0) {
            return;
        }
        self.measured = self.measured.saturating_add(1);
        let w = cfg.learning_rate.max(1.0 / f64::from(self.measured));
        self.learn_weighted(sample, w, cfg);
    }

    fn learn_weighted(&mut self, sample: f64, weight: f64, cfg: &TtftConfig) {
        if !(sample.is_finite() && sample > 0.0) {
            return;
        }
        let r = cfg.max_sample_ratio;
        let s = sample.clamp(self.value / r, self.value * r);
        self.value += weight * (s - self.value);
        self.learned = true;
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
