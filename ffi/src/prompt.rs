//! The prompt text of an OpenAI-style request body, extracted as AIBrix v0.7.0 does
//! (`pkg/plugins/gateway/util.go`; `../shared/docs/aibrix-v0.7.0-routing.md` §3.2).
//!
//! - A body with `messages` (chat completions): every message's `content`, in order, joined by
//!   one ASCII space. A string content is JSON-unescaped; any other content (an array of
//!   multimodal parts, an object, a number, `null`) is appended as the raw JSON text exactly as
//!   received, whitespace included, never re-serialised. A message without `content`
//!   contributes the empty string. Roles, names and tool calls are not part of the prompt.
//! - Otherwise a body with `prompt` (completions): it must be a JSON string, used unescaped.
//! - Otherwise (embeddings and the like) the prompt is empty, so nothing matches and
//!   prefix-cache falls back to least-request, as in AIBrix.
//!
//! This module depends on serde_json only, so it can move to a crate shared with the Envoy
//! service unchanged.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// What a request body says about routing.
#[derive(Debug, PartialEq, Eq)]
pub struct BodyPrompt<'a> {
    /// The body's `model` field, when it is a string.
    pub model: Option<Cow<'a, str>>,
    /// The text to hash.
    pub prompt: Cow<'a, str>,
}

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Not a JSON object, or a field of the wrong type (`messages` not an array, `prompt` not a
    /// string, `model` not a string).
    Invalid,
}

#[derive(Deserialize)]
struct RawBody<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<Vec<RawMessage<'a>>>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawMessage<'a> {
    // Not `Option<&RawValue>` alone: that would read `null` as "absent", and AIBrix appends a
    // null content as the text `null`.
    #[serde(borrow, default, deserialize_with = "present")]
    content: Option<&'a RawValue>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// A JSON string value unescaped (borrowed when it has no escapes), or `None` if `raw` is not a
/// string.
fn string_value(raw: &RawValue) -> Option<Cow<'_, str>> {
    let text = raw.get();
    if !text.starts_with('"') {
        return None;
    }
    if !text.contains('\\') {
        // A valid JSON string without escapes is its own text between the quotes (RawValue
        // holds valid JSON). Asking serde_json for a `&str` instead costs a failed parse.
        return Some(Cow::Borrowed(&text[1..text.len() - 1]));
    }
    serde_json::from_str::<String>(text).ok().map(Cow::Owned)
}

/// A content's contribution to the prompt: unescaped if it is a string, raw JSON otherwise.
fn content_text(raw: &RawValue) -> Cow<'_, str> {
    string_value(raw).unwrap_or(Cow::Borrowed(raw.get()))
}

/// Reads the model and the prompt text out of a chat or completions body.
pub fn extract(body: &[u8]) -> Result<BodyPrompt<'_>, BodyError> {
    // serde's derived struct visitor also accepts a JSON array; a body must be an object.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(BodyError::Invalid);
    }
    let raw: RawBody<'_> = serde_json::from_slice(body).map_err(|_| BodyError::Invalid)?;
    let prompt = if let Some(messages) = raw.messages {
        match messages.as_slice() {
            [] => Cow::Borrowed(""),
            [one] => one.content.map_or(Cow::Borrowed(""), content_text),
            many => {
                let mut text = String::new();
                for (i, m) in many.iter().enumerate() {
                    if i > 0 {
                        text.push(' ');
                    }
                    if let Some(c) = m.content {
                        text.push_str(&content_text(c));
                    }
                }
                Cow::Owned(text)
            }
        }
    } else if let Some(p) = raw.prompt {
        string_value(p).ok_or(BodyError::Invalid)?
    } else {
        Cow::Borrowed("")
    };
    let model = match raw.model {
        Some(m) => Some(string_value(m).ok_or(BodyError::Invalid)?),
        None => None,
    };
    Ok(BodyPrompt { model, prompt })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(body: &str) -> String {
        extract(body.as_bytes()).unwrap().prompt.into_owned()
    }

    #[test]
    fn chat_contents_are_joined_by_one_space_and_unescaped() {
        let body = r#"{"model":"llama","messages":[
            {"role":"system","content":"You are \"helpful\".\nBe brief."},
            {"role":"user","name":"u","content":"Hi \u00e9"}]}"#;
        let got = extract(body.as_bytes()).unwrap();
        assert_eq!(got.model.as_deref(), Some("llama"));
        assert_eq!(got.prompt, "You are \"helpful\".\nBe brief. Hi é");
    }

    #[test]
    fn structured_content_is_appended_as_the_raw_json_received() {
        let body = r#"{"messages":[{"role":"user","content":[ {"type": "text",  "text":"a\nb"} ]},{"content":null},{"role":"x"},{"content":7}]}"#;
        assert_eq!(
            prompt(body),
            r#"[ {"type": "text",  "text":"a\nb"} ] null  7"#
        );
    }

    #[test]
    fn completions_prompt_must_be_a_string() {
        assert_eq!(prompt(r#"{"model":"m","prompt":"tab\there"}"#), "tab\there");
        assert!(matches!(
            extract(br#"{"prompt":["a","b"]}"#),
            Err(BodyError::Invalid)
        ));
    }

    #[test]
    fn messages_win_over_prompt_and_other_bodies_have_no_prompt() {
        assert_eq!(
            prompt(r#"{"prompt":"p","messages":[{"content":"m"}]}"#),
            "m"
        );
        assert_eq!(prompt(r#"{"input":"embed me","tools":[{"x":1}]}"#), "");
        assert_eq!(prompt(r#"{"messages":[]}"#), "");
    }

    #[test]
    fn invalid_bodies_are_rejected() {
        for bad in [
            &b"not json"[..],
            b"[1,2]",
            br#"{"messages":"x"}"#,
            br#"{"model":3}"#,
            b"{\"prompt\":\"\xff\"}",
        ] {
            assert_eq!(
                extract(bad),
                Err(BodyError::Invalid),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn unescaped_strings_are_borrowed() {
        let body = br#"{"model":"m","prompt":"plain"}"#;
        let got = extract(body).unwrap();
        assert!(
            matches!(got.prompt, Cow::Borrowed(_)) && matches!(got.model, Some(Cow::Borrowed(_)))
        );
    }
}
