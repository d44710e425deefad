//! Requests tokenized as the engine tokenizes them, for the models given a tokenizer in the
//! configuration (`[tokenizers."<model>"]`), so that the prefix index is keyed by the engine's
//! own cache blocks (token blocks) instead of 128-byte text blocks.
//!
//! - `/v1/completions`: a `prompt` string is encoded as vLLM's completions endpoint does
//!   (special tokens added: BOS for Llama-style tokenizers); a `prompt` that is already a list of
//!   token ids is used as it is. A batch (a list of strings or of lists) is not tokenized.
//! - `/v1/chat/completions`: `messages` rendered with the model's chat template
//!   (`add_generation_prompt`, as vLLM's default), then encoded without adding special tokens
//!   (the template writes them).
//! - The body's `cache_salt` (vLLM's per-request cache isolation) keys the first block.
//!
//! Tokenizing never decides whether a request is served: a body the tokenizer cannot take (a
//! template that raises, a prompt of another type) is routed on text blocks as without a
//! tokenizer, and counted (`kvroute_tokenize_requests_total{result="error"}`).
//!
//! Cost: each model has a bounded prefix store ([`kvroute_tokens::PrefixStore`]) so that a
//! prompt whose long prefix was seen is tokenized only past it. kvroute-ext-proc tokenizes on
//! tokio's blocking pool, at most as many at once as the machine has cores
//! ([`Tokenizers::permits`]), so that a burst of long prompts cannot stall the gRPC runtime.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvroute_core::body::Endpoint;
use kvroute_core::DEFAULT_BLOCK_TOKENS;
use kvroute_tokens::{ModelTokenizer, PrefixStore};
use serde::Deserialize;
use serde_json::Value;

/// Default size of a model's prefix store, in MiB.
pub const DEFAULT_PREFIX_STORE_MIB: u64 = 64;

/// `[tokenizers."<model>"]` as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerSection {
    /// The model's `tokenizer.json`, or the directory holding it (and, beside it,
    /// `tokenizer_config.json` with the chat template).
    pub path: PathBuf,
    /// The engine's KV-cache block size in tokens (vLLM `--block-size`); default 16.
    #[serde(default)]
    pub block_tokens: Option<u32>,
    /// The prefix store's memory bound, MiB (0: no store); default 64.
    #[serde(default)]
    pub prefix_store_mib: Option<u64>,
}

/// A model's validated tokenizer settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizerSpec {
    /// `tokenizer.json`.
    pub tokenizer_json: PathBuf,
    /// `tokenizer_config.json`, when there is one beside it.
    pub tokenizer_config: Option<PathBuf>,
    /// Token block size.
    pub block_tokens: u32,
    /// Prefix store bound in bytes.
    pub store_bytes: usize,
}

impl TokenizerSection {
    /// Validates the section of `model`: the block size's range, and where the files are
    /// (existence is checked when they are loaded).
    pub fn to_spec(&self, model: &str) -> Result<TokenizerSpec, String> {
        let block_tokens = self.block_tokens.unwrap_or(DEFAULT_BLOCK_TOKENS);
        kvroute_core::TokenKeyConfig::new(block_tokens, 0)
            .map_err(|e| format!("[tokenizers.\"{model}\"] block_tokens: {e}"))?;
        if self.path.as_os_str().is_empty() {
            return Err(format!("[tokenizers.\"{model}\"] path is empty"));
        }
        let (tokenizer_json, dir) = if self.path.is_dir() {
            (self.path.join("tokenizer.json"), self.path.clone())
        } else {
            let dir = self
                .path
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            (self.path.clone(), dir)
        };
        let config = dir.join("tokenizer_config.json");
        let mib = self.prefix_store_mib.unwrap_or(DEFAULT_PREFIX_STORE_MIB);
        Ok(TokenizerSpec {
            tokenizer_json,
            tokenizer_config: config.is_file().then_some(config),
            block_tokens,
            store_bytes: usize::try_from(mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
        })
    }
}

/// A tokenizer that did not load.
#[derive(Debug, thiserror::Error)]
#[error("tokenizer of model {model:?} ({path}): {source}")]
pub struct TokenizerLoadError {
    /// The model.
    pub model: String,
    /// Its `tokenizer.json`.
    pub path: String,
    /// Why.
    pub source: kvroute_tokens::LoadError,
}

/// One model's tokenizer, prefix store and block size.
#[derive(Debug)]
pub struct ModelTokens {
    spec: TokenizerSpec,
    tokenizer: ModelTokenizer,
    store: Option<PrefixStore>,
}

/// A prompt as token ids, with what keys its blocks besides them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokenized {
    /// The token ids the engine will see.
    pub ids: Vec<u32>,
    /// The block size to key them at.
    pub block_tokens: u32,
    /// The body's `cache_salt`.
    pub cache_salt: Option<String>,
}

/// Why a body was not tokenized (it is then routed on text blocks).
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// The body is not a JSON object.
    #[error("the body is not a JSON object")]
    Body,
    /// The tokenizer or the chat template refused it.
    #[error(transparent)]
    Encode(#[from] kvroute_tokens::EncodeError),
}

impl ModelTokens {
    fn load(model: &str, spec: &TokenizerSpec) -> Result<ModelTokens, TokenizerLoadError> {
        let tokenizer =
            ModelTokenizer::from_files(&spec.tokenizer_json, spec.tokenizer_config.as_deref())
                .map_err(|source| TokenizerLoadError {
                    model: model.to_owned(),
                    path: spec.tokenizer_json.display().to_string(),
                    source,
                })?;
        Ok(ModelTokens {
            spec: spec.clone(),
            tokenizer,
            store: (spec.store_bytes > 0).then(|| PrefixStore::with_capacity(spec.store_bytes)),
        })
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        Ok(match &self.store {
            Some(store) => self
                .tokenizer
                .encode_cached(store, text, add_special_tokens)?,
            None if add_special_tokens => self.tokenizer.encode_completion(text)?,
            None => self.tokenizer.encode(text, false)?,
        })
    }

    /// The request body's prompt as token ids (see the module docs); `Ok(None)` for an
    /// endpoint or a prompt shape that is not tokenized.
    pub fn tokenize(
        &self,
        endpoint: Endpoint,
        body: &serde_json::Map<String, Value>,
    ) -> Result<Option<Tokenized>, TokenizeError> {
        let ids = match endpoint {
            Endpoint::Completions => match body.get("prompt") {
                Some(Value::String(text)) => self.encode(text, true)?,
                Some(Value::Array(items)) if !items.is_empty() => {
                    let ids: Option<Vec<u32>> = items
                        .iter()
                        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                        .collect();
                    match ids {
                        Some(ids) => ids,
                        None => return Ok(None),
                    }
                }
                _ => return Ok(None),
            },
            Endpoint::ChatCompletions => match body.get("messages") {
                Some(messages @ Value::Array(_)) => {
                    let add_generation_prompt = body
                        .get("add_generation_prompt")
                        .and_then(Value::as_bool)
                        .unwrap_or(true);
                    let text = self
                        .tokenizer
                        .render_chat(messages, add_generation_prompt)?;
                    self.encode(&text, false)?
                }
                _ => return Ok(None),
            },
            _ => return Ok(None),
        };
        Ok(Some(Tokenized {
            ids,
            block_tokens: self.spec.block_tokens,
            cache_salt: body
                .get("cache_salt")
                .and_then(Value::as_str)
                .map(str::to_owned),
        }))
    }
}

/// Every configured model's tokenizer.
#[derive(Debug, Default)]
pub struct Tokenizers {
    models: BTreeMap<String, Arc<ModelTokens>>,
}

impl Tokenizers {
    /// Loads the tokenizers of `specs`; one whose settings did not change since `previous`
    /// is kept as it is (with its prefix store).
    pub fn load(
        specs: &BTreeMap<String, TokenizerSpec>,
        previous: &Tokenizers,
    ) -> Result<Tokenizers, TokenizerLoadError> {
        let mut models = BTreeMap::new();
        for (model, spec) in specs {
            let loaded = match previous.models.get(model) {
                Some(kept) if kept.spec == *spec => kept.clone(),
                _ => Arc::new(ModelTokens::load(model, spec)?),
            };
            models.insert(model.clone(), loaded);
        }
        Ok(Tokenizers { models })
    }

    /// Tokenizes a request body when the model it names has a tokenizer: `None` when it has
    /// none (or the body names no model), else the model and the result.
    pub fn tokenize(
        &self,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Option<(String, Result<Option<Tokenized>, TokenizeError>)> {
        if self.models.is_empty() {
            return None;
        }
        let parsed = serde_json::from_slice::<Value>(body);
        let model = match &parsed {
            Ok(Value::Object(o)) => o.get("model")?.as_str()?.to_owned(),
            _ => return None,
        };
        let tokens = self.models.get(&model)?;
        let Ok(Value::Object(body)) = parsed else {
            return Some((model, Err(TokenizeError::Body)));
        };
        Some((model, tokens.tokenize(endpoint, &body)))
    }

    /// The tokenizer of `model`, if it has one.
    pub fn get(&self, model: &str) -> Option<&Arc<ModelTokens>> {
        self.models.get(model)
    }

    /// Whether any model has a tokenizer.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// How many requests kvroute-ext-proc tokenizes at once: the machine's cores.
    pub fn permits() -> usize {
        std::thread::available_parallelism().map_or(2, usize::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tokenizer")
    }

    fn tokens() -> ModelTokens {
        let spec = TokenizerSection {
            path: fixture(),
            ..Default::default()
        }
        .to_spec("m")
        .unwrap();
        ModelTokens::load("m", &spec).unwrap()
    }

    #[test]
    fn sections_validate_and_find_the_config_beside_the_tokenizer() {
        let dir = TokenizerSection {
            path: fixture(),
            ..Default::default()
        };
        let spec = dir.to_spec("m").unwrap();
        assert_eq!(spec.tokenizer_json, fixture().join("tokenizer.json"));
        assert_eq!(
            spec.tokenizer_config,
            Some(fixture().join("tokenizer_config.json"))
        );
        assert_eq!(spec.block_tokens, 16);
        let file = TokenizerSection {
            path: fixture().join("tokenizer.json"),
            block_tokens: Some(32),
            prefix_store_mib: Some(0),
        };
        let spec2 = file.to_spec("m").unwrap();
        assert_eq!(spec2.tokenizer_config, spec.tokenizer_config);
        assert_eq!((spec2.block_tokens, spec2.store_bytes), (32, 0));
        for bad in [
            TokenizerSection {
                block_tokens: Some(0),
                ..dir.clone()
            },
            TokenizerSection::default(),
        ] {
            assert!(bad.to_spec("m").is_err(), "{bad:?}");
        }
        let missing = TokenizerSection {
            path: fixture().join("nope.json"),
            ..Default::default()
        }
        .to_spec("m")
        .unwrap();
        let err = Tokenizers::load(&[("m".to_owned(), missing)].into(), &Tokenizers::default())
            .unwrap_err();
        assert!(err.to_string().contains("nope.json"), "{err}");
    }

    #[test]
    fn bodies_are_tokenized_by_endpoint() {
        let t = tokens();
        let done = |endpoint, body: &str| match serde_json::from_str::<Value>(body) {
            Ok(Value::Object(o)) => t.tokenize(endpoint, &o),
            _ => Err(TokenizeError::Body),
        };
        let c = done(
            Endpoint::Completions,
            r#"{"model":"m","prompt":"hello world","cache_salt":"s1"}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.ids, t.tokenizer.encode_completion("hello world").unwrap());
        assert_eq!(c.cache_salt.as_deref(), Some("s1"));
        assert_eq!(c.block_tokens, 16);
        let ids = done(Endpoint::Completions, r#"{"prompt":[1,2,3]}"#)
            .unwrap()
            .unwrap();
        assert_eq!(ids.ids, vec![1, 2, 3]);
        let chat = done(
            Endpoint::ChatCompletions,
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .unwrap()
        .unwrap();
        let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
        assert_eq!(chat.ids, t.tokenizer.encode_chat(&messages, true).unwrap());
        // Not tokenized: batches, other endpoints, other shapes.
        for (endpoint, body) in [
            (Endpoint::Completions, r#"{"prompt":["a","b"]}"#),
            (Endpoint::Completions, r#"{"prompt":[1,-2]}"#),
            (Endpoint::Completions, r#"{"model":"m"}"#),
            (Endpoint::ChatCompletions, r#"{"messages":"x"}"#),
            (Endpoint::Other, r#"{"input":"x"}"#),
        ] {
            assert_eq!(done(endpoint, body).unwrap(), None, "{body}");
        }
        // Errors: not an object; a template that raises (bad role).
        assert!(done(Endpoint::Completions, "[1]").is_err());
        assert!(done(
            Endpoint::ChatCompletions,
            r#"{"messages":[{"role":"wizard","content":"x"}]}"#
        )
        .is_err());
    }

    #[test]
    fn an_unchanged_tokenizer_is_kept_on_reload() {
        let spec = TokenizerSection {
            path: fixture(),
            ..Default::default()
        }
        .to_spec("m")
        .unwrap();
        let specs: BTreeMap<String, TokenizerSpec> = [("m".to_owned(), spec.clone())].into();
        let first = Tokenizers::load(&specs, &Tokenizers::default()).unwrap();
        let again = Tokenizers::load(&specs, &first).unwrap();
        assert!(Arc::ptr_eq(
            first.get("m").unwrap(),
            again.get("m").unwrap()
        ));
        let changed: BTreeMap<String, TokenizerSpec> = [(
            "m".to_owned(),
            TokenizerSpec {
                block_tokens: 32,
                ..spec
            },
        )]
        .into();
        let other = Tokenizers::load(&changed, &first).unwrap();
        assert!(!Arc::ptr_eq(
            first.get("m").unwrap(),
            other.get("m").unwrap()
        ));
        assert!(other.get("n").is_none());
    }
}
