//! Property tests of the body extractor: arbitrary bytes and arbitrary JSON shapes never
//! panic, and every outcome is either a value consistent with the input or a typed error.

use kvroute_ext_proc::extract::{extract, Endpoint, ExtractError};
use proptest::prelude::*;
use serde_json::{json, Value};

const ENDPOINTS: [Endpoint; 3] = [
    Endpoint::Completions,
    Endpoint::ChatCompletions,
    Endpoint::Other,
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        for e in ENDPOINTS {
            match extract(e, &bytes) {
                Ok(x) => prop_assert!(serde_json::from_slice::<Value>(&bytes).is_ok(), "accepted non-JSON: {x:?}"),
                Err(ExtractError::Malformed(_) | ExtractError::NoMessages | ExtractError::PromptNotString) => {}
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
                    // The model is the string field, or empty.
                    let model = v.get("model").and_then(Value::as_str).unwrap_or("");
                    prop_assert_eq!(x.model.as_str(), model);
                    if e == Endpoint::Completions {
                        let p = v.get("prompt").and_then(Value::as_str).unwrap_or("");
                        prop_assert_eq!(x.prompt.as_slice(), p.as_bytes());
                    }
                    if e == Endpoint::Other {
                        prop_assert!(x.prompt.is_empty());
                    }
                }
                Err(ExtractError::NoMessages) => prop_assert_eq!(e, Endpoint::ChatCompletions),
                Err(ExtractError::PromptNotString) => prop_assert_eq!(e, Endpoint::Completions),
                Err(ExtractError::Malformed(_)) => {}
                Err(other) => prop_assert!(false, "untyped error {other:?}"),
            }
        }
    }

    #[test]
    fn chat_prompt_is_contents_joined_by_one_space((body, contents) in arb_chat()) {
        let bytes = serde_json::to_vec(&body).unwrap();
        let x = extract(Endpoint::ChatCompletions, &bytes).unwrap();
        let expected: Vec<String> = contents
            .iter()
            .map(|c| match c { Value::String(s) => s.clone(), other => serde_json::to_string(other).unwrap() })
            .collect();
        prop_assert_eq!(String::from_utf8(x.prompt).unwrap(), expected.join(" "));
    }
}
