//! Verbatim copies of the two extractors `kvroute_core::body` replaced (ext-proc `src/extract.rs`
//! and ffi `src/prompt.rs` at 223d870, tests removed), kept only as baselines for the bench
//! and the differential test.
#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod ext_proc {
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

    fn present_raw<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<&'de RawValue>, D::Error> {
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
}

pub mod ffi {
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
}
