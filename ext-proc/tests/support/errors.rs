//! The errors every kvroute front end answers alike (kvroute-ext-proc behind Envoy, and the
//! in-Envoy module): AIBrix's status, marker header and OpenAI-style body for each bad request.

use super::*;

/// Sends each bad request to the gateway at `listen` (kvroute configured with
/// `max_body_bytes = 65536` and the model `study`) and checks kvroute's answer; none may
/// reach a replica.
pub fn check_request_errors(listen: &str) {
    // (path, headers, body, status, marker header, text in message or code)
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        Vec<u8>,
        u16,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "/v1/completions",
            vec![],
            completion("nope", "x", 1, false),
            400,
            "x-error-no-model-backends",
            "model_not_found",
        ),
        (
            "/v1/completions",
            vec![],
            br#"{"prompt":"no model"}"#.to_vec(),
            400,
            "x-error-no-model-backends",
            "model_not_found",
        ),
        (
            "/v1/completions",
            vec![("routing-strategy", "fastest")],
            completion("study", "x", 1, false),
            400,
            "x-error-routing",
            "incorrect routing strategy",
        ),
        (
            "/v1/completions",
            vec![],
            b"{not json".to_vec(),
            400,
            "x-error-request-body-processing",
            "error processing request body",
        ),
        (
            "/v1/chat/completions",
            vec![],
            br#"{"model":"study","messages":[]}"#.to_vec(),
            400,
            "x-error-request-body-processing",
            "no messages",
        ),
        (
            "/v1/chat/completions",
            vec![],
            br#"{"model":"study"}"#.to_vec(),
            400,
            "x-error-request-body-processing",
            "no messages",
        ),
        (
            "/v1/completions",
            vec![],
            completion("study", &"x".repeat(100_000), 1, false),
            413,
            "x-error-request-body-processing",
            "exceeds",
        ),
    ];
    for (path, headers, body, status, marker, text) in cases {
        let r = http(listen, "POST", path, &headers, &body);
        assert_eq!(r.status, status, "{path} {headers:?}: {}", r.text());
        assert!(r.header(marker).is_some(), "no {marker} in {r:?}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let j = r.json();
        assert!(
            j["error"]["message"].as_str().unwrap().contains(text) || j["error"]["code"] == text,
            "{j}"
        );
        assert!(
            r.header("x-kvroute-sim-replica").is_none(),
            "an error reached a replica: {r:?}"
        );
    }

    // A body over the limit without content-length (chunked) is refused in the body phase.
    let r = post_chunked(
        listen,
        "/v1/completions",
        &completion("study", &"x".repeat(100_000), 1, false),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.header("x-error-request-body-processing"), Some("true"));
    assert_eq!(r.json()["error"]["code"], "request_too_large");

    // A model name that is no valid header value (CR LF, NUL, UTF-8, 60 KB) is escaped and
    // cut in the marker header, so the reply keeps every header.
    for model in ["evil\r\nx-injected: 1\u{0}é".to_owned(), "m".repeat(60_000)] {
        let r = http(
            listen,
            "POST",
            "/v1/completions",
            &[("x-request-id", "rid-bad-model")],
            &completion(&model, "x", 1, false),
        );
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.header("request-id"), Some("rid-bad-model"), "{r:?}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let marker = r.header("x-error-no-model-backends").expect("marker");
        assert!(marker.len() <= 256, "{} bytes", marker.len());
        assert!(r.header("x-injected").is_none());
        if model.starts_with("evil") {
            assert_eq!(marker, "evil%0D%0Ax-injected:%201%00%C3%A9");
        }
        assert_eq!(r.json()["error"]["code"], "model_not_found");
    }
}
