//! [`PromptReader`]: how a prompt becomes the token ids an engine receives, one tokenizer for
//! the simulator's engines, its router (when keyed by token blocks) and the fake server.
//!
//! - The built-in model ([`crate::tokenizer`], the default): deterministic, approximate BPE
//!   counts; a chat is tokenized as the `role: content` lines the fake server renders.
//! - A real Hugging Face tokenizer (`--tokenizer PATH`), loaded with `kvroute-tokens` and used as
//!   vLLM's OpenAI server uses it: completions are encoded with special tokens added (BOS),
//!   chats rendered with the model's chat template (`add_generation_prompt`) and encoded without.
//!   Each loaded tokenizer has a bounded [`PrefixStore`] (64 MiB), so that prompts sharing a long
//!   prefix are tokenized only past it (with the same ids).
//!
//! Where the files are, as kvroute-ext-proc's `[tokenizers."<model>"] path`: a directory holding
//! `tokenizer.json` (and, optionally, `tokenizer_config.json` with the chat template), or a
//! `tokenizer.json` file, with `tokenizer_config.json` taken from beside it when it is there.
//! Every check on the files runs at load ([`PromptReader::load`]); a loaded reader fails only
//! for a request's own reasons ([`EncodeError`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvroute_tokens::{EncodeError, ModelTokenizer, PrefixStore};
use serde_json::Value;

/// The prefix store's memory bound (kvroute-ext-proc's default).
const PREFIX_STORE_BYTES: usize = 64 << 20;

/// The built-in tokenizer model or a loaded tokenizer. Cheap to clone (a loaded tokenizer and
/// its prefix store are shared).
#[derive(Clone, Debug, Default)]
pub struct PromptReader {
    model: Option<Arc<Loaded>>,
}

#[derive(Debug)]
struct Loaded {
    /// The path as given.
    path: PathBuf,
    tokenizer: ModelTokenizer,
    store: PrefixStore,
}

/// A tokenizer that did not load: the path as given and why.
#[derive(Debug, thiserror::Error)]
#[error("cannot load the tokenizer at {}: {source}", .path.display())]
pub struct TokenizerLoadError {
    /// The path as given (a directory or a `tokenizer.json`).
    pub path: PathBuf,
    /// Why.
    pub source: kvroute_tokens::LoadError,
}

/// Where a tokenizer's files are: `tokenizer.json` and, when there is one beside it,
/// `tokenizer_config.json` (see the module docs). Existence is checked when they are read.
pub fn tokenizer_files(path: &Path) -> (PathBuf, Option<PathBuf>) {
    let (tokenizer_json, dir) = if path.is_dir() {
        (path.join("tokenizer.json"), path.to_path_buf())
    } else {
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        (path.to_path_buf(), dir)
    };
    let config = dir.join("tokenizer_config.json");
    (tokenizer_json, config.is_file().then_some(config))
}

impl PromptReader {
    /// The built-in tokenizer model.
    pub fn built_in() -> Self {
        PromptReader::default()
    }

    /// Loads the tokenizer at `path` (a directory or a `tokenizer.json`, see the module docs).
    pub fn load(path: &Path) -> Result<Self, TokenizerLoadError> {
        let (tokenizer_json, config) = tokenizer_files(path);
        let tokenizer =
            ModelTokenizer::from_files(&tokenizer_json, config.as_deref()).map_err(|source| {
                TokenizerLoadError {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        Ok(PromptReader {
            model: Some(Arc::new(Loaded {
                path: path.to_path_buf(),
                tokenizer,
                store: PrefixStore::with_capacity(PREFIX_STORE_BYTES),
            })),
        })
    }

    /// Whether this is the built-in model.
    pub fn is_built_in(&self) -> bool {
        self.model.is_none()
    }

    /// The loaded tokenizer's path as given, or `None` for the built-in model.
    pub fn path(&self) -> Option<&Path> {
        self.model.as_ref().map(|m| m.path.as_path())
    }

    /// The loaded tokenizer, or `None` for the built-in model.
    pub fn model(&self) -> Option<&ModelTokenizer> {
        self.model.as_ref().map(|m| &m.tokenizer)
    }

    /// A completion prompt's ids (`/v1/completions`, or a simulated request's text): special
    /// tokens added with a real tokenizer, as vLLM adds them. The built-in model never fails.
    pub fn completion(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        match &self.model {
            None => Ok(crate::tokenizer::tokenize(text)),
            Some(m) => m.tokenizer.encode_completion_cached(&m.store, text),
        }
    }

    /// A chat's ids (`/v1/chat/completions`): with a real tokenizer, `messages` (a JSON array,
    /// passed to the template as given) rendered with the model's chat template and the
    /// generation prompt, as vLLM's default; with the built-in model, `rendered` (the
    /// conversation as the fake server writes it) tokenized.
    pub fn chat(&self, messages: &Value, rendered: &str) -> Result<Vec<u32>, EncodeError> {
        match &self.model {
            None => Ok(crate::tokenizer::tokenize(rendered)),
            Some(m) => m.tokenizer.encode_chat_cached(&m.store, messages, true),
        }
    }
}

impl std::fmt::Display for PromptReader {
    /// `built-in` or `tokenizer PATH`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.path() {
            None => f.write_str("built-in"),
            Some(p) => write!(f, "tokenizer {}", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tokenizer")
    }

    #[test]
    fn the_path_is_a_directory_or_a_tokenizer_json_with_its_config_beside_it() {
        let dir = fixture();
        let (json, config) = tokenizer_files(&dir);
        assert_eq!(json, dir.join("tokenizer.json"));
        assert_eq!(config, Some(dir.join("tokenizer_config.json")));
        assert_eq!(tokenizer_files(&json), (json.clone(), config));
        let nowhere = Path::new("/no/such/dir/tokenizer.json");
        assert_eq!(tokenizer_files(nowhere), (nowhere.to_path_buf(), None));
    }

    #[test]
    fn a_loaded_tokenizer_gives_vllms_ids_and_the_built_in_model_its_own() {
        let real = PromptReader::load(&fixture()).unwrap();
        assert!(!real.is_built_in());
        let model = real.model().unwrap();
        let text = "The router keys blocks of tokens. ".repeat(20);
        let ids = real.completion(&text).unwrap();
        assert_eq!(ids, model.encode_completion(&text).unwrap());
        // Again, through the prefix store: the same ids.
        assert_eq!(real.completion(&text).unwrap(), ids);
        let messages = serde_json::json!([{"role": "user", "content": text}]);
        assert_eq!(
            real.chat(&messages, "ignored").unwrap(),
            model.encode_chat(&messages, true).unwrap()
        );
        let bad = serde_json::json!([{"role": "wizard", "content": "x"}]);
        assert!(real.chat(&bad, "").is_err());

        let built_in = PromptReader::built_in();
        assert!(built_in.is_built_in() && built_in.model().is_none());
        assert_eq!(
            built_in.completion(&text).unwrap(),
            crate::tokenizer::tokenize(&text)
        );
        assert_eq!(
            built_in.chat(&messages, "user: hi\n").unwrap(),
            crate::tokenizer::tokenize("user: hi\n")
        );
        assert_eq!(built_in.to_string(), "built-in");
        assert!(real.to_string().ends_with("tests/tokenizer"));
    }

    #[test]
    fn a_missing_tokenizer_is_an_error_naming_the_path() {
        let err = PromptReader::load(Path::new("/no/such/tokenizer")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/no/such/tokenizer"), "{msg}");
        assert!(msg.starts_with("cannot load the tokenizer at"), "{msg}");
    }
}
