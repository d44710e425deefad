//! Property tests of the body extractor (`--features json`): arbitrary bytes and arbitrary JSON
//! shapes never panic, and every outcome is either a value consistent with the input or a
//! typed error; string decoding agrees with serde_json's.

use kvroute_core::body::{extract, BodyError, Endpoint};
use proptest::prelude::*;
use serde_json::{json, Value};

const ENDPOINTS: [Endpoint; 4] = [
    Endpoint::Completions,
    Endpoint::ChatCompletions,
    Endpoint::Other,
    Endpoint::ByFields,
];

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("model".to_owned()),
                    Just("prompt".to_owned()),
                    Just("messages".to_owned()),
                    Just("content".to_owned()),
                    Just("stream".to_owned()),
                    "[a-z]{1,6}"
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A chat body whose messages have arbitrary contents.
fn arb_chat() -> impl Strategy<Value = (Value, Vec<Value>)> {
    prop::collection::vec(arb_json(), 1..5).prop_map(|contents| {
        let messages: Vec<Value> = contents
            .iter()
            .map(|c| json!({ "role": "user", "content": c }))
            .collect();
        (json!({ "model": "m", "messages": messages }), contents)
    })
}

/// `s` as a JSON string literal, each char written literally or as `\u` escapes (surrogate
/// pairs beyond the BMP) as `escape` says, quotes, backslashes and controls always escaped.
fn encode(s: &str, escape: &[bool]) -> String {
    let mut out = String::from("\"");
    for (i, c) in s.chars().enumerate() {
        if escape.get(i).copied().unwrap_or(false) || c == '"' || c == '\\' || c < ' ' {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// Text made of escape fragments, valid or not (lone and mismatched surrogates included).
fn arb_escapy() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("\\n".to_owned()),
            Just("\\\"".to_owned()),
            Just("\\/".to_owned()),
            Just("\\u".to_owned()),
            Just("\\".to_owned()),
            Just("d800".to_owned()),
            Just("DBFF".to_owned()),
            Just("dc00".to_owned()),
            Just("\\ud83d".to_owned()),
            Just("\\ude00".to_owned()),
            Just("00e9".to_owned()),
            Just("x".to_owned()),
            Just("é".to_owned()),
        ],
        0..10,
    )
    .prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        for e in ENDPOINTS {
            match extract(e, &bytes) {
                Ok(x) => prop_assert!(serde_json::from_slice::<Value>(&bytes).is_ok(), "accepted non-JSON: {x:?}"),
                Err(BodyError::Malformed(_) | BodyError::NoMessages | BodyError::PromptNotString) => {}
                Err(other) => prop_assert!(false, "untyped error {other:?}"),
            }
        }
    }

    #[test]
    fn arbitrary_json_shapes_give_a_value_or_a_typed_error(v in arb_json()) {
        let bytes = serde_json::to_vec(&v).unwrap();
        for e in ENDPOINTS {
            match extract(e, &bytes) {
                Ok(x) => {
                    // The model is the string field, or absent.
                    let model = v.get("model").and_then(Value::as_str);
                    prop_assert_eq!(x.model.as_deref(), model);
                    let prompt = v.get("prompt").and_then(Value::as_str).unwrap_or("");
                    match e {
                        Endpoint::Completions => prop_assert_eq!(&*x.prompt, prompt),
                        Endpoint::Other => prop_assert!(x.prompt.is_empty()),
                        Endpoint::ByFields if v.get("messages").is_none_or(Value::is_null) => {
                            prop_assert_eq!(&*x.prompt, prompt);
                        }
                        _ => {}
                    }
                }
                Err(BodyError::NoMessages) => prop_assert_eq!(e, Endpoint::ChatCompletions),
                Err(BodyError::PromptNotString) => {
                    prop_assert!(matches!(e, Endpoint::Completions | Endpoint::ByFields));
                }
                Err(BodyError::Malformed(_)) => {}
                Err(other) => prop_assert!(false, "untyped error {other:?}"),
            }
        }
    }

    #[test]
    fn chat_prompt_is_contents_joined_by_one_space((body, contents) in arb_chat()) {
        let bytes = serde_json::to_vec(&body).unwrap();
        let expected: Vec<String> = contents
            .iter()
            .map(|c| match c { Value::String(s) => s.clone(), other => serde_json::to_string(other).unwrap() })
            .collect();
        for e in [Endpoint::ChatCompletions, Endpoint::ByFields] {
            let x = extract(e, &bytes).unwrap();
            prop_assert_eq!(&*x.prompt, expected.join(" "));
        }
    }

    #[test]
    fn escaped_strings_decode_to_their_text(s in "\\PC{0,40}", escape in prop::collection::vec(any::<bool>(), 0..40)) {
        let lit = encode(&s, &escape);
        let body = format!(r#"{{"model":{lit},"prompt":{lit},"messages":[{{"content":{lit}}},{{"content":{lit}}}]}}"#);
        for e in [Endpoint::Completions, Endpoint::ByFields] {
            let x = extract(e, body.as_bytes()).unwrap();
            prop_assert_eq!(x.model.as_deref(), Some(s.as_str()));
            let want = if e == Endpoint::ByFields { format!("{s} {s}") } else { s.clone() };
            prop_assert_eq!(&*x.prompt, want);
        }
    }

    #[test]
    fn decoding_agrees_with_serde_json(inner in arb_escapy()) {
        let body = format!(r#"{{"prompt":"{inner}"}}"#);
        let reference = serde_json::from_str::<Value>(&body);
        match (extract(Endpoint::Completions, body.as_bytes()), reference) {
            (Ok(x), Ok(v)) => prop_assert_eq!(Some(&*x.prompt), v["prompt"].as_str()),
            (Err(BodyError::Malformed(_)), Err(_)) => {}
            (got, want) => prop_assert!(false, "{body}: got {got:?}, serde_json {want:?}"),
        }
    }
}
