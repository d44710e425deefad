//! The OpenAI-compatible request and response shapes the fake server speaks (the subset vLLM's
//! `/v1/completions` and `/v1/chat/completions` clients use).

use serde::Deserialize;
use serde_json::{json, Value};

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// An API error: the HTTP status and the OpenAI-style body.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Human-readable message.
    pub message: String,
}

impl ApiError {
    /// A 400 with this message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
        }
    }

    /// The OpenAI-style body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> Value {
        let kind = match self.status {
            400 => "BadRequestError",
            401 => "AuthenticationError",
            403 => "PermissionDeniedError",
            404 => "NotFoundError",
            408 => "RequestTimeoutError",
            409 => "ConflictError",
            422 => "UnprocessableEntityError",
            429 => "RateLimitError",
            500..=599 => "InternalServerError",
            _ => "APIError",
        };
        json!({ "error": { "message": self.message, "type": kind, "param": null, "code": self.status } })
    }
}

/// The prompt as sent: text, token ids or chat messages.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// A completion's text, tokenized by the server's [`crate::prompt_tokens::PromptReader`].
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
    /// A chat: the messages as sent (a JSON array, for a real tokenizer's chat template) and
    /// the conversation rendered as `role: content` lines (for the built-in model).
    Chat {
        /// `messages`, as sent.
        messages: Value,
        /// `role: content` lines, ending with `assistant: `.
        rendered: String,
    },
}

/// A parsed generation request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenRequest {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The `model` field.
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// Output tokens to generate (the fake model never stops early: `ignore_eos` always).
    pub max_tokens: u32,
    /// Whether to stream SSE.
    pub stream: bool,
    /// Whether the stream ends with a usage chunk.
    pub include_usage: bool,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct RawRequest {
    model: Option<String>,
    prompt: Option<Value>,
    messages: Option<Vec<Value>>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    n: Option<u64>,
}

/// Default `max_tokens` of `/v1/completions` (vLLM's and OpenAI's).
pub const DEFAULT_COMPLETION_TOKENS: u32 = 16;
/// Default `max_tokens` of `/v1/chat/completions` (vLLM's is "what fits"; the fake caps it).
pub const DEFAULT_CHAT_TOKENS: u32 = 128;

/// Parses a request body. Every problem is a 400 with a message that names it.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<GenRequest, ApiError> {
    let raw: RawRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON request body: {e}")))?;
    let model = raw
        .model
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad_request("`model` is required"))?;
    if raw.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only n=1 is supported"));
    }
    let prompt = match endpoint {
        Endpoint::Completions => match raw.prompt {
            Some(Value::String(s)) => Prompt::Text(s),
            Some(Value::Array(items)) => prompt_from_array(items)?,
            Some(_) => {
                return Err(ApiError::bad_request(
                    "`prompt` must be a string, [string] or [token ids]",
                ))
            }
            None => return Err(ApiError::bad_request("`prompt` is required")),
        },
        Endpoint::Chat => {
            let messages = raw
                .messages
                .ok_or_else(|| ApiError::bad_request("`messages` is required"))?;
            let rendered = render_chat(&messages)?;
            Prompt::Chat {
                messages: Value::Array(messages),
                rendered,
            }
        }
    };
    let default = match endpoint {
        Endpoint::Completions => DEFAULT_COMPLETION_TOKENS,
        Endpoint::Chat => DEFAULT_CHAT_TOKENS,
    };
    let max_tokens = match raw.max_tokens.or(raw.max_completion_tokens) {
        None => default,
        Some(0) => return Err(ApiError::bad_request("`max_tokens` must be at least 1")),
        Some(n) => {
            u32::try_from(n).map_err(|_| ApiError::bad_request("`max_tokens` is too large"))?
        }
    };
    let include_usage = raw.stream_options.is_some_and(|o| o.include_usage);
    Ok(GenRequest {
        endpoint,
        model,
        prompt,
        max_tokens,
        stream: raw.stream,
        include_usage,
    })
}

fn prompt_from_array(items: Vec<Value>) -> Result<Prompt, ApiError> {
    if items.is_empty() {
        return Err(ApiError::bad_request("`prompt` is empty"));
    }
    if items.iter().all(Value::is_u64) {
        let ids = items
            .iter()
            .filter_map(Value::as_u64)
            .map(|t| u32::try_from(t).unwrap_or(u32::MAX))
            .collect();
        return Ok(Prompt::Tokens(ids));
    }
    match items.as_slice() {
        [Value::String(s)] => Ok(Prompt::Text(s.clone())),
        _ => Err(ApiError::bad_request(
            "batched prompts are not supported; send one prompt per request",
        )),
    }
}

fn render_chat(messages: &[Value]) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("`messages` is empty"));
    }
    let mut out = String::new();
    for m in messages {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad_request("every message needs a `role`"))?;
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
            Some(Value::Null) | None => String::new(),
            Some(_) => {
                return Err(ApiError::bad_request(
                    "message `content` must be a string or a list of parts",
                ))
            }
        };
        out.push_str(role);
        out.push_str(": ");
        out.push_str(&content);
        out.push('\n');
    }
    out.push_str("assistant: ");
    Ok(out)
}

/// The text of output token `n` (1-based): a fixed cycle of words, so output is deterministic.
pub fn token_text(n: u32) -> &'static str {
    const WORDS: [&str; 8] = [
        " The", " replica", " serves", " tokens", " from", " its", " cache", ".",
    ];
    WORDS[(n as usize - 1) % WORDS.len()]
}

/// The `usage` object.
pub fn usage(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": { "cached_tokens": cached_tokens },
    })
}

/// One streamed chunk carrying `text` (and `finish_reason` on the last).
pub fn chunk(
    endpoint: Endpoint,
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    first: bool,
    finish: Option<&str>,
) -> Value {
    match endpoint {
        Endpoint::Completions => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null }],
        }),
        Endpoint::Chat => {
            let delta = if first {
                json!({ "role": "assistant", "content": text })
            } else {
                json!({ "content": text })
            };
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish, "stop_reason": null }],
            })
        }
    }
}

/// The final usage-only chunk of a stream.
pub fn usage_chunk(endpoint: Endpoint, id: &str, created: u64, model: &str, usage: Value) -> Value {
    let object = match endpoint {
        Endpoint::Completions => "text_completion",
        Endpoint::Chat => "chat.completion.chunk",
    };
    json!({ "id": id, "object": object, "created": created, "model": model, "choices": [], "usage": usage })
}

/// A whole non-streamed response.
pub fn full_response(
    endpoint: Endpoint,
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    usage: Value,
) -> Value {
    match endpoint {
        Endpoint::Completions => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": "length", "stop_reason": null }],
            "usage": usage,
        }),
        Endpoint::Chat => json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "logprobs": null,
                          "finish_reason": "length", "stop_reason": null }],
            "usage": usage,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_completions_and_chat() {
        let r = parse(Endpoint::Completions, br#"{"model":"m","prompt":"hi","max_tokens":5,"stream":true,"stream_options":{"include_usage":true},"ignore_eos":true}"#).unwrap();
        assert_eq!(r.prompt, Prompt::Text("hi".into()));
        assert_eq!((r.max_tokens, r.stream, r.include_usage), (5, true, true));
        let r = parse(Endpoint::Completions, br#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(
            (r.prompt, r.max_tokens),
            (Prompt::Tokens(vec![1, 2, 3]), 16)
        );
        let r = parse(
            Endpoint::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#,
        )
        .unwrap();
        assert_eq!(
            r.prompt,
            Prompt::Chat {
                messages: json!([{"role": "user", "content": "hello"}]),
                rendered: "user: hello\nassistant: ".into()
            }
        );
    }

    #[test]
    fn bad_requests_are_400s() {
        for body in [
            &b"{not json"[..],
            br#"{"prompt":"x"}"#,
            br#"{"model":"m"}"#,
            br#"{"model":"m","prompt":"x","max_tokens":0}"#,
            br#"{"model":"m","prompt":["a","b"]}"#,
            br#"{"model":"m","prompt":"x","n":2}"#,
        ] {
            let e = parse(Endpoint::Completions, body).unwrap_err();
            assert_eq!(e.status, 400);
            assert_eq!(e.body()["error"]["code"], 400);
        }
        assert!(parse(Endpoint::Chat, br#"{"model":"m","messages":[]}"#).is_err());
    }
}
