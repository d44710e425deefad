//! Model and prompt from an OpenAI-style JSON request body, read as AIBrix v0.7.0 reads them
//! (`pkg/plugins/gateway/util.go`). Needs the `json` feature. Pure: no IO.
//!
//! One [`extract`] serves every shell; the [`Endpoint`] says which rules apply:
//! - [`Endpoint::ChatCompletions`] (`/v1/chat/completions`): `messages[i].content` joined by
//!   one ASCII space, in order. A string content is JSON-unescaped; any other content (an
//!   array or object of parts, a number, `null`) is appended as its raw JSON text exactly as
//!   received, whitespace included, never re-serialised. A message without `content`
//!   contributes the empty string. Roles, names and tools are not part of the prompt. Absent,
//!   `null` or empty `messages` is [`BodyError::NoMessages`]; a message that is not an object
//!   is [`BodyError::Malformed`].
//! - [`Endpoint::Completions`] (`/v1/completions`): `prompt`, which must be a JSON string
//!   (else [`BodyError::PromptNotString`]), unescaped; absent or `null` = empty.
//! - [`Endpoint::Other`] (embeddings, ...): only `model` is read; the prompt is empty.
//! - [`Endpoint::ByFields`], for callers without a request path (the C ABI): `messages` if
//!   present and not `null` (joined as for chat; an empty list gives an empty prompt, and a
//!   message may also be a JSON array, read as a struct in field order, as serde reads it),
//!   else `prompt` (must be a string), else empty. `stream` is not read.
//!
//! In every mode: the body must be one JSON object (an array with the same fields is
//! [`BodyError::Malformed`]); `model`, if present and not `null`, must be a string; each of
//! `model`, `prompt` and `messages` may appear once. In the three endpoint modes a string
//! `prompt` must decode (no lone UTF-16 surrogate in a `\u` escape) even where it is not used,
//! and `stream` must be a boolean or `null` and appear once. Two leniencies kept from the C
//! ABI's reading, in [`Endpoint::ByFields`] only: `prompt` is decoded only when it is used, and
//! a string `content` that does not decode is appended as its raw JSON text instead of failing.
//!
//! Copies: a string without escapes is borrowed from the body. In the endpoint modes the body
//! is scanned once: a `prompt` with escapes is decoded by serde_json into its scratch space and
//! copied once into an exact-size buffer. (Capturing it raw and decoding it straight into one
//! buffer afterwards costs a second pass over the ~28 KB and measured slower.) Message contents,
//! and by fields the prompt, are captured raw in that scan and decoded afterwards straight into
//! their buffer: one message's content alone is borrowed or decoded into one buffer; several
//! are joined into one.
//!
//! Contract: never panics, whatever the bytes; every failure is a [`BodyError`].

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// Which extraction rules apply: the OpenAI endpoint a request is for, or
/// [`Endpoint::ByFields`] when the caller has no request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Endpoint {
    /// `/v1/completions`: the prompt is `prompt`.
    Completions,
    /// `/v1/chat/completions`: the prompt is the messages' contents.
    ChatCompletions,
    /// Any other path with a JSON body (embeddings, ...): routed on `model` with no prompt.
    Other,
    /// No path known: `messages` if present, else `prompt`, else no prompt (the C ABI's
    /// `kvroute_router_route_json` and `kvroute_extract_prompt`).
    ByFields,
}

impl Endpoint {
    /// Classifies a `:path` value (query string and fragment ignored, trailing `/` ignored).
    /// Never returns [`Endpoint::ByFields`].
    pub fn from_path(path: &str) -> Endpoint {
        let path = path.split(['?', '#']).next().unwrap_or("");
        match path.trim_end_matches('/') {
            "/v1/completions" => Endpoint::Completions,
            "/v1/chat/completions" => Endpoint::ChatCompletions,
            _ => Endpoint::Other,
        }
    }
}

/// What routing needs from a body. Strings borrow from the body when they had no escapes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Extracted<'a> {
    /// The `model` field; `None` when absent or `null` (AIBrix then answers 400
    /// `model_not_found`; the C ABI wants the model as an argument instead).
    pub model: Option<Cow<'a, str>>,
    /// The text to hash (hash its UTF-8 bytes).
    pub prompt: Cow<'a, str>,
    /// `"stream": true`. Always `false` in [`Endpoint::ByFields`], which does not read it.
    pub stream: bool,
    /// The output-token limit: `max_completion_tokens` unless absent or 0, else `max_tokens` (as
    /// vLLM's chat endpoint reads them), when it is an integer from 0 to `u32::MAX`. Read
    /// leniently in every mode: any other value, or a field repeated after a non-null value,
    /// leaves it `None` and is never an error (the engine judges it); `null` counts as absent.
    pub max_output_tokens: Option<u32>,
}

/// Why a body could not be used. Shells map each variant to their own answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// Not one JSON object, a field of the wrong type, a repeated field, or a string that does
    /// not decode. The text says what was wrong, for logs.
    #[error("error processing request body: {0}")]
    Malformed(String),
    /// [`Endpoint::ChatCompletions`] without messages, or with an empty list.
    #[error("no messages in the request body")]
    NoMessages,
    /// [`Endpoint::Completions`] or [`Endpoint::ByFields`] (without `messages`) whose `prompt`
    /// is not a string.
    #[error("prompt must be a string")]
    PromptNotString,
}

fn malformed(why: impl fmt::Display) -> BodyError {
    BodyError::Malformed(why.to_string())
}

/// Extracts model, prompt and `stream` from `body` under `endpoint`'s rules (see the module
/// documentation).
pub fn extract(endpoint: Endpoint, body: &[u8]) -> Result<Extracted<'_>, BodyError> {
    let by_fields = endpoint == Endpoint::ByFields;
    let fields = Fields::parse(body, by_fields).map_err(malformed)?;
    let model = match fields.model {
        None => None,
        Some(raw) => {
            let inner = string_inner(raw).ok_or_else(|| malformed("`model` is not a string"))?;
            Some(unescape(inner).map_err(|e| malformed(format_args!("model: {e}")))?)
        }
    };
    let stream = fields.stream.unwrap_or(false);
    let prompt = match (endpoint, fields.prompt) {
        (Endpoint::Other, _) => Cow::Borrowed(""),
        (Endpoint::ChatCompletions, _) => match fields.messages.as_deref() {
            None | Some([]) => return Err(BodyError::NoMessages),
            Some(messages) => join_contents(messages, true)?,
        },
        (Endpoint::ByFields, prompt) => match (fields.messages.as_deref(), prompt) {
            (Some(messages), _) => join_contents(messages, false)?,
            (None, None) => Cow::Borrowed(""),
            (None, Some(Prompt::Raw(raw))) => {
                let inner = string_inner(raw).ok_or(BodyError::PromptNotString)?;
                unescape(inner).map_err(|e| malformed(format_args!("prompt: {e}")))?
            }
            // Fields::parse reads `prompt` raw by fields.
            (None, Some(_)) => return Err(BodyError::PromptNotString),
        },
        (_, None) => Cow::Borrowed(""),
        (_, Some(Prompt::Text(text))) => text,
        (_, Some(Prompt::Raw(_) | Prompt::NotText)) => return Err(BodyError::PromptNotString),
    };
    Ok(Extracted {
        model,
        prompt,
        stream,
        // As vLLM's chat endpoint: `max_completion_tokens or max_tokens` (a 0 falls through).
        max_output_tokens: fields
            .max_completion_tokens
            .filter(|&n| n > 0)
            .or(fields.max_tokens),
    })
}

/// The top-level fields routing reads; `null` reads as absent.
struct Fields<'a> {
    model: Option<&'a RawValue>,
    prompt: Option<Prompt<'a>>,
    messages: Option<Vec<&'a RawValue>>,
    /// Not read by fields.
    stream: Option<bool>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
}

impl<'a> Fields<'a> {
    /// One pass over the body; unknown fields are skipped. In the endpoint modes `prompt` is
    /// decoded in this pass (a ~28 KB prompt is scanned once: borrowed without escapes, else
    /// decoded by serde_json into its scratch space and copied once into an exact-size buffer)
    /// and `stream` is read. By fields, `prompt` is kept raw and decoded only if it is used,
    /// and `stream` is skipped.
    fn parse(body: &'a [u8], by_fields: bool) -> Result<Fields<'a>, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let fields = (&mut de).deserialize_map(FieldsVisitor { by_fields })?;
        de.end()?;
        Ok(fields)
    }
}

struct FieldsVisitor {
    by_fields: bool,
}

/// A top-level key (escaped keys compare by their decoded text, as serde's derive does).
enum Key {
    Model,
    Prompt,
    Messages,
    Stream,
    MaxTokens,
    MaxCompletionTokens,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "model" => Key::Model,
                    "prompt" => Key::Prompt,
                    "messages" => Key::Messages,
                    "stream" => Key::Stream,
                    "max_tokens" => Key::MaxTokens,
                    "max_completion_tokens" => Key::MaxCompletionTokens,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(KeyVisitor)
    }
}

/// Reads a field's value into `slot` (`Some(None)` for `null`), refusing a second occurrence.
fn once<'de, T: Deserialize<'de>, A: MapAccess<'de>>(
    slot: &mut Option<Option<T>>,
    map: &mut A,
    name: &'static str,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Fields<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
        let (mut model, mut messages, mut stream) = (None, None, None);
        let (mut prompt, mut raw_prompt) = (None, None);
        let (mut max_tokens, mut max_completion_tokens) = (Limit::Absent, Limit::Absent);
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Model => once(&mut model, &mut map, "model")?,
                Key::Prompt if self.by_fields => once(&mut raw_prompt, &mut map, "prompt")?,
                Key::Prompt => once(&mut prompt, &mut map, "prompt")?,
                Key::Messages => once(&mut messages, &mut map, "messages")?,
                Key::Stream if !self.by_fields => once(&mut stream, &mut map, "stream")?,
                Key::MaxTokens => max_tokens = max_tokens.and(Limit::read(map.next_value()?)),
                Key::MaxCompletionTokens => {
                    let next = Limit::read(map.next_value()?);
                    max_completion_tokens = max_completion_tokens.and(next);
                }
                Key::Stream | Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Fields {
            model: model.flatten(),
            prompt: match raw_prompt.flatten() {
                Some(raw) => Some(Prompt::Raw(raw)),
                None => prompt.flatten(),
            },
            messages: messages.flatten(),
            stream: stream.flatten(),
            max_tokens: max_tokens.get(),
            max_completion_tokens: max_completion_tokens.get(),
        })
    }
}

/// An output-token limit as read: absent, a usable value, or anything else (a value of another
/// type or range, or a second occurrence), which is not used.
#[derive(Clone, Copy)]
enum Limit {
    Absent,
    Value(u32),
    Unusable,
}

impl Limit {
    /// This occurrence followed by `next` (a value after `null` counts; after a value, nothing
    /// is usable).
    fn and(self, next: Limit) -> Limit {
        match self {
            Limit::Absent => next,
            _ => Limit::Unusable,
        }
    }

    fn get(self) -> Option<u32> {
        match self {
            Limit::Value(n) => Some(n),
            Limit::Absent | Limit::Unusable => None,
        }
    }
}

impl Limit {
    /// Reads one occurrence from its raw JSON text: `null` is absent, an integer from 0 to
    /// `u32::MAX` a value, anything else unusable (never an error: the text was validated as
    /// JSON the way any skipped field is).
    fn read(raw: &RawValue) -> Limit {
        match raw.get() {
            "null" => Limit::Absent,
            text => serde_json::from_str::<u32>(text).map_or(Limit::Unusable, Limit::Value),
        }
    }
}

/// `prompt`: decoded in the parse (endpoint modes), or raw (by fields).
enum Prompt<'a> {
    /// A string, decoded.
    Text(Cow<'a, str>),
    /// Any other JSON value.
    NotText,
    /// The raw JSON text, not decoded yet.
    Raw(&'a RawValue),
}

impl<'de: 'a, 'a> Deserialize<'de> for Prompt<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PromptVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for PromptVisitor<'a> {
            type Value = Prompt<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a prompt")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Prompt::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Prompt::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Prompt::Text(Cow::Owned(v)))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Prompt::NotText)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Prompt::NotText)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Prompt::NotText)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Prompt::NotText)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Prompt::NotText)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Prompt::NotText)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Prompt::NotText)
            }
        }
        d.deserialize_any(PromptVisitor(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct Message<'a> {
    // Not `Option<&RawValue>` alone: that would read `null` as "absent", and AIBrix appends a
    // null content as the text `null`.
    #[serde(default, borrow, deserialize_with = "present")]
    content: Option<&'a RawValue>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// The messages' contents joined by one space. `strict` (the chat endpoint): every message
/// must be an object and every string content must decode. Otherwise (by fields) a message may
/// be an array too, and a string content that does not decode is appended raw.
fn join_contents<'a>(messages: &[&'a RawValue], strict: bool) -> Result<Cow<'a, str>, BodyError> {
    let content = |i: usize, raw: &'a RawValue| -> Result<Option<&'a RawValue>, BodyError> {
        if strict && !raw.get().starts_with('{') {
            return Err(malformed(format_args!("messages[{i}] is not an object")));
        }
        serde_json::from_str::<Message<'a>>(raw.get())
            .map(|m| m.content)
            .map_err(|e| malformed(format_args!("messages[{i}]: {e}")))
    };
    let bad_content =
        |i: usize, e: BadEscape| malformed(format_args!("messages[{i}].content: {e}"));
    if let [one] = messages {
        let Some(c) = content(0, one)? else {
            return Ok(Cow::Borrowed(""));
        };
        return match string_inner(c) {
            None => Ok(Cow::Borrowed(c.get())),
            Some(inner) => match unescape(inner) {
                Ok(text) => Ok(text),
                Err(e) if strict => Err(bad_content(0, e)),
                Err(_) => Ok(Cow::Borrowed(c.get())),
            },
        };
    }
    // An upper bound: a message's text is at least its content's, which decoding only shrinks.
    let mut out = String::with_capacity(messages.iter().map(|m| m.get().len() + 1).sum());
    for (i, raw) in messages.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let Some(c) = content(i, raw)? else { continue };
        let Some(inner) = string_inner(c) else {
            out.push_str(c.get());
            continue;
        };
        let mark = out.len();
        if let Err(e) = decode(inner, |s| out.push_str(s)) {
            if strict {
                return Err(bad_content(i, e));
            }
            out.truncate(mark);
            out.push_str(c.get());
        }
    }
    Ok(Cow::Owned(out))
}

/// The text between the quotes of a JSON string value, or `None` if `raw` is not a string.
fn string_inner(raw: &RawValue) -> Option<&str> {
    raw.get().strip_prefix('"')?.strip_suffix('"')
}

/// A `\u` escape that is not a Unicode scalar value: a lone UTF-16 surrogate. (serde_json
/// checks every other escape rule while it captures a raw value, but leaves this one to the
/// decoder.)
#[derive(Clone, Copy, Debug)]
struct BadEscape;

impl fmt::Display for BadEscape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid escape (lone surrogate in a \\u escape)")
    }
}

/// `inner` (a JSON string's text between its quotes, as serde_json validated it) decoded:
/// borrowed when it has no escapes, else decoded into one buffer of `inner.len()` bytes.
fn unescape(inner: &str) -> Result<Cow<'_, str>, BadEscape> {
    if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
        return Ok(Cow::Borrowed(inner));
    }
    let mut out = String::with_capacity(inner.len());
    decode(inner, |s| out.push_str(s))?;
    Ok(Cow::Owned(out))
}

/// Decodes the escapes of a JSON string's inner text, handing the decoded text to `emit` in
/// pieces. The same rules as serde_json's string parser: `\" \\ \/ \b \f \n \r \t \uXXXX`,
/// a leading surrogate must be followed at once by a `\u` trailing surrogate, and a trailing
/// surrogate alone is an error. Any other malformation is an error too (serde_json rejects it
/// before this runs), never a panic.
fn decode(inner: &str, mut emit: impl FnMut(&str)) -> Result<(), BadEscape> {
    let bytes = inner.as_bytes();
    let mut done = 0; // invariant: `inner[..done]` has been emitted; `done` is a char boundary
    while let Some(k) = memchr::memchr(b'\\', bytes.get(done..).ok_or(BadEscape)?) {
        let at = done + k;
        emit(inner.get(done..at).ok_or(BadEscape)?);
        let (ch, len) = escape(bytes, at + 1)?;
        emit(ch.encode_utf8(&mut [0; 4]));
        // An escape is ASCII only, so `at + 1 + len` is a char boundary.
        done = at + 1 + len;
    }
    emit(inner.get(done..).ok_or(BadEscape)?);
    Ok(())
}

/// The escape whose letter is at `bytes[i]` (just after the backslash): the character and the
/// number of bytes from `i` it spans.
fn escape(bytes: &[u8], i: usize) -> Result<(char, usize), BadEscape> {
    let ch = match bytes.get(i).ok_or(BadEscape)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let hi = hex4(bytes, i + 1)?;
            if !(0xD800..0xDC00).contains(&hi) {
                // A trailing surrogate alone is not a char: `from_u32` refuses it.
                return Ok((char::from_u32(hi).ok_or(BadEscape)?, 5));
            }
            if bytes.get(i + 5..i + 7) != Some(b"\\u") {
                return Err(BadEscape);
            }
            let lo = hex4(bytes, i + 7)?;
            if !(0xDC00..0xE000).contains(&lo) {
                return Err(BadEscape);
            }
            let c = char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00));
            return Ok((c.ok_or(BadEscape)?, 11));
        }
        _ => return Err(BadEscape),
    };
    Ok((ch, 1))
}

/// Four hex digits at `bytes[i..i + 4]`.
fn hex4(bytes: &[u8], i: usize) -> Result<u32, BadEscape> {
    let digits = bytes.get(i..i + 4).ok_or(BadEscape)?;
    digits.iter().try_fold(0u32, |n, &d| {
        char::from(d)
            .to_digit(16)
            .map(|v| n << 4 | v)
            .ok_or(BadEscape)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<Extracted<'_>, BodyError> {
        extract(Endpoint::ChatCompletions, body.as_bytes())
    }

    fn by_fields(body: &str) -> String {
        extract(Endpoint::ByFields, body.as_bytes())
            .unwrap()
            .prompt
            .into_owned()
    }

    // From ext-proc's extractor.

    #[test]
    fn paths_are_classified_without_query() {
        assert_eq!(
            Endpoint::from_path("/v1/completions?x=1"),
            Endpoint::Completions
        );
        assert_eq!(
            Endpoint::from_path("/v1/chat/completions"),
            Endpoint::ChatCompletions
        );
        assert_eq!(
            Endpoint::from_path("/v1/chat/completions/"),
            Endpoint::ChatCompletions
        );
        assert_eq!(Endpoint::from_path("/v1/embeddings"), Endpoint::Other);
        assert_eq!(Endpoint::from_path(""), Endpoint::Other);
    }

    #[test]
    fn chat_contents_are_joined_by_one_space() {
        let e = chat(r#"{"model":"m","messages":[{"role":"system","content":"a\"b"},{"role":"user","content":"c"}]}"#)
            .unwrap();
        assert_eq!(e.model.as_deref(), Some("m"));
        assert_eq!(e.prompt, r#"a"b c"#);
    }

    #[test]
    fn array_content_is_raw_json_as_received() {
        let e = chat(r#"{"model":"m","messages":[{"content":[ {"type":"text", "text":"x"} ]},{"content":null},{}]}"#)
            .unwrap();
        assert_eq!(e.prompt, r#"[ {"type":"text", "text":"x"} ] null "#);
    }

    #[test]
    fn completions_prompt_must_be_a_string() {
        let e = extract(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"hi\n","stream":true}"#,
        )
        .unwrap();
        assert_eq!((&*e.prompt, e.stream), ("hi\n", true));
        assert_eq!(
            extract(Endpoint::Completions, br#"{"model":"m","prompt":["a"]}"#),
            Err(BodyError::PromptNotString)
        );
        assert_eq!(
            extract(Endpoint::Completions, br#"{"model":"m"}"#)
                .unwrap()
                .prompt,
            ""
        );
    }

    #[test]
    fn output_token_limits_are_read_leniently() {
        let limit = |endpoint, fields: &str| {
            let body =
                format!(r#"{{"model":"m","prompt":"p","messages":[{{"content":"c"}}]{fields}}}"#);
            extract(endpoint, body.as_bytes())
                .unwrap()
                .max_output_tokens
        };
        for e in [
            Endpoint::Completions,
            Endpoint::ChatCompletions,
            Endpoint::ByFields,
        ] {
            assert_eq!(limit(e, ""), None);
            assert_eq!(limit(e, r#","max_tokens":128"#), Some(128));
            assert_eq!(
                limit(e, r#","max_tokens":128,"max_completion_tokens":64"#),
                Some(64),
                "max_completion_tokens first, as vLLM reads it"
            );
            assert_eq!(
                limit(e, r#","max_completion_tokens":null,"max_tokens":9"#),
                Some(9)
            );
            assert_eq!(
                limit(e, r#","max_completion_tokens":0,"max_tokens":9"#),
                Some(9),
                "a 0 falls through, as in vLLM"
            );
            let odd = ["1e400", r#""\ud800""#, r#"{"\ud800":1}"#];
            for unusable in ["-1", "1.5", "\"128\"", "true", "[1]", "{}", "4294967296"]
                .into_iter()
                .chain(odd)
            {
                let fields = format!(r#","max_tokens":{unusable}"#);
                assert_eq!(limit(e, &fields), None, "{unusable}");
            }
            assert_eq!(
                limit(e, r#","max_tokens":1,"max_tokens":2"#),
                None,
                "repeated"
            );
        }
    }

    #[test]
    fn errors_are_typed() {
        assert!(matches!(chat("not json"), Err(BodyError::Malformed(_))));
        assert!(matches!(chat("[1]"), Err(BodyError::Malformed(_))));
        assert!(matches!(
            chat(r#"{"model":5}"#),
            Err(BodyError::Malformed(_))
        ));
        assert!(matches!(
            chat(r#"{"model":"m","messages":[1]}"#),
            Err(BodyError::Malformed(_))
        ));
        assert_eq!(chat(r#"{"model":"m"}"#), Err(BodyError::NoMessages));
        assert_eq!(
            chat(r#"{"model":"m","messages":[]}"#),
            Err(BodyError::NoMessages)
        );
        assert_eq!(
            chat(r#"{"messages":[{"content":"x"}]}"#).unwrap().model,
            None
        );
    }

    // From the C ABI's extractor.

    #[test]
    fn by_fields_chat_contents_are_joined_by_one_space_and_unescaped() {
        let body = r#"{"model":"llama","messages":[
            {"role":"system","content":"You are \"helpful\".\nBe brief."},
            {"role":"user","name":"u","content":"Hi \u00e9"}]}"#;
        let got = extract(Endpoint::ByFields, body.as_bytes()).unwrap();
        assert_eq!(got.model.as_deref(), Some("llama"));
        assert_eq!(got.prompt, "You are \"helpful\".\nBe brief. Hi é");
    }

    #[test]
    fn by_fields_structured_content_is_appended_as_the_raw_json_received() {
        let body = r#"{"messages":[{"role":"user","content":[ {"type": "text",  "text":"a\nb"} ]},{"content":null},{"role":"x"},{"content":7}]}"#;
        assert_eq!(
            by_fields(body),
            r#"[ {"type": "text",  "text":"a\nb"} ] null  7"#
        );
    }

    #[test]
    fn by_fields_completions_prompt_must_be_a_string() {
        assert_eq!(
            by_fields(r#"{"model":"m","prompt":"tab\there"}"#),
            "tab\there"
        );
        assert_eq!(
            extract(Endpoint::ByFields, br#"{"prompt":["a","b"]}"#),
            Err(BodyError::PromptNotString)
        );
    }

    #[test]
    fn by_fields_messages_win_over_prompt_and_other_bodies_have_no_prompt() {
        assert_eq!(
            by_fields(r#"{"prompt":"p","messages":[{"content":"m"}]}"#),
            "m"
        );
        assert_eq!(
            by_fields(r#"{"prompt":5,"messages":[{"content":"m"}]}"#),
            "m"
        );
        assert_eq!(by_fields(r#"{"input":"embed me","tools":[{"x":1}]}"#), "");
        assert_eq!(by_fields(r#"{"messages":[]}"#), "");
        assert_eq!(by_fields(r#"{"messages":null,"prompt":"p"}"#), "p");
    }

    #[test]
    fn by_fields_invalid_bodies_are_rejected() {
        for bad in [
            &b"not json"[..],
            b"[1,2]",
            br#"{"messages":"x"}"#,
            br#"{"model":3}"#,
            b"{\"prompt\":\"\xff\"}",
            br#"{"prompt":"\ud800"}"#,
            br#"{"model":"a","model":"b"}"#,
        ] {
            assert!(
                extract(Endpoint::ByFields, bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn unescaped_strings_are_borrowed() {
        for endpoint in [Endpoint::Completions, Endpoint::ByFields] {
            let got = extract(endpoint, br#"{"model":"m","prompt":"plain"}"#).unwrap();
            assert!(
                matches!(got.prompt, Cow::Borrowed("plain"))
                    && matches!(got.model, Some(Cow::Borrowed("m")))
            );
        }
        let got = chat(r#"{"messages":[{"content":"one"}]}"#).unwrap();
        assert!(matches!(got.prompt, Cow::Borrowed("one")));
    }

    // The differences between the two shells' readings, kept.

    #[test]
    fn stream_is_checked_by_endpoints_and_ignored_by_fields() {
        for body in [
            &br#"{"prompt":"p","stream":"yes"}"#[..],
            br#"{"prompt":"p","stream":true,"stream":true}"#,
        ] {
            assert!(matches!(
                extract(Endpoint::Completions, body),
                Err(BodyError::Malformed(_))
            ));
            let got = extract(Endpoint::ByFields, body).unwrap();
            assert_eq!((&*got.prompt, got.stream), ("p", false));
        }
        assert!(
            !extract(Endpoint::Other, br#"{"stream":null}"#)
                .unwrap()
                .stream
        );
    }

    #[test]
    fn messages_and_content_edge_cases_by_mode() {
        // A message given as an array: the C ABI's serde reading takes its first element as
        // `content`; the chat endpoint refuses it.
        assert_eq!(by_fields(r#"{"messages":[["x"]]}"#), "x");
        assert!(matches!(
            chat(r#"{"messages":[["x"]]}"#),
            Err(BodyError::Malformed(_))
        ));
        // A string content with a lone surrogate: appended raw by fields, an error for chat.
        let body = r#"{"messages":[{"content":"a\udc00"},{"content":"b"}]}"#;
        assert_eq!(by_fields(body), r#""a\udc00" b"#);
        assert!(matches!(chat(body), Err(BodyError::Malformed(_))));
        assert_eq!(
            by_fields(r#"{"messages":[{"content":"\ud800x"}]}"#),
            r#""\ud800x""#
        );
        // Empty messages: the chat endpoint's error, an empty prompt by fields.
        assert_eq!(chat(r#"{"messages":null}"#), Err(BodyError::NoMessages));
        // A completions body's messages are not read, but must be a list.
        assert_eq!(
            extract(Endpoint::Completions, br#"{"prompt":"p","messages":[1]}"#)
                .unwrap()
                .prompt,
            "p"
        );
        assert!(extract(Endpoint::Completions, br#"{"messages":1}"#).is_err());
        // A string prompt must decode even where it is not used, except by fields.
        assert!(matches!(
            extract(Endpoint::Other, br#"{"prompt":"\udfff"}"#),
            Err(BodyError::Malformed(_))
        ));
        assert_eq!(by_fields(r#"{"prompt":"\udfff","messages":[]}"#), "");
    }

    #[test]
    fn escapes_decode_as_serde_json_does() {
        for s in [
            r#""""#,
            r#""plain""#,
            r#""\"\\\/\b\f\n\r\t""#,
            r#""\u0041\u00e9\u20ac\ud83d\ude00 end""#,
            r#""\uD834\uDD1E""#,
            r#""é\nü""#,
        ] {
            let want: String = serde_json::from_str(s).unwrap();
            let got = unescape(s.strip_prefix('"').unwrap().strip_suffix('"').unwrap()).unwrap();
            assert_eq!(got, want, "{s}");
        }
        for s in [
            r#"\ud800"#,
            r#"\udc00"#,
            r#"\ud800\u0041"#,
            r#"\ud800\n"#,
            r#"\ud800x"#,
            r#"\u12"#,
            r#"\x"#,
            r#"\"#,
        ] {
            assert!(unescape(s).is_err(), "{s}");
        }
    }

    #[test]
    fn an_escaped_prompt_is_one_buffer() {
        // Endpoint modes: serde_json's decoded text copied once, at its exact size. By fields:
        // decoded straight into a buffer the size of the escaped text.
        let body = br#"{"prompt":"a\nb"}"#;
        for (endpoint, capacity) in [(Endpoint::Completions, 3), (Endpoint::ByFields, 4)] {
            match extract(endpoint, body).unwrap().prompt {
                Cow::Owned(s) => assert_eq!((s.as_str(), s.capacity()), ("a\nb", capacity)),
                Cow::Borrowed(_) => panic!("an escaped prompt cannot be borrowed"),
            }
        }
    }
}
