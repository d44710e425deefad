//! The two error types: [`LoadError`] (a model's files, at load) and [`EncodeError`] (one request).

use std::path::PathBuf;

/// A model's tokenizer files could not be loaded. Every check that can fail on the files
/// (parsing, template compilation) runs at load, so a loaded [`crate::ModelTokenizer`] never
/// fails on them at request time.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `tokenizer.json` is not a tokenizer the `tokenizers` library accepts.
    #[error("tokenizer.json: {0}")]
    Tokenizer(String),
    /// `tokenizer_config.json` is not JSON, or a field this crate reads has the wrong shape.
    #[error("tokenizer_config.json: {0}")]
    Config(String),
    /// A chat template does not compile.
    #[error("chat template {name:?} does not compile: {message}")]
    Template {
        /// The template's name (`default` for a single-string `chat_template`).
        name: String,
        /// The compiler's message, with line information.
        message: String,
    },
}

/// One request could not be tokenized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A chat request for a model whose `tokenizer_config.json` has no chat template (or no
    /// `default` one in the list form).
    #[error("the model has no chat template")]
    NoChatTemplate,
    /// The template called `raise_exception(message)`: the request is invalid for this model
    /// (a bad role, roles not alternating, ...). Holds the template's message verbatim.
    #[error("chat template error: {0}")]
    Template(String),
    /// The template failed otherwise while rendering (a type error, an unknown method, ...).
    #[error("chat template failed to render: {0}")]
    Render(String),
    /// `messages` is not a JSON array.
    #[error("messages must be a JSON array")]
    MessagesNotArray,
    /// `messages` is an empty array. transformers (and so vLLM) reject an empty conversation
    /// before rendering the template.
    #[error("empty conversation: no messages to apply the chat template to")]
    EmptyConversation,
    /// The `tokenizers` library failed on the text.
    #[error("tokenizer failed: {0}")]
    Tokenizer(String),
}
