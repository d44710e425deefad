//! Test support: a byte-level BPE tokenizer shaped like Llama 3's (its pre-tokenizer regex, a
//! BOS-adding post-processor and special tokens), trained at test time on this repository's text.

#![allow(dead_code)]

use std::sync::OnceLock;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, TokenizerImpl};

/// Llama 3's pre-tokenizer regex.
pub const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Special tokens of the development tokenizer, in id order after the trained vocabulary.
pub const SPECIALS: [&str; 4] = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|eot_id|>",
];

/// Text of this repository used for training and for test prompts.
pub fn corpus() -> &'static str {
    static CORPUS: OnceLock<String> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let mut text = String::new();
        for rel in [
            "README.md",
            "router-core/src/hash.rs",
            "router-core/src/index.rs",
        ] {
            if let Ok(t) = std::fs::read_to_string(format!("{root}/{rel}")) {
                text.push_str(&t);
                text.push('\n');
            }
        }
        text
    })
}

/// `tokenizer.json` bytes of the development tokenizer (trained once per test binary).
pub fn dev_tokenizer_json() -> &'static [u8] {
    static JSON: OnceLock<Vec<u8>> = OnceLock::new();
    JSON.get_or_init(|| {
        let split = serde_json::json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
            ]
        });
        let pre: PreTokenizerWrapper = serde_json::from_value(split).unwrap();
        let mut tk: TokenizerImpl<BPE, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper> =
            TokenizerImpl::new(BPE::default());
        tk.with_pre_tokenizer(Some(pre));
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(1500)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        let lines: Vec<&str> = corpus().lines().collect();
        tk.train(&mut trainer, lines.iter()).unwrap();
        let specials: Vec<AddedToken> = SPECIALS.iter().map(|s| AddedToken::from(*s, true)).collect();
        tk.add_special_tokens(&specials);
        let bos = tk.token_to_id(SPECIALS[0]).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&tk.to_string(false).unwrap()).unwrap();
        v["post_processor"] = serde_json::json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": SPECIALS[0], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": SPECIALS[0], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": SPECIALS[0], "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {SPECIALS[0]: {"id": SPECIALS[0], "ids": [bos], "tokens": [SPECIALS[0]]}}
        });
        v["decoder"] = serde_json::json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
        serde_json::to_vec(&v).unwrap()
    })
}

/// The development tokenizer with its `Split` regex replaced by `pattern`.
pub fn dev_tokenizer_json_with_pattern(pattern: &str) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(dev_tokenizer_json()).unwrap();
    v["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = serde_json::Value::from(pattern);
    serde_json::to_vec(&v).unwrap()
}

/// The golden fixture's `tokenizer.json` (GPT-2 `ByteLevel` pre-tokenizer).
pub fn fixture_tokenizer_json() -> Vec<u8> {
    std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/tokenizer/tokenizer.json"
    ))
    .unwrap()
}

/// Fragments random texts are built from: words, whitespace of every kind, digits, punctuation,
/// contractions (with case and U+017F), multi-byte characters, special-token strings and near
/// misses.
pub const FRAGMENTS: &[&str] = &[
    "the",
    " the",
    "Router",
    " prefix",
    " cache",
    "KV",
    "token",
    "s",
    "a",
    " a",
    "I",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " \n",
    "\u{a0}",
    "\u{3000}",
    "\u{2028}",
    "\u{85}",
    "\u{200b}",
    "\u{feff}",
    "0",
    "7",
    "42",
    " 123",
    "2024",
    "12345",
    "\u{663}",
    "\u{b2}",
    ".",
    ",",
    "!",
    "?",
    "...",
    "--",
    "==",
    "(",
    ")",
    "{\"k\": 1}",
    "<",
    ">",
    "/",
    "'",
    "'s",
    "'S",
    "'ll",
    "'LL",
    "'\u{17f}",
    "'re",
    "'t",
    "'d",
    "'m",
    "'ve",
    "n't",
    "é",
    "e\u{301}",
    "\u{4e2d}\u{6587}",
    "\u{1f600}",
    "\u{1f469}\u{200d}\u{1f4bb}",
    "\u{1c}",
    "\u{0}",
    "\u{7f}",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|end_of_text|>",
    "<|eot_id|",
    "<|EOT_ID|>",
    "<| eot_id |>",
    "fn main() {",
    "    ",
    "x",
];
