//! The flags shared by the commands that run engines: the engine model's, the tokenizer's and
//! how the simulated router sees prompts.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::cluster::RouterBlocks;
use crate::engine::EngineConfig;
use crate::prompt_tokens::PromptReader;

/// Engine parameters shared by the commands that run engines.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Most sequences running at once.
    #[arg(long, default_value_t = EngineConfig::default().max_num_seqs)]
    max_num_seqs: u32,
    /// Token budget of one step.
    #[arg(long, default_value_t = EngineConfig::default().max_num_batched_tokens)]
    max_num_batched_tokens: u32,
    /// Prefix-cache block size in tokens.
    #[arg(long, default_value_t = EngineConfig::default().block_size)]
    block_size: u32,
    /// KV capacity in blocks.
    #[arg(long, default_value_t = EngineConfig::default().kv_capacity_blocks)]
    kv_blocks: u32,
    /// Step time model: fixed cost of every step, ms.
    #[arg(long, default_value_t = EngineConfig::default().step.base_us as f64 / 1000.0)]
    step_base_ms: f64,
    /// Step time model: cost per decoding sequence, ms.
    #[arg(long, default_value_t = EngineConfig::default().step.per_decode_seq_us as f64 / 1000.0)]
    step_per_seq_ms: f64,
    /// Step time model: cost per prefill token, µs.
    #[arg(long, default_value_t = EngineConfig::default().step.per_prefill_token_us)]
    prefill_token_us: f64,
    /// Step time model: a mixed step costs max(decode, prefill) instead of their sum.
    #[arg(long)]
    overlap: bool,
}

impl EngineArgs {
    /// The engine configuration these flags give.
    pub fn config(&self) -> EngineConfig {
        EngineConfig {
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            block_size: self.block_size,
            kv_capacity_blocks: self.kv_blocks,
            step: crate::engine::StepTimeModel {
                base_us: ms_to_us(self.step_base_ms),
                per_decode_seq_us: ms_to_us(self.step_per_seq_ms),
                per_prefill_token_us: self.prefill_token_us,
                overlap: self.overlap,
            },
            ..EngineConfig::default()
        }
    }
}

/// The tokenizer of the commands that run engines.
#[derive(Args, Debug, Clone)]
pub struct TokenizerArgs {
    /// Tokenize prompts with this Hugging Face tokenizer, as vLLM does: a directory holding
    /// tokenizer.json (and, optionally, tokenizer_config.json with the chat template), or a
    /// tokenizer.json file. Default: the built-in tokenizer model.
    #[arg(long, value_name = "PATH")]
    tokenizer: Option<PathBuf>,
}

impl TokenizerArgs {
    /// The prompt reader these flags give, or the error printed and exit code 2.
    pub fn reader(&self) -> Result<PromptReader, ExitCode> {
        match &self.tokenizer {
            None => Ok(PromptReader::built_in()),
            Some(path) => PromptReader::load(path).map_err(|e| {
                eprintln!("error: --tokenizer: {e}");
                ExitCode::from(2)
            }),
        }
    }
}

/// How the simulated router sees prompts (the commands that run the simulator).
#[derive(Args, Debug, Clone)]
pub(super) struct PromptArgs {
    #[command(flatten)]
    tokenizer: TokenizerArgs,
    /// What the router's prefix index is keyed by: text (128-byte blocks of the prompt) or
    /// tokens (blocks of --block-size tokens of the ids the engine receives). Default: tokens
    /// with --tokenizer, text without.
    #[arg(long, value_parser = ["text", "tokens"])]
    router_blocks: Option<String>,
    /// The engines publish their KV-cache events (blocks stored, evicted, cleared) and the
    /// router matches each pod against its engine's own record of its cache instead of the
    /// prompts it sent there (implies --router-blocks tokens).
    #[arg(long)]
    kv_events: bool,
}

impl PromptArgs {
    /// The prompt reader and the router's keying, or the error printed and exit code 2.
    pub(super) fn config(&self) -> Result<(PromptReader, Option<RouterBlocks>, bool), ExitCode> {
        let prompts = self.tokenizer.reader()?;
        // clap accepts only the two values.
        let blocks = self.router_blocks.as_deref().and_then(RouterBlocks::parse);
        if self.kv_events && blocks == Some(RouterBlocks::Text) {
            eprintln!(
                "error: --kv-events needs --router-blocks tokens (engines cache token blocks)"
            );
            return Err(ExitCode::from(2));
        }
        Ok((prompts, blocks, self.kv_events))
    }
}

fn ms_to_us(ms: f64) -> u64 {
    // Negative or non-finite values become 0; the engine validates the rest.
    if ms.is_finite() && ms > 0.0 {
        (ms * 1000.0).round() as u64
    } else {
        0
    }
}
