//! Model and prompt from an OpenAI-style JSON request body (AIBrix v0.7.0 spec §3.2). Pure.
//!
//! - `/v1/chat/completions`: `messages[i].content` joined by one ASCII space, in order. A
//!   string content is JSON-unescaped; any other content (array or object of parts, numbers,
//!   `null`) is appended as its raw JSON text exactly as received. A message without
//!   `content` contributes an empty string. Roles, names and tools are not included.
//! - `/v1/completions`: `prompt`, which must be a JSON string (used as-is); absent = empty.
//! - any other path: only `model` is read; the prompt is empty.
//!
//! Contract: never panics, whatever the bytes; every failure is an [`ExtractError`].

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

/// Which OpenAI endpoint a request path names (query string ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`
    Completions,
    /// `/v1/chat/completions`
    ChatCompletions,
    /// Anything else with a JSON body (embeddings, ...): routed on `model` with no prompt.
    Other,
}

impl Endpoint {
    /// Classifies a `:path` value.
    pub fn from_path(path: &str) -> Endpoint {
        let path = path.split(['?', '#']).next().unwrap_or("");
        match path.trim_end_matches('/') {
            "/v1/completions" => Endpoint::Completions,
            "/v1/chat/completions" => Endpoint::ChatCompletions,
            _ => Endpoint::Other,
        }
    }
}

/// What routing needs from a body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extracted {
    /// The `model` field; empty when absent (AIBrix then answers 400 `model_not_found`).
    pub model: String,
    /// The text to hash, as UTF-8 bytes.
    pub prompt: Vec<u8>,
    /// `stream: true`.
    pub stream: bool,
}

/// Why a body could not be used. Each maps to one AIBrix 400 response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExtractError {
    /// Not a JSON object, or a field of the wrong type.
    #[error("error processing request body: {0}")]
    Malformed(String),
    /// Chat request without messages, or with an empty list.
    #[error("no messages in the request body")]
    NoMessages,
    /// Completions request whose `prompt` is not a string.
    #[error("prompt must be a string")]
    PromptNotString,
}

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    prompt: Option<Prompt<'a>>,
    #[serde(default, borrow)]
    messages: Option<Vec<&'a RawValue>>,
    #[serde(default)]
    stream: Option<bool>,
}

/// `prompt`, read in the same pass as the rest of the body (a 28 KB prompt is scanned once).
enum Prompt<'a> {
    Text(Cow<'a, str>),
    Null,
    NotText,
}

impl<'de: 'a, 'a> Deserialize<'de> for Prompt<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Prompt<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Prompt::Null)
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
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Self::Value, A::Error> {
                while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Prompt::NotText)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Self::Value, A::Error> {
                while a
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Prompt::NotText)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct Message<'a> {
    // `null` must stay the raw text `null`, not `None` (AIBrix appends it).
    #[serde(default, borrow, deserialize_with = "present_raw")]
    content: Option<&'a RawValue>,
}

fn present_raw<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Extracts model and prompt from `body` for `endpoint`.
pub fn extract(endpoint: Endpoint, body: &[u8]) -> Result<Extracted, ExtractError> {
    // serde would also read a struct from a JSON array (fields in order): only objects count.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ExtractError::Malformed(
            "the body is not a JSON object".into(),
        ));
    }
    let parsed: Body<'_> =
        serde_json::from_slice(body).map_err(|e| ExtractError::Malformed(e.to_string()))?;
    let model = parsed.model.map(Cow::into_owned).unwrap_or_default();
    let stream = parsed.stream.unwrap_or(false);
    let prompt = match endpoint {
        Endpoint::Other => Vec::new(),
        Endpoint::Completions => match parsed.prompt {
            None | Some(Prompt::Null) => Vec::new(),
            Some(Prompt::Text(s)) => s.into_owned().into_bytes(),
            Some(Prompt::NotText) => return Err(ExtractError::PromptNotString),
        },
        Endpoint::ChatCompletions => {
            let messages = parsed.messages.unwrap_or_default();
            if messages.is_empty() {
                return Err(ExtractError::NoMessages);
            }
            join_contents(&messages)?
        }
    };
    Ok(Extracted {
        model,
        prompt,
        stream,
    })
}

fn join_contents(messages: &[&RawValue]) -> Result<Vec<u8>, ExtractError> {
    let mut out = Vec::with_capacity(messages.iter().map(|m| m.get().len()).sum());
    for (i, raw) in messages.iter().enumerate() {
        if !raw.get().starts_with('{') {
            return Err(ExtractError::Malformed(format!(
                "messages[{i}] is not an object"
            )));
        }
        let msg: Message<'_> = serde_json::from_str(raw.get())
            .map_err(|e| ExtractError::Malformed(format!("messages[{i}]: {e}")))?;
        if i > 0 {
            out.push(b' ');
        }
        let Some(content) = msg.content else { continue };
        let text = content.get();
        if text.starts_with('"') {
            match serde_json::from_str::<Cow<'_, str>>(text) {
                Ok(s) => out.extend_from_slice(s.as_bytes()),
                Err(e) => {
                    return Err(ExtractError::Malformed(format!(
                        "messages[{i}].content: {e}"
                    )))
                }
            }
        } else {
            out.extend_from_slice(text.as_bytes());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<Extracted, ExtractError> {
        extract(Endpoint::ChatCompletions, body.as_bytes())
    }

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
        assert_eq!(Endpoint::from_path("/v1/embeddings"), Endpoint::Other);
        assert_eq!(Endpoint::from_path(""), Endpoint::Other);
    }

    #[test]
    fn chat_contents_are_joined_by_one_space() {
        let e = chat(r#"{"model":"m","messages":[{"role":"system","content":"a\"b"},{"role":"user","content":"c"}]}"#)
            .unwrap();
        assert_eq!(e.model, "m");
        assert_eq!(e.prompt, br#"a"b c"#);
    }

    #[test]
    fn array_content_is_raw_json_as_received() {
        let e = chat(r#"{"model":"m","messages":[{"content":[ {"type":"text", "text":"x"} ]},{"content":null},{}]}"#)
            .unwrap();
        assert_eq!(e.prompt, br#"[ {"type":"text", "text":"x"} ] null "#);
    }

    #[test]
    fn completions_prompt_must_be_a_string() {
        let e = extract(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"hi\n","stream":true}"#,
        )
        .unwrap();
        assert_eq!((e.prompt.as_slice(), e.stream), (&b"hi\n"[..], true));
        assert_eq!(
            extract(Endpoint::Completions, br#"{"model":"m","prompt":["a"]}"#),
            Err(ExtractError::PromptNotString)
        );
        assert_eq!(
            extract(Endpoint::Completions, br#"{"model":"m"}"#)
                .unwrap()
                .prompt,
            b""
        );
    }

    #[test]
    fn errors_are_typed() {
        assert!(matches!(chat("not json"), Err(ExtractError::Malformed(_))));
        assert!(matches!(chat("[1]"), Err(ExtractError::Malformed(_))));
        assert!(matches!(
            chat(r#"{"model":5}"#),
            Err(ExtractError::Malformed(_))
        ));
        assert!(matches!(
            chat(r#"{"model":"m","messages":[1]}"#),
            Err(ExtractError::Malformed(_))
        ));
        assert_eq!(chat(r#"{"model":"m"}"#), Err(ExtractError::NoMessages));
        assert_eq!(
            chat(r#"{"model":"m","messages":[]}"#),
            Err(ExtractError::NoMessages)
        );
        assert_eq!(chat(r#"{"messages":[{"content":"x"}]}"#).unwrap().model, "");
    }
}
