//! Model and prompt from an OpenAI-style JSON request body (AIBrix v0.7.0's
//! `pkg/plugins/gateway/util.go`). The
//! rules live in [`kvroute_core::body`] (the core's `json` feature), shared with the C ABI;
//! this module re-exports them for the service and maps their errors to AIBrix's answers.
//!
//! The service classifies the request path with [`Endpoint::from_path`] and calls
//! [`extract`]: `/v1/chat/completions` hashes the messages' contents, `/v1/completions` the
//! `prompt` string, any other path routes on `model` alone.

use crate::respond::Reject;

pub use kvroute_core::body::{extract, BodyError, Endpoint, Extracted};

/// The answer to a body [`extract`] refused: [`BodyError::NoMessages`] is AIBrix's 400 `no
/// messages in the request body` (`param: messages`); anything else its 400 `error processing
/// request body`, the error's text kept for logs.
pub fn reject(e: BodyError) -> Reject {
    match e {
        BodyError::NoMessages => Reject::NoMessages,
        other => Reject::BadBody(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<Extracted<'_>, Reject> {
        extract(Endpoint::ChatCompletions, body.as_bytes()).map_err(reject)
    }

    #[test]
    fn errors_map_to_aibrix_answers() {
        assert_eq!(chat(r#"{"model":"m"}"#), Err(Reject::NoMessages));
        assert!(matches!(chat("[1]"), Err(Reject::BadBody(_))));
        let r = extract(Endpoint::Completions, br#"{"prompt":[1]}"#).map_err(reject);
        assert_eq!(
            r,
            Err(Reject::BadBody("prompt must be a string".to_owned()))
        );
        for r in [chat("[1]"), chat("{}"), r] {
            assert_eq!(r.unwrap_err().status(), 400);
        }
    }
}
