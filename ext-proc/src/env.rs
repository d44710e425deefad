//! AIBrix's environment variables, read once at start-up into an [`EnvSnapshot`] and applied
//! over the file on every (re)load.
//!
//! Unlike AIBrix, which silently falls back to defaults on unparsable values, an unusable
//! value is an [`EnvError`]: the process refuses to start rather than route differently from
//! what the operator wrote.

use std::collections::BTreeMap;

/// Variables read, with AIBrix's names.
pub const ENV_NAMES: [&str; 10] = [
    "ROUTING_ALGORITHM",
    "AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE",
    "AIBRIX_PREFIX_CACHE_BLOCK_SIZE",
    "AIBRIX_PREFIX_CACHE_BLOCK_NUMBER",
    "AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS",
    "AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT",
    "AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR",
    "AIBRIX_PREFIX_CACHE_HASH_SEED",
    "AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED",
    "AIBRIX_GRPC_MAX_MESSAGE_SIZE_BYTES",
];

/// An environment variable with a value kvroute cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// Not a number of the expected kind.
    #[error("environment variable {name}={value:?} is not a valid {expected}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A value naming a feature kvroute does not have.
    #[error("environment variable {name}={value:?} is not supported by kvroute ({why})")]
    Unsupported {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why.
        why: &'static str,
    },
}

/// The AIBrix variables present at start-up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvSnapshot {
    vars: BTreeMap<&'static str, String>,
}

impl EnvSnapshot {
    /// Reads [`ENV_NAMES`] from the process environment. Non-UTF-8 values count as absent.
    pub fn from_process() -> Self {
        let vars = ENV_NAMES
            .iter()
            .filter_map(|&n| std::env::var(n).ok().map(|v| (n, v)))
            .collect();
        EnvSnapshot { vars }
    }

    /// A snapshot from explicit pairs (tests). Names not in [`ENV_NAMES`] are ignored.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Self {
        let vars = pairs
            .iter()
            .filter_map(|(k, v)| {
                ENV_NAMES
                    .iter()
                    .find(|n| *n == k)
                    .map(|&n| (n, (*v).to_owned()))
            })
            .collect();
        EnvSnapshot { vars }
    }

    fn get(&self, name: &'static str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    fn num<T: std::str::FromStr>(
        &self,
        name: &'static str,
        expected: &'static str,
    ) -> Result<Option<T>, EnvError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.trim().parse().map(Some).map_err(|_| EnvError::Invalid {
                name,
                value: v.to_owned(),
                expected,
            }),
        }
    }

    /// The values of the variables present, checked (the configuration layers them over
    /// the file's).
    pub fn values(&self) -> Result<EnvValues, EnvError> {
        let mut out = EnvValues::default();
        if let Some(v) = self.get("ROUTING_ALGORITHM") {
            // AIBrix: set-but-empty is an invalid strategy; the strategy parser reports it.
            out.default_strategy = Some(v.to_owned());
        }
        if let Some(v) = self.get("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE") {
            if !v.trim().eq_ignore_ascii_case("character") {
                let name = "AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE";
                let why = "only the character tokenizer is implemented";
                return Err(EnvError::Unsupported {
                    name,
                    value: v.to_owned(),
                    why,
                });
            }
        }
        if let Some(v) = self.get("AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED") {
            if v.trim().eq_ignore_ascii_case("true") {
                let name = "AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED";
                return Err(EnvError::Unsupported {
                    name,
                    value: v.to_owned(),
                    why: "KV-event sync is not implemented",
                });
            }
        }
        if let Some(v) = self.num("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "block size")? {
            out.block_size = Some(v);
        }
        if let Some(v) = self.num("AIBRIX_PREFIX_CACHE_BLOCK_NUMBER", "block count")? {
            out.block_number = Some(v);
        }
        if let Some(v) = self.num(
            "AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS",
            "number of minutes",
        )? {
            out.eviction_duration_mins = Some(v);
        }
        if let Some(v) = self.num(
            "AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT",
            "count",
        )? {
            out.imbalance_abs_count = Some(v);
        }
        if let Some(v) = self.num("AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "number")? {
            out.standard_deviation_factor = Some(v);
        }
        if let Some(v) = self.num("AIBRIX_PREFIX_CACHE_HASH_SEED", "unsigned 64-bit integer")? {
            out.hash_seed = Some(v);
        }
        if let Some(v) = self.num("AIBRIX_GRPC_MAX_MESSAGE_SIZE_BYTES", "byte count")? {
            out.max_body_bytes = Some(v);
        }
        Ok(out)
    }
}

/// The AIBrix variables' values, as they override the configuration file's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnvValues {
    /// `ROUTING_ALGORITHM`
    pub default_strategy: Option<String>,
    /// `AIBRIX_PREFIX_CACHE_BLOCK_SIZE`
    pub block_size: Option<usize>,
    /// `AIBRIX_PREFIX_CACHE_BLOCK_NUMBER`
    pub block_number: Option<usize>,
    /// `AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS`
    pub eviction_duration_mins: Option<u64>,
    /// `AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT`
    pub imbalance_abs_count: Option<u32>,
    /// `AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR`
    pub standard_deviation_factor: Option<f64>,
    /// `AIBRIX_PREFIX_CACHE_HASH_SEED`
    pub hash_seed: Option<u64>,
    /// `AIBRIX_GRPC_MAX_MESSAGE_SIZE_BYTES`
    pub max_body_bytes: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_applied_and_bad_ones_rejected() {
        let v =
            EnvSnapshot::from_pairs(&[("AIBRIX_PREFIX_CACHE_BLOCK_NUMBER", "10"), ("PATH", "/x")])
                .values()
                .unwrap();
        assert_eq!(v.block_number, Some(10));

        let bad = EnvSnapshot::from_pairs(&[("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "big")]);
        assert!(matches!(bad.values(), Err(EnvError::Invalid { .. })));
        let tik = EnvSnapshot::from_pairs(&[("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", "tiktoken")]);
        assert!(matches!(tik.values(), Err(EnvError::Unsupported { .. })));
        let chr = EnvSnapshot::from_pairs(&[("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", "character")]);
        assert_eq!(chr.values(), Ok(EnvValues::default()));
    }
}
