//! Router configuration: every constant of the routing behaviour, with the value AIBrix ships.

use crate::hash::{mix64, HashConfig, InvalidBlockSize, DEFAULT_BLOCK_SIZE};
use crate::health::HealthConfig;
use crate::strategy::StrategySpec;
use crate::ttft::TtftConfig;

/// Default prefix-index capacity in blocks (`AIBRIX_PREFIX_CACHE_BLOCK_NUMBER`).
pub const DEFAULT_INDEX_CAPACITY: usize = 200_000;
/// Default time a pod's index entry stays valid after it was last written: 20 minutes
/// (`AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS`).
pub const DEFAULT_INDEX_TTL_MS: u64 = 20 * 60 * 1000;
/// Default [`RouterConfig::engine_view_pending_ms`]: 30 s.
pub const DEFAULT_ENGINE_VIEW_PENDING_MS: u64 = 30_000;
/// Default lifetime of a ticket that is never completed: 30 minutes, longer than any sane
/// generation, so only a lost completion signal reaches it.
pub const DEFAULT_TICKET_TTL_MS: u64 = 30 * 60 * 1000;
/// Default imbalance threshold: `max − min > 16` in-flight requests
/// (`AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT` as shipped).
pub const DEFAULT_IMBALANCE_ABS_COUNT: u32 = 16;
/// Default `k` in the `load ≤ μ + k·σ` filter (`AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR`
/// as shipped).
pub const DEFAULT_STDDEV_FACTOR: f64 = 2.0;

/// Everything the router needs to be built. Fields are public; [`crate::Router::new`] validates
/// them and returns a [`ConfigError`] for values it cannot work with.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterConfig {
    /// Seed material for every random choice (PRNG, hasher keys and, unless
    /// [`RouterConfig::hash_seed`] is set, the prompt-hash seed). Shells pass fresh OS
    /// randomness in production and a fixed value in tests; same seed + same calls = same
    /// decisions.
    pub seed: u64,
    /// The XXH64 seed of the prompt hash chain. Set it (to the same value everywhere) when
    /// several routers must agree on block hashes; `None` derives it from [`RouterConfig::seed`].
    /// AIBrix's `AIBRIX_PREFIX_CACHE_HASH_SEED`.
    pub hash_seed: Option<u64>,
    /// Block size in bytes of the character tokenizer's byte stream (default 128).
    pub block_size: usize,
    /// Prefix-index capacity in blocks, across all models and pods; inserting beyond it evicts
    /// the least recently written block (default 200,000).
    pub index_capacity: usize,
    /// A pod's index entry is ignored, and the block dropped once no pod's entry is fresh, this
    /// long after its last write (default 20 min).
    pub index_ttl_ms: u64,
    /// For a pod matched against its engine view (its KV events), a prompt the router sent it
    /// this recently counts as cached there too: its blocks are being computed, and the engine
    /// reports them only once they are (default 30 s; 0: the view alone).
    pub engine_view_pending_ms: u64,
    /// A ticket not completed within this time is expired and its in-flight slot released
    /// (default 30 min). A safety net only: shells must complete every ticket.
    pub ticket_ttl_ms: u64,
    /// prefix-cache's imbalance guard fires when `max − min` in-flight exceeds this (default 16).
    pub imbalance_abs_count: u32,
    /// `k` in prefix-cache's `load ≤ μ + k·σ` filter (default 2).
    pub stddev_factor: f64,
    /// The strategy used when a request names none (AIBrix's `ROUTING_ALGORITHM`).
    pub default_strategy: StrategySpec,
    /// The TTFT model behind `least-ttft` (and the predictions every decision carries).
    pub ttft: TtftConfig,
    /// Pod health: outcome-based ejection and active checks (Envoy-like defaults).
    pub health: HealthConfig,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            seed: 0,
            hash_seed: None,
            block_size: DEFAULT_BLOCK_SIZE,
            index_capacity: DEFAULT_INDEX_CAPACITY,
            index_ttl_ms: DEFAULT_INDEX_TTL_MS,
            engine_view_pending_ms: DEFAULT_ENGINE_VIEW_PENDING_MS,
            ticket_ttl_ms: DEFAULT_TICKET_TTL_MS,
            imbalance_abs_count: DEFAULT_IMBALANCE_ABS_COUNT,
            stddev_factor: DEFAULT_STDDEV_FACTOR,
            default_strategy: StrategySpec::default(),
            ttft: TtftConfig::default(),
            health: HealthConfig::default(),
        }
    }
}

/// A configuration value the router cannot work with.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The block size is out of range.
    #[error(transparent)]
    BlockSize(#[from] InvalidBlockSize),
    /// The index capacity is zero.
    #[error("index capacity must be at least 1 block")]
    ZeroIndexCapacity,
    /// A time-to-live is zero.
    #[error("{0} must be at least 1 ms")]
    ZeroTtl(&'static str),
    /// A field of the TTFT model is out of range (named).
    #[error("{0} is out of range")]
    InvalidTtft(&'static str),
    /// A field of the health rules is out of range (named).
    #[error("{0} is out of range")]
    InvalidHealth(&'static str),
    /// The σ factor is negative or not finite.
    #[error("standard deviation factor must be finite and >= 0, got {0}")]
    InvalidStddevFactor(f64),
}

impl RouterConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.hash_config()?;
        if self.index_capacity == 0 {
            return Err(ConfigError::ZeroIndexCapacity);
        }
        if self.index_ttl_ms == 0 {
            return Err(ConfigError::ZeroTtl("index TTL"));
        }
        if self.ticket_ttl_ms == 0 {
            return Err(ConfigError::ZeroTtl("ticket TTL"));
        }
        if !self.stddev_factor.is_finite() || self.stddev_factor < 0.0 {
            return Err(ConfigError::InvalidStddevFactor(self.stddev_factor));
        }
        if let Some(field) = self.ttft.invalid_field() {
            return Err(ConfigError::InvalidTtft(field));
        }
        if let Some(field) = self.health.invalid_field() {
            return Err(ConfigError::InvalidHealth(field));
        }
        Ok(())
    }

    /// The hashing parameters this configuration implies.
    pub fn hash_config(&self) -> Result<HashConfig, ConfigError> {
        let seed = self
            .hash_seed
            .unwrap_or_else(|| mix64(self.seed ^ 0x6b76_726f_7574_6531));
        Ok(HashConfig::new(self.block_size, seed)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_aibrix_shipped_values_and_valid() {
        let c = RouterConfig::default();
        assert_eq!(c.block_size, 128);
        assert_eq!(c.index_capacity, 200_000);
        assert_eq!(c.imbalance_abs_count, 16);
        assert_eq!(c.stddev_factor, 2.0);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn hash_seed_is_derived_unless_fixed() {
        let a = RouterConfig {
            seed: 1,
            ..Default::default()
        };
        let b = RouterConfig {
            seed: 2,
            ..Default::default()
        };
        assert_ne!(
            a.hash_config().unwrap().seed(),
            b.hash_config().unwrap().seed()
        );
        let fixed = |seed| RouterConfig {
            seed,
            hash_seed: Some(9),
            ..Default::default()
        };
        assert_eq!(fixed(1).hash_config().unwrap().seed(), 9);
        assert_eq!(fixed(2).hash_config().unwrap().seed(), 9);
    }

    #[test]
    fn bad_values_are_rejected() {
        let bad = |c: RouterConfig| c.validate().unwrap_err();
        assert!(matches!(
            bad(RouterConfig {
                block_size: 0,
                ..Default::default()
            }),
            ConfigError::BlockSize(_)
        ));
        assert_eq!(
            bad(RouterConfig {
                index_capacity: 0,
                ..Default::default()
            }),
            ConfigError::ZeroIndexCapacity
        );
        assert!(matches!(
            bad(RouterConfig {
                ticket_ttl_ms: 0,
                ..Default::default()
            }),
            ConfigError::ZeroTtl(_)
        ));
        assert!(matches!(
            bad(RouterConfig {
                stddev_factor: -1.0,
                ..Default::default()
            }),
            ConfigError::InvalidStddevFactor(_)
        ));
        assert!(matches!(
            bad(RouterConfig {
                stddev_factor: f64::NAN,
                ..Default::default()
            }),
            ConfigError::InvalidStddevFactor(_)
        ));
    }
}
