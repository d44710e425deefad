//! The TTFT model's parameters and priors, validated by the router's configuration.

/// Parameters and priors of the TTFT model. Defaults are vLLM's defaults where a vLLM setting
/// exists, and round numbers for a mid-size model on one GPU otherwise; configure the engine
/// facts (`engine_block_tokens`, `max_seqs`) and let the rates be learned.
#[derive(Clone, Debug, PartialEq)]
pub struct TtftConfig {
    /// Prior prompt bytes per engine token (learned from completions that report
    /// `prompt_tokens`). Default 4.0, typical of English text with BPE tokenizers.
    pub bytes_per_token: f64,
    /// The engine's KV block size in tokens: only whole blocks are reused. Default 16 (vLLM);
    /// the study's hybrid model aligns at 1,568.
    pub engine_block_tokens: u32,
    /// Default concurrent sequences per pod (vLLM `--max-num-seqs`, default 256); override per
    /// pod with [`crate::Router::set_pod_capacity`].
    pub max_seqs: u32,
    /// Prior prefill throughput per pod, tokens/s. Default 3,000.
    pub prefill_tokens_per_s: f64,
    /// Prior time per output token per pod, ms. Default 50.
    pub tpot_ms: f64,
    /// Prior fixed part of TTFT per pod (first decode step, network), ms, above 0 (like every
    /// learned rate: a sample moves an estimate by at most a factor, so one at 0 would stay
    /// there). Default 50.
    pub overhead_ms: f64,
    /// Prior expected output tokens per request. Default 128.
    pub output_tokens: f64,
    /// EWMA weight of one sample, in (0, 1]. Default 0.2.
    pub learning_rate: f64,
    /// A sample is clamped to `[estimate / r, estimate × r]` before it is learned. Default 3.
    pub max_sample_ratio: f64,
    /// Engine snapshots older than this are ignored, ms. Default 2,000.
    pub snapshot_max_age_ms: u64,
    /// Costs closer than this tie, ms; ties go to the pod expected to reuse the most engine
    /// blocks (the index's match corrected by `trust`/`extra`, rounded to whole blocks), then
    /// the lower load, then the seeded PRNG. Default 300: predictions on a loaded engine are
    /// good to a few hundred ms, and within that, keeping a prefix where it is cached pays
    /// later; where several engines hold it, the less loaded one is as good.
    pub tie_ms: f64,
    /// How many times its own length a prefill is charged when it stalls a full pod's
    /// decodes (see the model in `ttft/mod.rs`; 0 ranks by predicted TTFT alone). Default 2:
    /// the stall delays the pod's next free slot, and the request after that one's.
    pub stall_weight: f64,
    /// Exploration, ms: when the cheapest pod would make a request wait (for a slot or the
    /// prefill queue) at least this long, and a pod that has never shown how much of a prompt
    /// it holds beyond the index (the probing rule in `ttft/mod.rs`) would start it at once,
    /// the request goes there as that pod's probe, whatever the model prices it at. Its cost
    /// there is in units the model may not have learned yet (behind Envoy, warm and hotspot
    /// phases have no cold prefill to teach the prefill rate), and the answer is worth more
    /// than the wait. 0 turns it off. Default 500.
    pub explore_wait_ms: f64,
}

impl Default for TtftConfig {
    fn default() -> Self {
        TtftConfig {
            bytes_per_token: 4.0,
            engine_block_tokens: 16,
            max_seqs: 256,
            prefill_tokens_per_s: 3_000.0,
            tpot_ms: 50.0,
            overhead_ms: 50.0,
            output_tokens: 128.0,
            learning_rate: 0.2,
            max_sample_ratio: 3.0,
            snapshot_max_age_ms: 2_000,
            tie_ms: 300.0,
            stall_weight: 2.0,
            explore_wait_ms: 500.0,
        }
    }
}

/// Why [`TtftConfig::set`] refused a setting.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TtftSettingError {
    /// No field has this name.
    #[error("unknown TTFT setting {0:?} (known: {known})", known = TtftConfig::KEYS.join(", "))]
    UnknownKey(String),
    /// The value is out of the field's range (or not a whole number for a count).
    #[error("invalid value for TTFT setting {0}")]
    InvalidValue(&'static str),
}

impl TtftConfig {
    /// The settings' names, as [`TtftConfig::set`] and the shells' `[ttft]` sections take them.
    pub const KEYS: [&'static str; 13] = [
        "bytes_per_token",
        "engine_block_tokens",
        "max_seqs",
        "prefill_tokens_per_s",
        "tpot_ms",
        "overhead_ms",
        "output_tokens",
        "learning_rate",
        "max_sample_ratio",
        "snapshot_max_age_ms",
        "tie_ms",
        "stall_weight",
        "explore_wait_ms",
    ];

    /// Sets one field by its name ([`TtftConfig::KEYS`]) for shells that take settings as
    /// key-value pairs (the C ABI). Counts (`engine_block_tokens`, `max_seqs`,
    /// `snapshot_max_age_ms`) must be whole numbers in their type's range. On an error the
    /// configuration is unchanged; a value that passes here is also valid for
    /// [`crate::Router::new`].
    pub fn set(&mut self, key: &str, value: f64) -> Result<(), TtftSettingError> {
        let Some(&name) = TtftConfig::KEYS.iter().find(|k| **k == key) else {
            return Err(TtftSettingError::UnknownKey(key.to_owned()));
        };
        let invalid = TtftSettingError::InvalidValue(name);
        let whole = |max: f64| {
            (value.is_finite() && value.fract() == 0.0 && (0.0..=max).contains(&value))
                .then_some(value)
                .ok_or(invalid.clone())
        };
        let mut next = self.clone();
        match name {
            "bytes_per_token" => next.bytes_per_token = value,
            "engine_block_tokens" => next.engine_block_tokens = whole(f64::from(u32::MAX))? as u32,
            "max_seqs" => next.max_seqs = whole(f64::from(u32::MAX))? as u32,
            "prefill_tokens_per_s" => next.prefill_tokens_per_s = value,
            "tpot_ms" => next.tpot_ms = value,
            "overhead_ms" => next.overhead_ms = value,
            "output_tokens" => next.output_tokens = value,
            "learning_rate" => next.learning_rate = value,
            "max_sample_ratio" => next.max_sample_ratio = value,
            // 2^53: every whole f64 below it is exact.
            "snapshot_max_age_ms" => {
                next.snapshot_max_age_ms = whole(9_007_199_254_740_992.0)? as u64
            }
            "tie_ms" => next.tie_ms = value,
            "stall_weight" => next.stall_weight = value,
            _ => next.explore_wait_ms = value,
        }
        if next.invalid_field().is_some() {
            return Err(invalid);
        }
        *self = next;
        Ok(())
    }

    /// The name of the first invalid field, if any.
    pub(crate) fn invalid_field(&self) -> Option<&'static str> {
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.bytes_per_token) {
            return Some("ttft.bytes_per_token");
        }
        if self.engine_block_tokens == 0 {
            return Some("ttft.engine_block_tokens");
        }
        if self.max_seqs == 0 {
            return Some("ttft.max_seqs");
        }
        if !positive(self.prefill_tokens_per_s) {
            return Some("ttft.prefill_tokens_per_s");
        }
        if !positive(self.tpot_ms) {
            return Some("ttft.tpot_ms");
        }
        if !positive(self.overhead_ms) {
            return Some("ttft.overhead_ms");
        }
        if !positive(self.output_tokens) {
            return Some("ttft.output_tokens");
        }
        if !(positive(self.learning_rate) && self.learning_rate <= 1.0) {
            return Some("ttft.learning_rate");
        }
        if !(self.max_sample_ratio.is_finite() && self.max_sample_ratio >= 1.0) {
            return Some("ttft.max_sample_ratio");
        }
        if !(self.tie_ms.is_finite() && self.tie_ms >= 0.0) {
            return Some("ttft.tie_ms");
        }
        if !(self.stall_weight.is_finite() && self.stall_weight >= 0.0) {
            return Some("ttft.stall_weight");
        }
        if !(self.explore_wait_ms.is_finite() && self.explore_wait_ms >= 0.0) {
            return Some("ttft.explore_wait_ms");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_by_name_check_their_values_and_leave_the_config_alone_on_errors() {
        let mut c = TtftConfig::default();
        for key in TtftConfig::KEYS {
            let before = c.clone();
            assert_eq!(
                c.set(key, -1.0),
                Err(TtftSettingError::InvalidValue(key)),
                "{key}"
            );
            assert_eq!(c, before);
        }
        c.set("max_seqs", 8.0).unwrap();
        c.set("prefill_tokens_per_s", 12_500.0).unwrap();
        c.set("snapshot_max_age_ms", 500.0).unwrap();
        assert_eq!(
            (c.max_seqs, c.prefill_tokens_per_s, c.snapshot_max_age_ms),
            (8, 12_500.0, 500)
        );
        assert!(matches!(
            c.set("max_seqs", 2.5),
            Err(TtftSettingError::InvalidValue(_))
        ));
        assert!(matches!(
            c.set("max_seqs", 0.0),
            Err(TtftSettingError::InvalidValue(_))
        ));
        assert!(matches!(
            c.set("engine_block_tokens", 5e9),
            Err(TtftSettingError::InvalidValue(_))
        ));
        assert!(matches!(
            c.set("learning_rate", f64::NAN),
            Err(TtftSettingError::InvalidValue(_))
        ));
        assert!(matches!(
            c.set("TPOT_MS", 40.0),
            Err(TtftSettingError::UnknownKey(_))
        ));
        assert_eq!(c.invalid_field(), None);
    }

    #[test]
    fn every_invalid_field_is_named() {
        assert_eq!(TtftConfig::default().invalid_field(), None);
        type Break = fn(&mut TtftConfig);
        let cases: [(Break, &str); 13] = [
            (|c| c.bytes_per_token = 0.0, "ttft.bytes_per_token"),
            (|c| c.engine_block_tokens = 0, "ttft.engine_block_tokens"),
            (|c| c.max_seqs = 0, "ttft.max_seqs"),
            (
                |c| c.prefill_tokens_per_s = f64::NAN,
                "ttft.prefill_tokens_per_s",
            ),
            (|c| c.tpot_ms = -1.0, "ttft.tpot_ms"),
            (|c| c.overhead_ms = 0.0, "ttft.overhead_ms"),
            (|c| c.output_tokens = f64::INFINITY, "ttft.output_tokens"),
            (|c| c.learning_rate = 1.5, "ttft.learning_rate"),
            (|c| c.max_sample_ratio = 0.5, "ttft.max_sample_ratio"),
            (|c| c.tie_ms = -0.1, "ttft.tie_ms"),
            (|c| c.stall_weight = f64::NAN, "ttft.stall_weight"),
            (|c| c.learning_rate = 0.0, "ttft.learning_rate"),
            (|c| c.explore_wait_ms = -1.0, "ttft.explore_wait_ms"),
        ];
        for (break_it, field) in cases {
            let mut c = TtftConfig::default();
            break_it(&mut c);
            assert_eq!(c.invalid_field(), Some(field));
        }
    }
}
