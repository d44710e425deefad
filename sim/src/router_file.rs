//! Router parameters from a kvroute TOML file (`kvroute-sim run --router-config`): the `[ttft]`
//! and `[prefix_cache]` sections of kvroute-ext-proc's configuration file, with its names.
//!
//! ## Contract
//! - `[ttft]`: any of [`TtftConfig::KEYS`], each a number, set with [`TtftConfig::set`] (its
//!   range checks; counts must be whole numbers).
//! - `[prefix_cache]` (AIBrix's names, as kvroute-ext-proc reads them): `block_size` (bytes
//!   per text block), `block_number` (index capacity in blocks), `eviction_duration_mins`
//!   (index entry lifetime), `imbalance_abs_count`, `standard_deviation_factor`, `hash_seed`.
//! - A key left out keeps the configuration's value. Any other section or key, or a value of
//!   the wrong type, is an error naming it (a file of kvroute's other sections is refused,
//!   not half read); so is a configuration [`RouterConfig::validate`] refuses.

use std::collections::BTreeMap;

use kvroute_core::{RouterConfig, TtftConfig, TtftSettingError};
use serde::Deserialize;

/// A router file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RouterFileError {
    /// Not TOML, or a section, key or type the simulator does not read.
    #[error("line {line}: {message}")]
    Toml {
        /// 1-based line of the offending text.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A `[ttft]` key is unknown or its value out of range.
    #[error("[ttft]: {0}")]
    Ttft(#[from] TtftSettingError),
    /// The resulting configuration is invalid.
    #[error("{0}")]
    Invalid(#[from] kvroute_core::ConfigError),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouterFile {
    #[serde(default)]
    ttft: BTreeMap<String, f64>,
    #[serde(default)]
    prefix_cache: PrefixCache,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrefixCache {
    block_size: Option<usize>,
    block_number: Option<usize>,
    eviction_duration_mins: Option<u64>,
    imbalance_abs_count: Option<u32>,
    standard_deviation_factor: Option<f64>,
    hash_seed: Option<u64>,
}

/// Applies the file's settings (`text`) over `config`; on an error `config` is unchanged.
pub fn apply(text: &str, config: &mut RouterConfig) -> Result<(), RouterFileError> {
    let file: RouterFile = toml::from_str(text).map_err(|e| RouterFileError::Toml {
        line: e.span().map_or(1, |s| {
            1 + text[..s.start.min(text.len())].matches('\n').count()
        }),
        message: e.message().trim().to_owned(),
    })?;
    let mut next = config.clone();
    let mut ttft: TtftConfig = next.ttft.clone();
    for (key, value) in &file.ttft {
        ttft.set(key, *value)?;
    }
    next.ttft = ttft;
    let pc = file.prefix_cache;
    next.block_size = pc.block_size.unwrap_or(next.block_size);
    next.index_capacity = pc.block_number.unwrap_or(next.index_capacity);
    next.index_ttl_ms = pc
        .eviction_duration_mins
        .map_or(next.index_ttl_ms, |m| m.saturating_mul(60_000));
    next.imbalance_abs_count = pc.imbalance_abs_count.unwrap_or(next.imbalance_abs_count);
    next.stddev_factor = pc.standard_deviation_factor.unwrap_or(next.stddev_factor);
    next.hash_seed = pc.hash_seed.or(next.hash_seed);
    next.validate()?;
    *config = next;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sections_map_to_the_core_and_absent_keys_stay() {
        let mut c = RouterConfig {
            seed: 7,
            ..RouterConfig::default()
        };
        let text = "[ttft]\nengine_block_tokens = 1568\ntpot_ms = 57.5\nexplore_wait_ms = 0\n\
                    [prefix_cache]\nblock_size = 64\nblock_number = 1000\n\
                    eviction_duration_mins = 2\nimbalance_abs_count = 4\n\
                    standard_deviation_factor = 1.5\nhash_seed = 9\n";
        apply(text, &mut c).unwrap();
        let d = RouterConfig::default();
        assert_eq!(c.seed, 7);
        assert_eq!(c.ttft.engine_block_tokens, 1568);
        assert_eq!((c.ttft.tpot_ms, c.ttft.explore_wait_ms), (57.5, 0.0));
        assert_eq!(c.ttft.tie_ms, d.ttft.tie_ms);
        assert_eq!((c.block_size, c.index_capacity), (64, 1000));
        assert_eq!((c.index_ttl_ms, c.imbalance_abs_count), (120_000, 4));
        assert_eq!((c.stddev_factor, c.hash_seed), (1.5, Some(9)));
        let mut empty = RouterConfig::default();
        apply("", &mut empty).unwrap();
        assert_eq!(empty, d);
    }

    #[test]
    fn anything_else_is_an_error_naming_it_and_changes_nothing() {
        for (text, names) in [
            ("[listen]\naddr = \"x\"", "listen"),
            ("[ttft]\nbogus = 1", "bogus"),
            (
                "\n\n[ttft]\ntpot_ms = [1]",
                "line 4: invalid type: sequence",
            ),
            ("[ttft]\ntpot_ms = \"fast\"", "line 2: invalid type: string"),
            ("[ttft]\nmax_seqs = 1.5", "max_seqs"),
            ("[ttft]\nlearning_rate = 1.5", "learning_rate"),
            ("[prefix_cache]\nblock_sise = 64", "block_sise"),
            ("[prefix_cache]\nblock_size = 0", "block size"),
            (
                "[prefix_cache]\nimbalance_abs_count = -1",
                "line 2: invalid value",
            ),
            ("ttft = 3", "line 1: invalid type: integer"),
        ] {
            let mut c = RouterConfig::default();
            let e = apply(text, &mut c).expect_err(text).to_string();
            assert!(e.contains(names), "{text}: {e}");
            assert_eq!(c, RouterConfig::default(), "{text}");
        }
    }
}
