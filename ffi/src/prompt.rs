//! The prompt text of an OpenAI-style request body for the C ABI
//! (`kvroute_router_route_json()`, `kvroute_extract_prompt()`): kvroute-core's
//! [`kvroute_core::body`] in its [`Endpoint::ByFields`] mode (no request path: `messages` if
//! present, else `prompt`, else empty; AIBrix v0.7.0's `pkg/plugins/gateway/util.go`), the
//! same extractor the Envoy service uses. Every failure is `KVROUTE_STATUS_INVALID_BODY`.

use kvroute_core::body::{self, Endpoint, Extracted};

use crate::status::kvroute_status;

/// Reads the model and the prompt text out of a chat or completions body. Strings borrow from
/// `body` when they had no escapes.
pub fn extract(body: &[u8]) -> Result<Extracted<'_>, kvroute_status> {
    body::extract(Endpoint::ByFields, body).map_err(|_| kvroute_status::InvalidBody)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_body_error_is_invalid_body() {
        for bad in [
            &b"[]"[..],
            b"{not json",
            br#"{"prompt":[1]}"#,
            br#"{"model":3}"#,
        ] {
            assert_eq!(extract(bad).unwrap_err(), kvroute_status::InvalidBody);
        }
        let got = extract(br#"{"model":"m","messages":[]}"#).unwrap();
        assert_eq!((got.model.as_deref(), &*got.prompt), (Some("m"), ""));
    }
}
