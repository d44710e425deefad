//! [`ModelTokenizer`]: one model's tokenizer and chat templates, used as vLLM uses them.

use std::path::Path;

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::error::{EncodeError, LoadError};
use crate::fast::FastEncoder;
use crate::hf_config::{HfConfig, DEFAULT_TEMPLATE};
use crate::store::{cuts, CoreEncoder, PrefixStore, WithCuts};
use crate::template::{ChatTemplates, RenderInput};

/// Which implementation produces the ids. Both give the same ids (checked at load, by the
/// property tests and by the golden cases); [`Engine::Fast`] is 20-50x faster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// This crate's byte-level BPE ([`crate::fast`]), for the tokenizer shapes it supports.
    Fast,
    /// The `tokenizers` library.
    Reference,
}

/// Texts on which the fast engine must agree with `tokenizers` for a model to use it.
const PROBES: &[&str] = &[
    "",
    "a",
    "Hello, world! It's 2024; we'll see: DON'T, 'S, \u{17f}'\u{17f}x 'll 've 're 'd 'm 't",
    "  leading and trailing  \t\n\r\n\n  \u{a0}x\u{3000}y\u{2028}z\u{85} end  ",
    "digits 1 12 123 1234 12345 \u{661}\u{662}\u{663} \u{b2}\u{bd} x1y22z333",
    "punct!!! ... --- === ((x)) {\"k\": [1, 2]} <a href='x'>y</a>\n\n\t- item\r\n",
    "caf\u{e9} cafe\u{301} \u{4e2d}\u{6587}\u{5b57} \u{1f469}\u{1f3fd}\u{200d}\u{1f4bb} \u{1f1fa}\u{1f1f8} \u{feff}\u{200b}x",
    "\u{1c}\u{1d}\u{1e}\u{1f}\u{0}\u{7}\u{7f} ctrl",
    "    indented code() {\n        return x;\n    }\n",
];

/// One model's tokenizer (`tokenizer.json`) and chat templates (`tokenizer_config.json`),
/// tokenizing as vLLM's OpenAI server does:
/// - completions: `encode(prompt, add_special_tokens = true)` (the post-processor adds BOS);
/// - chats: render the chat template, then `encode(rendered, add_special_tokens = false)` (the
///   template writes BOS itself).
///
/// Loading checks everything that could fail later on the files: a [`ModelTokenizer`] fails a
/// request only for the request's own reasons ([`EncodeError`]). It is `Send + Sync`; all
/// methods take `&self`.
pub struct ModelTokenizer {
    reference: Tokenizer,
    fast: Result<FastEncoder, String>,
    engine: Engine,
    templates: ChatTemplates,
    config: HfConfig,
    /// Ids the post-processor puts before and after every text with `add_special_tokens`, or
    /// `None` if it does not act as a fixed prefix and suffix.
    affix: Option<(Vec<u32>, Vec<u32>)>,
    fingerprint: u64,
    margin: usize,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("engine", &self.engine)
            .field("templates", &self.templates.names())
            .field("affix", &self.affix)
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    })
}

impl ModelTokenizer {
    /// Loads `tokenizer.json` and, if given, `tokenizer_config.json` (chat template and special
    /// tokens). Without a config, or with one without `chat_template`, completions work and chats
    /// fail with [`EncodeError::NoChatTemplate`].
    pub fn from_files(
        tokenizer_json: &Path,
        tokenizer_config_json: Option<&Path>,
    ) -> Result<Self, LoadError> {
        let tokenizer = read(tokenizer_json)?;
        let config = tokenizer_config_json.map(read).transpose()?;
        ModelTokenizer::from_bytes(&tokenizer, config.as_deref())
    }

    /// [`ModelTokenizer::from_files`] from the files' contents.
    pub fn from_bytes(
        tokenizer_json: &[u8],
        tokenizer_config_json: Option<&[u8]>,
    ) -> Result<Self, LoadError> {
        let mut reference = Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| LoadError::Tokenizer(e.to_string()))?;
        // transformers turns truncation and padding off unless a call asks for them; vLLM's
        // prompt tokenization does not.
        reference
            .with_truncation(None)
            .map_err(|e| LoadError::Tokenizer(e.to_string()))?;
        reference.with_padding(None);
        let json: Value = serde_json::from_slice(tokenizer_json)
            .map_err(|e| LoadError::Tokenizer(e.to_string()))?;
        let config = match tokenizer_config_json {
            Some(bytes) => HfConfig::parse(bytes)?,
            None => HfConfig::default(),
        };
        let templates = ChatTemplates::compile(&config.templates)?;
        let max_added = json
            .get("added_tokens")
            .and_then(Value::as_array)
            .map_or(0, |a| {
                a.iter()
                    .filter_map(|t| t.get("content").and_then(Value::as_str))
                    .map(str::len)
                    .max()
                    .unwrap_or(0)
            });
        let mut model = ModelTokenizer {
            fast: FastEncoder::from_json(&json),
            engine: Engine::Reference,
            reference,
            templates,
            config,
            affix: None,
            fingerprint: xxhash_rust::xxh3::xxh3_64(tokenizer_json),
            margin: (max_added + 2).max(16),
        };
        model.affix = model.probe_affix();
        model.fast = match std::mem::replace(&mut model.fast, Err(String::new())) {
            Ok(fast) => model.check_fast(&fast, &json).map(|()| fast),
            Err(why) => Err(why),
        };
        if model.fast.is_ok() {
            model.engine = Engine::Fast;
        }
        Ok(model)
    }

    /// Replaces the `default` chat template by `source` (as vLLM's `--chat-template`). Fails
    /// with [`LoadError::Template`] if it does not compile.
    pub fn with_chat_template(mut self, source: &str) -> Result<Self, LoadError> {
        let mut templates: Vec<(String, String)> = self
            .config
            .templates
            .iter()
            .filter(|(n, _)| n != DEFAULT_TEMPLATE)
            .cloned()
            .collect();
        templates.insert(0, (DEFAULT_TEMPLATE.to_string(), source.to_string()));
        self.templates = ChatTemplates::compile(&templates)?;
        self.config.templates = templates;
        Ok(self)
    }

    /// Selects the engine. [`Engine::Fast`] is selected only if the tokenizer supports it (see
    /// [`ModelTokenizer::fast_unsupported`]); check [`ModelTokenizer::engine`].
    pub fn with_engine(mut self, engine: Engine) -> Self {
        self.engine = match engine {
            Engine::Fast if self.fast.is_ok() => Engine::Fast,
            _ => Engine::Reference,
        };
        self
    }

    /// The engine in use (by default [`Engine::Fast`] when supported).
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Why the fast engine is not available for this tokenizer, if it is not.
    pub fn fast_unsupported(&self) -> Option<&str> {
        self.fast.as_ref().err().map(String::as_str)
    }

    /// The underlying `tokenizers` tokenizer (truncation and padding off).
    pub fn reference(&self) -> &Tokenizer {
        &self.reference
    }

    /// Names of the compiled chat templates (`default` is the one chats use).
    pub fn chat_template_names(&self) -> &[String] {
        self.templates.names()
    }

    /// `encode(text, add_special_tokens)` as `tokenizers` computes it.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, EncodeError> {
        match (&self.fast, self.engine, add_special_tokens, &self.affix) {
            (Ok(fast), Engine::Fast, false, _) => Ok(fast_ids(fast, text)),
            (Ok(fast), Engine::Fast, true, Some(affix)) => {
                Ok(with_affix(affix, fast_ids(fast, text)))
            }
            _ => self.reference_ids(text, add_special_tokens),
        }
    }

    fn reference_ids(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, EncodeError> {
        self.reference
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EncodeError::Tokenizer(e.to_string()))
    }

    /// A completion prompt's ids, as vLLM's completions endpoint computes them
    /// (`add_special_tokens = true`).
    pub fn encode_completion(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        self.encode(text, true)
    }

    /// The chat template's output for `messages` (a JSON array of message objects, passed to
    /// the template as given). Template variables: `messages`, `add_generation_prompt`, `tools`
    /// (none), `documents` (none), and `bos_token`, `eos_token`, `unk_token`, `pad_token` where
    /// the config sets them.
    pub fn render_chat(
        &self,
        messages: &Value,
        add_generation_prompt: bool,
    ) -> Result<String, EncodeError> {
        self.render_chat_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ModelTokenizer::render_chat`] with the request's `tools` (a JSON array) passed to the
    /// template.
    pub fn render_chat_with_tools(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String, EncodeError> {
        if !self.templates.names().iter().any(|n| n == DEFAULT_TEMPLATE) {
            return Err(EncodeError::NoChatTemplate);
        }
        match messages {
            Value::Array(a) if a.is_empty() => return Err(EncodeError::EmptyConversation),
            Value::Array(_) => {}
            _ => return Err(EncodeError::MessagesNotArray),
        }
        self.templates.render(
            DEFAULT_TEMPLATE,
            RenderInput {
                messages,
                tools,
                add_generation_prompt,
                special_tokens: &self.config.special_tokens,
            },
        )
    }

    /// A chat request's ids, as vLLM's chat endpoint computes them: the rendered template
    /// tokenized with `add_special_tokens = false`.
    pub fn encode_chat(
        &self,
        messages: &Value,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, EncodeError> {
        self.encode(&self.render_chat(messages, add_generation_prompt)?, false)
    }

    /// `encode(text, add_special_tokens)` through `store`: always the same ids as
    /// [`ModelTokenizer::encode`], tokenizing only past the longest prefix the store holds (and
    /// adding this text's blocks to it).
    pub fn encode_cached(
        &self,
        store: &PrefixStore,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, EncodeError> {
        if u32::try_from(text.len()).is_err() || (add_special_tokens && self.affix.is_none()) {
            return self.encode(text, add_special_tokens);
        }
        let mut ids = Vec::new();
        match (&self.affix, add_special_tokens) {
            (Some((prefix, suffix)), true) => {
                ids.extend_from_slice(prefix);
                store.encode_core_into(self, text, &mut ids)?;
                ids.extend_from_slice(suffix);
            }
            _ => store.encode_core_into(self, text, &mut ids)?,
        }
        Ok(ids)
    }

    /// [`ModelTokenizer::encode_completion`] through `store`.
    pub fn encode_completion_cached(
        &self,
        store: &PrefixStore,
        text: &str,
    ) -> Result<Vec<u32>, EncodeError> {
        self.encode_cached(store, text, true)
    }

    /// [`ModelTokenizer::encode_chat`] through `store`.
    pub fn encode_chat_cached(
        &self,
        store: &PrefixStore,
        messages: &Value,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, EncodeError> {
        self.encode_cached(
            store,
            &self.render_chat(messages, add_generation_prompt)?,
            false,
        )
    }

    /// The post-processor's prefix and suffix, if `encode(t, true)` is `prefix + encode(t,
    /// false) + suffix` with the same prefix and suffix for every probe text.
    fn probe_affix(&self) -> Option<(Vec<u32>, Vec<u32>)> {
        // Derived from a non-empty probe (with an empty one the split point is ambiguous), then
        // checked on every probe.
        let (with, without) = (
            self.reference_ids("a", true).ok()?,
            self.reference_ids("a", false).ok()?,
        );
        let at = (0..=with.len().checked_sub(without.len())?)
            .find(|&i| with[i..i + without.len()] == without[..])?;
        let affix = (with[..at].to_vec(), with[at + without.len()..].to_vec());
        for probe in PROBES {
            let with = self.reference_ids(probe, true).ok()?;
            let without = self.reference_ids(probe, false).ok()?;
            if with != with_affix(&affix, without) {
                return None;
            }
        }
        Some(affix)
    }

    /// The fast engine must give the reference ids on every probe and added token.
    fn check_fast(&self, fast: &FastEncoder, json: &Value) -> Result<(), String> {
        let mut texts: Vec<String> = PROBES.iter().map(|s| s.to_string()).collect();
        for t in json
            .get("added_tokens")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(c) = t.get("content").and_then(Value::as_str) {
                texts.push(format!("x {c}y{c} {c}\n"));
            }
        }
        for text in &texts {
            let want = self.reference_ids(text, false).map_err(|e| e.to_string())?;
            if fast_ids(fast, text) != want {
                return Err(format!("fast engine disagrees with tokenizers on {text:?}"));
            }
        }
        Ok(())
    }
}

fn fast_ids(fast: &FastEncoder, text: &str) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len() / 3 + 4);
    fast.encode(text, &mut out, |_, _| {});
    out
}

fn with_affix(affix: &(Vec<u32>, Vec<u32>), core: Vec<u32>) -> Vec<u32> {
    if affix.0.is_empty() && affix.1.is_empty() {
        return core;
    }
    let mut ids = Vec::with_capacity(affix.0.len() + core.len() + affix.1.len());
    ids.extend_from_slice(&affix.0);
    ids.extend_from_slice(&core);
    ids.extend_from_slice(&affix.1);
    ids
}

impl CoreEncoder for ModelTokenizer {
    fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    fn margin(&self) -> usize {
        self.margin
    }

    fn encode_core(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        self.encode(text, false)
    }

    fn encode_core_with_cuts(&self, text: &str) -> Result<WithCuts, EncodeError> {
        let bytes = text.as_bytes();
        let mut cands = Vec::new();
        if let (Ok(fast), Engine::Fast) = (&self.fast, self.engine) {
            let mut ids = Vec::with_capacity(text.len() / 3 + 4);
            fast.encode(text, &mut ids, |byte, index| {
                if cuts::is_candidate(bytes, byte) {
                    cands.push((byte, index));
                }
            });
            return Ok((ids, cands));
        }
        let enc = self
            .reference
            .encode(text, false)
            .map_err(|e| EncodeError::Tokenizer(e.to_string()))?;
        let offsets = enc.get_offsets();
        for (i, &(start, _)) in offsets.iter().enumerate() {
            let clean = i == 0 || (offsets[i - 1].1 <= start && offsets[i - 1].0 < start);
            if clean && cuts::is_candidate(bytes, start) {
                cands.push((start, i));
            }
        }
        Ok((enc.get_ids().to_vec(), cands))
    }
}
