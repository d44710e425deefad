//! Engine parameters: the scheduler limits, the prefix-cache geometry and the step-time model.
//!
//! The defaults are the seed study's vLLM V1 replica (one L20, a 27B FP8 hybrid model), calibrated
//! so that the simulated study reproduces the study's facts. See `sim/README.md` ("Calibration")
//! for the reasoning behind each number.

use serde::{Deserialize, Serialize};

/// Per-step time model: `step = base + per_decode_seq × decode_seqs + per_prefill_token ×
/// prefill_tokens`, in microseconds.
///
/// With the defaults a pure-decode step of 8 sequences takes 57 ms (the study's TPOT floor), a
/// lone 5,000-token prefill 1.5 s (≈ 3,300 tokens/s) and a cache hit's ~340-token tail adds
/// ~0.1 s to the step it joins. `sim/README.md` ("Calibration") gives the reasons.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepTimeModel {
    /// Fixed cost of every step (weights read, scheduling, sampling), µs.
    pub base_us: u64,
    /// Cost of each sequence that decodes one token in the step, µs.
    pub per_decode_seq_us: u64,
    /// Cost of each prompt token computed in the step (chunked prefill), µs.
    pub per_prefill_token_us: f64,
    /// Roofline mode: a mixed step costs `max(decode, prefill)` instead of their sum, because
    /// the prefill's compute overlaps the decode's memory-bound weight reads.
    pub overlap: bool,
}

impl Default for StepTimeModel {
    fn default() -> Self {
        StepTimeModel {
            base_us: 33_000,
            per_decode_seq_us: 3_000,
            per_prefill_token_us: 300.0,
            overlap: false,
        }
    }
}

impl StepTimeModel {
    /// The duration of a step with `decode_seqs` decoding sequences and `prefill_tokens` prompt
    /// tokens, in µs (at least 1).
    pub fn step_us(&self, decode_seqs: u32, prefill_tokens: u32) -> u64 {
        let prefill = (self.per_prefill_token_us * f64::from(prefill_tokens)).round() as u64;
        let decode = self.base_us + self.per_decode_seq_us * u64::from(decode_seqs);
        if self.overlap {
            decode.max(prefill).max(1)
        } else {
            (decode + prefill).max(1)
        }
    }
}

/// Everything an [`crate::engine::Engine`] needs. Defaults: the study's replica.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineConfig {
    /// Most sequences running at once (`--max-num-seqs`, 8).
    pub max_num_seqs: u32,
    /// Token budget of one step (`--max-num-batched-tokens`, 8192). Prefills longer than what is
    /// left of it are chunked over several steps.
    pub max_num_batched_tokens: u32,
    /// Longest prompt + output accepted (`--max-model-len`, 32768).
    pub max_model_len: u32,
    /// Prefix-cache block size in tokens (1,568: the hybrid model's attention alignment).
    pub block_size: u32,
    /// KV capacity in blocks. Unreferenced cached blocks are evicted least recently used first.
    pub kv_capacity_blocks: u32,
    /// Whether prompt prefixes are reused (`--enable-prefix-caching`).
    pub prefix_caching: bool,
    /// The step-time model.
    pub step: StepTimeModel,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 8192,
            max_model_len: 32_768,
            block_size: 1568,
            kv_capacity_blocks: 160,
            prefix_caching: true,
            step: StepTimeModel::default(),
        }
    }
}

/// A configuration the engine cannot run with.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EngineConfigError {
    /// A limit is zero.
    #[error("engine parameter {0} must be at least 1")]
    Zero(&'static str),
    /// The per-token prefill cost is negative or not finite.
    #[error("per-prefill-token cost must be finite and >= 0, got {0}")]
    PrefillCost(f64),
    /// The KV capacity cannot hold even one sequence of `max_model_len` tokens.
    #[error("kv capacity of {blocks} blocks of {block_size} tokens cannot hold max-model-len {max_model_len}")]
    CapacityTooSmall {
        /// Blocks configured.
        blocks: u32,
        /// Tokens per block.
        block_size: u32,
        /// The longest sequence.
        max_model_len: u32,
    },
}

impl EngineConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), EngineConfigError> {
        for (name, v) in [
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_model_len", self.max_model_len),
            ("block_size", self.block_size),
            ("kv_capacity_blocks", self.kv_capacity_blocks),
        ] {
            if v == 0 {
                return Err(EngineConfigError::Zero(name));
            }
        }
        let c = self.step.per_prefill_token_us;
        if !c.is_finite() || c < 0.0 {
            return Err(EngineConfigError::PrefillCost(c));
        }
        if u64::from(self.kv_capacity_blocks) * u64::from(self.block_size)
            < u64::from(self.max_model_len)
        {
            return Err(EngineConfigError::CapacityTooSmall {
                blocks: self.kv_capacity_blocks,
                block_size: self.block_size,
                max_model_len: self.max_model_len,
            });
        }
        Ok(())
    }
}
