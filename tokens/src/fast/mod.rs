//! The fast path: byte-level BPE tokenization (GPT-2, Llama 3, Qwen 2 shapes) without
//! `tokenizers`' per-call machinery (normalized strings with alignment maps, `fancy-regex`,
//! `Encoding` objects), giving the same ids.
//!
//! [`FastEncoder::from_json`] accepts a `tokenizer.json` only if every stage is one it
//! reproduces exactly: no normalizer; the GPT-2 `ByteLevel` pre-tokenizer, or a `Split` on one
//! of the known regexes (Llama 3, Qwen 2, GPT-2) followed by `ByteLevel(use_regex: false)`,
//! without `add_prefix_space`; a BPE model with every byte in its vocabulary and no dropout,
//! subword prefix or word suffix; added tokens without `lstrip`, `rstrip` or `single_word`.
//! Anything else is reported as unsupported and [`crate::ModelTokenizer`] uses `tokenizers`.
//! The encoder yields the ids of `encode(text, add_special_tokens=false)`; the post-processor's
//! special tokens are added by the caller. At load the model also checks it against `tokenizers`
//! on probe texts (see `crate::tokenizer`).

mod bpe;
pub mod classes;
pub mod pretok;

use ahash::AHashMap;
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use serde_json::Value;

use self::bpe::ByteBpe;
pub use self::bpe::Unsupported;
use self::pretok::Scanner;

/// One added-token matcher: the tokens' contents and their ids.
struct Matcher {
    ac: AhoCorasick,
    ids: Vec<u32>,
}

/// A byte-level BPE tokenizer reproducing `tokenizers` for the supported shapes.
pub struct FastEncoder {
    scanner: Scanner,
    bpe: ByteBpe,
    /// Added tokens with `normalized: false`, matched first on the whole text.
    raw: Option<Matcher>,
    /// Added tokens with `normalized: true`, matched in the gaps (no normalizer: as written).
    normalized: Option<Matcher>,
}

impl std::fmt::Debug for FastEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastEncoder")
            .field("scanner", &self.scanner)
            .finish_non_exhaustive()
    }
}

fn flag(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn null_or_empty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

fn scanner_of(pre: &Value) -> Result<Scanner, Unsupported> {
    let kind = pre.get("type").and_then(Value::as_str);
    let byte_level = |v: &Value, use_regex: bool| {
        v.get("type").and_then(Value::as_str) == Some("ByteLevel")
            && !flag(v, "add_prefix_space")
            && v.get("use_regex").and_then(Value::as_bool).unwrap_or(true) == use_regex
    };
    if kind == Some("ByteLevel") {
        return if byte_level(pre, true) {
            Ok(Scanner::Gpt2)
        } else {
            Err("ByteLevel pre-tokenizer with add_prefix_space or without its regex".into())
        };
    }
    let steps = match (kind, pre.get("pretokenizers").and_then(Value::as_array)) {
        (Some("Sequence"), Some(steps)) => steps,
        _ => return Err(format!("pre-tokenizer {kind:?} is not supported")),
    };
    match &steps[..] {
        [split, bl] if byte_level(bl, false) => {
            let pattern = split.pointer("/pattern/Regex").and_then(Value::as_str);
            let ok = split.get("type").and_then(Value::as_str) == Some("Split")
                && split.get("behavior").and_then(Value::as_str) == Some("Isolated")
                && !flag(split, "invert");
            match (ok, pattern.and_then(Scanner::for_pattern)) {
                (true, Some(scanner)) => Ok(scanner),
                _ => Err(format!(
                    "Split pre-tokenizer {pattern:?} is not a supported regex"
                )),
            }
        }
        _ => Err("pre-tokenizer sequence is not Split + ByteLevel".into()),
    }
}

fn matcher(tokens: &[(String, u32)]) -> Result<Option<Matcher>, Unsupported> {
    if tokens.is_empty() {
        return Ok(None);
    }
    let ac = AhoCorasickBuilder::new()
        .match_kind(MatchKind::LeftmostLongest)
        .build(tokens.iter().map(|(c, _)| c))
        .map_err(|e| e.to_string())?;
    Ok(Some(Matcher {
        ac,
        ids: tokens.iter().map(|(_, id)| *id).collect(),
    }))
}

impl FastEncoder {
    /// The encoder for a parsed `tokenizer.json`, or why its shape is not supported.
    pub fn from_json(root: &Value) -> Result<Self, Unsupported> {
        if !root.get("normalizer").is_none_or(Value::is_null) {
            return Err("a normalizer is set".into());
        }
        let scanner = scanner_of(root.get("pre_tokenizer").unwrap_or(&Value::Null))?;
        let model = root.get("model").ok_or("no model")?;
        if model.get("type").and_then(Value::as_str) != Some("BPE") {
            return Err("model is not BPE".into());
        }
        for key in ["dropout", "continuing_subword_prefix", "end_of_word_suffix"] {
            if !null_or_empty(model.get(key)) {
                return Err(format!("BPE {key} is set"));
            }
        }
        let vocab: AHashMap<String, u32> = model
            .get("vocab")
            .and_then(Value::as_object)
            .ok_or("BPE vocab is not an object")?
            .iter()
            .map(|(k, v)| Some((k.clone(), u32::try_from(v.as_u64()?).ok()?)))
            .collect::<Option<_>>()
            .ok_or("BPE vocab has a non-integer id")?;
        let merges = model
            .get("merges")
            .and_then(Value::as_array)
            .ok_or("BPE merges is not a list")?
            .iter()
            .map(|m| match m {
                Value::String(s) => {
                    let (a, b) = s.split_once(' ')?;
                    (!b.contains(' ')).then(|| (a.to_string(), b.to_string()))
                }
                Value::Array(p) if p.len() == 2 => {
                    Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string()))
                }
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or("a BPE merge is neither \"a b\" nor [a, b]")?;
        let bpe = ByteBpe::new(&vocab, &merges, flag(model, "ignore_merges"))?;
        let mut raw = Vec::new();
        let mut normalized = Vec::new();
        for t in root
            .get("added_tokens")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice)
        {
            if flag(t, "single_word") || flag(t, "lstrip") || flag(t, "rstrip") {
                return Err("an added token uses single_word, lstrip or rstrip".into());
            }
            let content = t
                .get("content")
                .and_then(Value::as_str)
                .ok_or("added token without content")?;
            let id = t
                .get("id")
                .and_then(Value::as_u64)
                .and_then(|i| u32::try_from(i).ok())
                .ok_or("added token without id")?;
            if content.is_empty() {
                continue;
            }
            let list = if flag(t, "normalized") {
                &mut normalized
            } else {
                &mut raw
            };
            list.push((content.to_string(), id));
        }
        classes::warm_up();
        Ok(FastEncoder {
            scanner,
            bpe,
            raw: matcher(&raw)?,
            normalized: matcher(&normalized)?,
        })
    }

    /// Appends the ids of `encode(text, add_special_tokens=false)` to `out`. Calls
    /// `piece(byte, index)` at the start of every pre-token and added token, with its byte
    /// offset in `text` and the index in `out` of its first id.
    #[inline]
    pub fn encode(&self, text: &str, out: &mut Vec<u32>, mut piece: impl FnMut(usize, usize)) {
        match &self.raw {
            None => self.encode_gap(text, 0, out, &mut piece),
            Some(m) => {
                let mut from = 0;
                for mat in m.ac.find_iter(text) {
                    self.encode_gap(&text[from..mat.start()], from, out, &mut piece);
                    piece(mat.start(), out.len());
                    out.push(m.ids[mat.pattern().as_usize()]);
                    from = mat.end();
                }
                self.encode_gap(&text[from..], from, out, &mut piece);
            }
        }
    }

    /// Text between `normalized: false` added tokens: `normalized: true` added tokens, then
    /// pre-tokens.
    fn encode_gap(
        &self,
        gap: &str,
        base: usize,
        out: &mut Vec<u32>,
        piece: &mut impl FnMut(usize, usize),
    ) {
        match &self.normalized {
            None => self.encode_segment(gap, base, out, piece),
            Some(m) => {
                let mut from = 0;
                for mat in m.ac.find_iter(gap) {
                    self.encode_segment(&gap[from..mat.start()], base + from, out, piece);
                    piece(base + mat.start(), out.len());
                    out.push(m.ids[mat.pattern().as_usize()]);
                    from = mat.end();
                }
                self.encode_segment(&gap[from..], base + from, out, piece);
            }
        }
    }

    /// Text without added tokens: split by the regex, each pre-token merged by BPE.
    #[inline]
    fn encode_segment(
        &self,
        seg: &str,
        base: usize,
        out: &mut Vec<u32>,
        piece: &mut impl FnMut(usize, usize),
    ) {
        let bytes = seg.as_bytes();
        self.scanner.split(seg, |a, b| {
            piece(base + a, out.len());
            self.bpe.encode_word(&bytes[a..b], out);
        });
    }
}
