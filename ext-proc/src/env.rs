//! AIBrix's environment variables, read once at start-up into an [`EnvSnapshot`] and applied
//! over the file on every (re)load.
//!
//! Unlike AIBrix, which silently falls back to defaults on unparsable values, an unusable
//! value is an [`EnvError`]: the process refuses to start rather than route differently from
//! what the operator wrote.

use std::collections::BTreeMap;

use crate::config::FileConfig;

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

    /// Writes every present variable over the file's value.
    pub fn apply(&self, file: &mut FileConfig) -> Result<(), EnvError> {
        if let Some(v) = self.get("ROUTING_ALGORITHM") {
            // AIBrix: set-but-empty is an invalid strategy; the strategy parser reports it.
            file.routing.default_strategy = Some(v.to_owned());
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
        let pc = &mut file.prefix_cache;
        if let Some(v) = self.num("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "block size")? {
            pc.block_size = Some(v);
        }
        if let Some(v) = self.num("AIBRIX_PREFIX_CACHE_BLOCK_NUMBER", "block count")? {
            pc.block_number = Some(v);
        }
        if let Some(v) = self.num(
            "AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS",
            "number of minutes",
        )? {
            pc.eviction_duration_mins = Some(v);
        }
        if let Some(v) = self.num(
            "AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT",
            "count",
        )? {
            pc.imbalance_abs_count = Some(v);
        }
        if let Some(v) = self.num("AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "number")? {
            pc.standard_deviation_factor = Some(v);
        }
        if let Some(v) = self.num("AIBRIX_PREFIX_CACHE_HASH_SEED", "unsigned 64-bit integer")? {
            pc.hash_seed = Some(v);
        }
        if let Some(v) = self.num("AIBRIX_GRPC_MAX_MESSAGE_SIZE_BYTES", "byte count")? {
            file.limits.max_body_bytes = Some(v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_applied_and_bad_ones_rejected() {
        let mut f = FileConfig::default();
        EnvSnapshot::from_pairs(&[("AIBRIX_PREFIX_CACHE_BLOCK_NUMBER", "10"), ("PATH", "/x")])
            .apply(&mut f)
            .unwrap();
        assert_eq!(f.prefix_cache.block_number, Some(10));

        let bad = EnvSnapshot::from_pairs(&[("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "big")]);
        assert!(matches!(bad.apply(&mut f), Err(EnvError::Invalid { .. })));
        let tik = EnvSnapshot::from_pairs(&[("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", "tiktoken")]);
        assert!(matches!(
            tik.apply(&mut f),
            Err(EnvError::Unsupported { .. })
        ));
        let chr = EnvSnapshot::from_pairs(&[("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", "character")]);
        assert_eq!(chr.apply(&mut f), Ok(()));
    }
}
