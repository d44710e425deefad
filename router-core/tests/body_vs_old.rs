//! Temporary differential test: `kvroute_core::body::extract` against the two extractors it
//! replaces (copies in `benches/old`), on arbitrary JSON shapes, bodies with repeated keys and
//! strings full of (possibly invalid) escapes.
#![cfg(feature = "json")]

#[path = "../benches/old/mod.rs"]
mod old;

use kvroute_core::body::{extract, BodyError, Endpoint};
use proptest::prelude::*;
use serde_json::{json, Value};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "\\PC{0,8}".prop_map(Value::String),
        Just(Value::String("@@".into())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("model".to_owned()),
                    Just("prompt".to_owned()),
                    Just("messages".to_owned()),
                    Just("content".to_owned()),
                    Just("stream".to_owned()),
                    "[a-z]{1,3}"
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_escapy() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("\\n"),
            Just("\\\""),
            Just("\\u"),
            Just("\\"),
            Just("d800"),
            Just("dc00"),
            Just("\\ud83d"),
            Just("\\ude00"),
            Just("00e9"),
            Just("x"),
        ],
        0..6,
    )
    .prop_map(|v| v.concat())
}

/// JSON text: one or two objects' members merged (repeated keys), `@@` replaced by escapes.
fn arb_body() -> impl Strategy<Value = Vec<u8>> {
    (arb_json(), arb_json(), any::<bool>(), arb_escapy()).prop_map(|(a, b, merge, esc)| {
        let (a, b) = (a.to_string(), b.to_string());
        let text =
            if merge && a.starts_with('{') && b.starts_with('{') && a.len() > 2 && b.len() > 2 {
                format!("{},{}", &a[..a.len() - 1], &b[1..])
            } else {
                a
            };
        text.replace("@@", &esc).into_bytes()
    })
}

fn arb_messages_body() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(arb_json(), 0..4),
        arb_escapy(),
        any::<bool>(),
    )
        .prop_map(|(c, esc, wrap)| {
            let messages: Vec<Value> = c
                .into_iter()
                .map(|c| if wrap { json!({ "content": c }) } else { c })
                .collect();
            json!({ "model": "@@", "messages": messages, "prompt": "@@" })
                .to_string()
                .replace("@@", &esc)
                .into_bytes()
        })
}

fn compare(body: &[u8]) -> Result<(), TestCaseError> {
    let text = String::from_utf8_lossy(body);
    for (new_e, old_e) in [
        (Endpoint::Completions, old::ext_proc::Endpoint::Completions),
        (
            Endpoint::ChatCompletions,
            old::ext_proc::Endpoint::ChatCompletions,
        ),
        (Endpoint::Other, old::ext_proc::Endpoint::Other),
    ] {
        let new = extract(new_e, body);
        let old = old::ext_proc::extract(old_e, body);
        match (&new, &old) {
            (Ok(n), Ok(o)) => {
                prop_assert_eq!(
                    n.model.as_deref().unwrap_or(""),
                    o.model.as_str(),
                    "{}",
                    text
                );
                prop_assert_eq!(n.prompt.as_bytes(), o.prompt.as_slice(), "{}", text);
                prop_assert_eq!(n.stream, o.stream, "{}", text);
            }
            (Err(BodyError::NoMessages), Err(old::ext_proc::ExtractError::NoMessages))
            | (
                Err(BodyError::PromptNotString),
                Err(old::ext_proc::ExtractError::PromptNotString),
            )
            | (Err(BodyError::Malformed(_)), Err(old::ext_proc::ExtractError::Malformed(_))) => {}
            _ => prop_assert!(false, "{:?} {}: new {:?} old {:?}", new_e, text, new, old),
        }
    }
    let new = extract(Endpoint::ByFields, body);
    let old = old::ffi::extract(body);
    match (&new, &old) {
        (Ok(n), Ok(o)) => {
            prop_assert_eq!(&n.model, &o.model, "{}", text);
            prop_assert_eq!(&n.prompt, &o.prompt, "{}", text);
        }
        (Err(_), Err(_)) => {}
        _ => prop_assert!(false, "by fields {}: new {:?} old {:?}", text, new, old),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn same_outcomes_as_the_old_extractors(body in arb_body()) {
        compare(&body)?;
    }

    #[test]
    fn same_outcomes_on_message_lists(body in arb_messages_body()) {
        compare(&body)?;
    }

    #[test]
    fn same_outcomes_on_bytes(body in prop::collection::vec(any::<u8>(), 0..64)) {
        compare(&body)?;
    }
}
