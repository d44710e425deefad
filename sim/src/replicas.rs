//! Replicas of different speeds and capacities: one `--pod NAME[:KEY=VALUE,...]` of
//! `kvroute-sim run` per replica, its engine settings over the engine flags'.
//!
//! ## Contract
//! - `NAME` is the pod's name (non-empty, no `:` or `,`, unique within a cluster); the settings,
//!   comma-separated, are any of `speed=F` (F > 0, finite: every term of the step-time model
//!   divided by F, so 0.5 is a replica whose steps take twice as long; microsecond terms
//!   rounded to whole µs), `max-num-seqs=N` and `kv-blocks=N` (N ≥ 1, as the engine flags of
//!   those names). A setting given twice, an unknown key or a bad value is an error.
//! - Settings left out are the engine flags'; a bare `NAME` is a replica exactly as the flags
//!   describe it.

use crate::engine::EngineConfig;

/// One replica as `--pod` describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaSpec {
    /// The pod's name.
    pub name: String,
    /// Step-time divisor (1 = the engine flags' speed).
    pub speed: f64,
    /// Its `max_num_seqs`, if not the flags'.
    pub max_num_seqs: Option<u32>,
    /// Its KV capacity in blocks, if not the flags'.
    pub kv_blocks: Option<u32>,
}

/// A `--pod` value that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaSpecError {
    /// The name is empty or holds a `,`.
    #[error("{0:?}: the pod needs a name without `,` before any `:`")]
    Name(String),
    /// A setting is not `KEY=VALUE` with a known key.
    #[error("unknown setting {0:?} (expected speed=F, max-num-seqs=N or kv-blocks=N)")]
    UnknownSetting(String),
    /// A setting's value is out of range.
    #[error("{key}={value}: {expected}")]
    Value {
        /// The key.
        key: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A setting is given twice.
    #[error("{0} given twice")]
    Repeated(&'static str),
}

impl ReplicaSpec {
    /// A replica named `name` as the engine flags describe it.
    pub fn plain(name: &str) -> ReplicaSpec {
        ReplicaSpec {
            name: name.to_owned(),
            speed: 1.0,
            max_num_seqs: None,
            kv_blocks: None,
        }
    }

    /// Parses `NAME[:KEY=VALUE,...]`.
    pub fn parse(s: &str) -> Result<ReplicaSpec, ReplicaSpecError> {
        let (name, settings) = s.split_once(':').unwrap_or((s, ""));
        if name.is_empty() || name.contains(',') {
            return Err(ReplicaSpecError::Name(s.to_owned()));
        }
        let mut spec = ReplicaSpec::plain(name);
        let mut speed_given = false;
        for setting in settings.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = setting
                .split_once('=')
                .ok_or_else(|| ReplicaSpecError::UnknownSetting(setting.to_owned()))?;
            let count = |key: &'static str| {
                value
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| ReplicaSpecError::Value {
                        key,
                        value: value.to_owned(),
                        expected: "a whole number of at least 1",
                    })
            };
            match key {
                "speed" => {
                    if speed_given {
                        return Err(ReplicaSpecError::Repeated("speed"));
                    }
                    speed_given = true;
                    spec.speed = value
                        .parse::<f64>()
                        .ok()
                        .filter(|f| f.is_finite() && *f > 0.0)
                        .ok_or_else(|| ReplicaSpecError::Value {
                            key: "speed",
                            value: value.to_owned(),
                            expected: "a finite number above 0",
                        })?;
                }
                "max-num-seqs" if spec.max_num_seqs.is_some() => {
                    return Err(ReplicaSpecError::Repeated("max-num-seqs"))
                }
                "max-num-seqs" => spec.max_num_seqs = Some(count("max-num-seqs")?),
                "kv-blocks" if spec.kv_blocks.is_some() => {
                    return Err(ReplicaSpecError::Repeated("kv-blocks"))
                }
                "kv-blocks" => spec.kv_blocks = Some(count("kv-blocks")?),
                _ => return Err(ReplicaSpecError::UnknownSetting(setting.to_owned())),
            }
        }
        Ok(spec)
    }

    /// This replica's engine: `base` (the engine flags') with its settings.
    pub fn engine(&self, base: &EngineConfig) -> EngineConfig {
        let scale = |us: u64| (us as f64 / self.speed).round() as u64;
        let mut e = *base;
        if self.speed != 1.0 {
            e.step.base_us = scale(base.step.base_us);
            e.step.per_decode_seq_us = scale(base.step.per_decode_seq_us);
            e.step.per_prefill_token_us = base.step.per_prefill_token_us / self.speed;
        }
        e.max_num_seqs = self.max_num_seqs.unwrap_or(base.max_num_seqs);
        e.kv_capacity_blocks = self.kv_blocks.unwrap_or(base.kv_capacity_blocks);
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_apply_over_the_flags() {
        let spec = ReplicaSpec::parse("B:speed=0.5,max-num-seqs=4,kv-blocks=80").unwrap();
        assert_eq!(spec.name, "B");
        let base = EngineConfig::default();
        let e = spec.engine(&base);
        assert_eq!((e.step.base_us, e.step.per_decode_seq_us), (66_000, 6_000));
        assert_eq!(e.step.per_prefill_token_us, 600.0);
        assert_eq!((e.max_num_seqs, e.kv_capacity_blocks), (4, 80));
        assert_eq!(e.block_size, base.block_size);
        // A replica 3× as fast: terms rounded to whole µs; the step of 8 decodes within 1 µs.
        let fast = ReplicaSpec::parse("C:speed=3").unwrap().engine(&base);
        assert_eq!(fast.step.base_us, 11_000);
        assert!(
            fast.step
                .step_us(8, 0)
                .abs_diff(base.step.step_us(8, 0) / 3)
                <= 1
        );
        assert_eq!(ReplicaSpec::parse("A").unwrap().engine(&base), base);
        assert_eq!(ReplicaSpec::parse("A:").unwrap(), ReplicaSpec::plain("A"));
    }

    #[test]
    fn bad_values_are_errors_naming_them() {
        for (s, want) in [
            (":speed=1", ReplicaSpecError::Name(":speed=1".into())),
            ("A,B", ReplicaSpecError::Name("A,B".into())),
            ("A:fast", ReplicaSpecError::UnknownSetting("fast".into())),
            (
                "A:gpus=2",
                ReplicaSpecError::UnknownSetting("gpus=2".into()),
            ),
            ("A:speed=1,speed=2", ReplicaSpecError::Repeated("speed")),
            (
                "A:kv-blocks=1,kv-blocks=2",
                ReplicaSpecError::Repeated("kv-blocks"),
            ),
            (
                "A:max-num-seqs=2,max-num-seqs=2",
                ReplicaSpecError::Repeated("max-num-seqs"),
            ),
        ] {
            assert_eq!(ReplicaSpec::parse(s), Err(want), "{s}");
        }
        for s in [
            "A:speed=0",
            "A:speed=-1",
            "A:speed=inf",
            "A:speed=x",
            "A:max-num-seqs=0",
            "A:kv-blocks=1.5",
        ] {
            assert!(
                matches!(ReplicaSpec::parse(s), Err(ReplicaSpecError::Value { .. })),
                "{s}"
            );
        }
    }
}
