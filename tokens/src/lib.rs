//! Tokenization of LLM requests exactly as vLLM does it, for routing by token blocks.
//!
//! - [`ModelTokenizer`]: one model's `tokenizer.json` (Hugging Face `tokenizers`) and
//!   `tokenizer_config.json` (chat template, special tokens). Completions are tokenized with
//!   `add_special_tokens = true`; chats are rendered with the chat template (compiled at load,
//!   in an environment mirroring transformers' `apply_chat_template`) and tokenized with
//!   `add_special_tokens = false`, as vLLM's OpenAI server does.
//! - [`PrefixStore`]: a memory-bounded cache of prompt prefixes and their ids, so a prompt whose
//!   long prefix was seen is tokenized only past it. [`ModelTokenizer::encode_cached`] returns
//!   exactly what [`ModelTokenizer::encode`] returns.
//!
//! Errors: [`LoadError`] for a model's files (all checks run at load), [`EncodeError`] for a
//! request.
//!
//! ```no_run
//! use kvroute_tokens::{ModelTokenizer, PrefixStore};
//! use std::path::Path;
//!
//! let model = ModelTokenizer::from_files(
//!     Path::new("tokenizer.json"),
//!     Some(Path::new("tokenizer_config.json")),
//! )?;
//! let store = PrefixStore::default();
//! let ids = model.encode_cached(&store, "a long shared document ... question", true)?;
//! assert_eq!(ids, model.encode_completion("a long shared document ... question")?);
//! let chat = serde_json::json!([{"role": "user", "content": "hi"}]);
//! let chat_ids = model.encode_chat(&chat, true)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod error;
pub mod fast;
mod hf_config;
mod pyfmt;
pub mod store;
mod template;
mod tokenizer;

pub use error::{EncodeError, LoadError};
pub use store::{PrefixStore, PrefixStoreConfig, StoreConfigError, StoreStats};
pub use tokenizer::{Engine, ModelTokenizer};
